// Failure reports of the ranks: JSON, publishing to the job's store and the launcher's file, and the job's first
// failure.
#include "runtime/dist/failure_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>
#include <thread>

#include "runtime/core/atomic_file.h"
#include "runtime/core/json_text.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/logging.h"
#include "runtime/dist/process_group.h"

namespace runner::dist {
namespace {

std::string report_key(int rank) { return fmt::format("runner/failure/{}", rank); }

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// "train.lua:9" of "train.lua:9: all_reduce failed: ..."; empty when the message names no place.
std::string place_of(const std::string& message) {
  static const std::regex place(R"(^([^\s:][^:\n]*:\d+): )");
  std::smatch match;
  const std::string line = first_line(message);
  return std::regex_search(line, match, place) ? match[1].str() : std::string();
}

std::string rank_list(const std::vector<int>& ranks, int world_size) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return text + fmt::format(" of {}", world_size);
}

void write_failure_file(const std::string& path, const std::string& text) {
  core::AtomicFileWriter writer(path);
  writer.write(text.data(), text.size(), "the failure report");
  writer.commit();
}

// The other ranks' reports in the store; waits up to `patience` while none explains `own` and some rank is silent.
std::vector<FailureReport> other_ranks_reports(ProcessGroup& group, const FailureReport& own,
                                               std::chrono::milliseconds patience) {
  const auto give_up = std::chrono::steady_clock::now() + patience;
  std::vector<std::optional<FailureReport>> found(static_cast<size_t>(group.size()));
  for (;;) {
    std::vector<FailureReport> reports;
    for (int r = 0; r < group.size(); ++r) {
      if (r == own.rank) continue;
      if (!found[static_cast<size_t>(r)])
        if (auto text = group.note(report_key(r))) found[static_cast<size_t>(r)] = parse_failure_report(*text);
      if (found[static_cast<size_t>(r)]) reports.push_back(*found[static_cast<size_t>(r)]);
    }
    const bool everyone = static_cast<int>(reports.size()) == group.size() - 1;
    if (!own.consequential || first_failure(reports) || everyone || std::chrono::steady_clock::now() >= give_up)
      return reports;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

std::string failure_report_json(const FailureReport& report) {
  return core::json_text(nlohmann::json{{"rank", report.rank},
                                        {"message", report.message},
                                        {"time", report.time},
                                        {"consequential", report.consequential},
                                        {"collective", report.collective},
                                        {"timed_out", report.timed_out},
                                        {"timeout_seconds", report.timeout_seconds}});
}

std::optional<FailureReport> parse_failure_report(const std::string& text) {
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    FailureReport report;
    report.rank = json.at("rank").get<int>();
    report.message = json.at("message").get<std::string>();
    report.time = json.at("time").get<double>();
    report.consequential = json.at("consequential").get<bool>();
    report.collective = json.at("collective").get<std::string>();
    report.timed_out = json.at("timed_out").get<bool>();
    report.timeout_seconds = json.at("timeout_seconds").get<double>();
    return report;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

FailureReport failure_report_of(const std::string& message) {
  FailureReport report;
  report.rank = core::launch_context().rank;
  report.message = message;
  report.time = seconds_since_epoch();
  if (const auto collective = first_collective_failure()) {
    report.consequential = true;
    report.collective = collective->collective;
    report.timed_out = collective->timed_out;
    report.time = collective->time;
  }
  if (const ProcessGroup* group = process_group())
    report.timeout_seconds = std::chrono::duration<double>(group->timeout()).count();
  return report;
}

const FailureReport* first_timeout(const std::vector<FailureReport>& reports) {
  const FailureReport* first = nullptr;
  for (const FailureReport& report : reports)
    if (report.timed_out && (!first || report.time < first->time)) first = &report;
  return first;
}

const FailureReport* first_failure(const std::vector<FailureReport>& reports) {
  const FailureReport* first = nullptr;
  for (const FailureReport& report : reports)
    if (!report.consequential && (!first || report.time < first->time)) first = &report;
  const FailureReport* timed_out = first_timeout(reports);
  return first && timed_out && timed_out->time < first->time ? nullptr : first;
}

std::vector<int> ranks_absent_at(const FailureReport& timed_out, const std::vector<FailureReport>& reports,
                                 int world_size) {
  std::vector<int> absent;
  for (int r = 0; r < world_size; ++r) {
    if (r == timed_out.rank) continue;
    const auto report =
        std::find_if(reports.begin(), reports.end(), [&](const FailureReport& x) { return x.rank == r; });
    if (report == reports.end() || report->time > timed_out.time) absent.push_back(r);
  }
  return absent;
}

std::string job_failure(const FailureReport& own, const std::vector<FailureReport>& others, int world_size) {
  std::vector<FailureReport> reports = others;
  reports.push_back(own);
  std::sort(reports.begin(), reports.end(),
            [](const FailureReport& a, const FailureReport& b) { return a.rank < b.rank; });
  std::string cause;
  int cause_rank = -1;
  if (const FailureReport* first = first_failure(reports)) {
    if (first->rank == own.rank) return own.message;
    cause = fmt::format("rank {} of {} failed first: {}", first->rank, world_size, first->message);
    cause_rank = first->rank;
  } else if (const FailureReport* timed_out = first_timeout(reports)) {
    const std::vector<int> absent = ranks_absent_at(*timed_out, reports, world_size);
    if (absent.empty()) return own.message;
    const std::string place = place_of(timed_out->message);
    cause = fmt::format("{} did not take part in {} for {:g} s (hung or stopped): rank {} timed out waiting{}",
                        rank_list(absent, world_size), timed_out->collective, timed_out->timeout_seconds,
                        timed_out->rank, place.empty() ? "" : " at " + place);
  } else {
    std::vector<int> silent;
    for (int r = 0; r < world_size; ++r)
      if (std::none_of(reports.begin(), reports.end(), [&](const FailureReport& x) { return x.rank == r; }))
        silent.push_back(r);
    if (silent.empty()) return own.message;
    cause =
        fmt::format("{} ended without a failure report (killed by a signal or crashed)", rank_list(silent, world_size));
  }
  for (const FailureReport& report : reports)
    if (report.rank != cause_rank)
      cause += fmt::format("\nrank {}, {}: {}", report.rank, report.consequential ? "as a consequence" : "afterwards",
                           first_line(report.message));
  return cause;
}

std::string report_rank_failure(const std::string& message, std::chrono::milliseconds patience) {
  const core::LaunchContext& context = core::launch_context();
  const FailureReport own = failure_report_of(message);
  const std::string json = failure_report_json(own);
  if (!context.failure_file.empty()) {
    try {
      write_failure_file(context.failure_file, json);
    } catch (const std::exception& error) {
      core::log(core::LogLevel::warn, fmt::format("the launcher will not see this rank's failure: {}", error.what()));
    }
  }
  ProcessGroup* group = process_group();
  if (!group || group->size() < 2) return message;
  try {
    group->set_note(report_key(own.rank), json);
  } catch (const std::exception& error) {
    core::log(core::LogLevel::warn, fmt::format("rank 0 will not see this rank's failure: {}", error.what()));
    return message;
  }
  if (own.rank != 0) return message;
  try {
    return job_failure(own, other_ranks_reports(*group, own, patience), group->size());
  } catch (const std::exception& error) {
    core::log(core::LogLevel::warn, fmt::format("the other ranks' failures are unknown: {}", error.what()));
    return message;
  }
}

std::optional<std::string> failure_behind_interruption(const std::string& how) {
  ProcessGroup* group = process_group();
  if (!group || group->size() < 2 || group->rank() != 0) return std::nullopt;
  try {
    FailureReport own = failure_report_of(how);
    own.consequential = true;
    const std::vector<FailureReport> others = other_ranks_reports(*group, own, std::chrono::milliseconds(0));
    if (!first_failure(others)) return std::nullopt;
    return job_failure(own, others, group->size());
  } catch (const std::exception& error) {
    core::log(core::LogLevel::warn, fmt::format("the other ranks' failures are unknown: {}", error.what()));
    return std::nullopt;
  }
}

}  // namespace runner::dist
