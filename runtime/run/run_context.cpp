// A run from its start to its final status: index row, run directory, log file, metric writer.
#include "runtime/run/run_context.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "runtime/core/atomic_file.h"
#include "runtime/core/byte_size_text.h"
#include "runtime/core/json_text.h"
#include "runtime/core/device.h"
#include "runtime/core/logging.h"
#include "runtime/core/utf8_text.h"
#include "runtime/index/final_status.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_removal.h"
#include "runtime/run/tensor_histogram.h"

namespace runner::run {

using namespace runner::index;
namespace {

void write_text_file(const std::string& path, const std::string& text) {
  core::AtomicFileWriter writer(path);
  writer.write(text.data(), text.size(), "text");
  writer.commit();
}

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void check_artifact_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 100 && name[0] != '.';
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
  if (!ok)
    throw std::invalid_argument(
        fmt::format("image name '{}' is not allowed: use 1 to 100 letters, digits, '_', '-' "
                    "and '.', not starting with '.'",
                    name));
}

// What an attempt runs differently from the one before it, e.g. "the config: steps 6 -> 8; the world size: 1 -> 2";
// empty when nothing changed.
std::string attempt_changes(const RunRecord& before, const RunRecord& now) {
  std::vector<std::string> config;
  if (before.config.is_object() && now.config.is_object()) {
    std::set<std::string> keys;
    for (const auto& [key, value] : before.config.items()) keys.insert(key);
    for (const auto& [key, value] : now.config.items()) keys.insert(key);
    for (const std::string& key : keys) {
      const auto value = [&](const nlohmann::json& of) {
        return of.contains(key) ? core::json_text(of[key]) : std::string("-");
      };
      if (value(before.config) != value(now.config))
        config.push_back(fmt::format("{} {} -> {}", key, value(before.config), value(now.config)));
    }
  } else if (before.config != now.config) {
    config.push_back(fmt::format("{} -> {}", core::json_text(before.config), core::json_text(now.config)));
  }
  std::vector<std::string> parts;
  if (!config.empty()) parts.push_back(fmt::format("the config: {}", fmt::join(config, ", ")));
  if (before.world_size != now.world_size)
    parts.push_back(fmt::format("the world size: {} -> {}", before.world_size, now.world_size));
  if (before.hosts != now.hosts)
    parts.push_back(fmt::format("the hosts: {} -> {}", fmt::join(before.hosts, ", "), fmt::join(now.hosts, ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace

RunContext::RunContext(const RunStart& start) : RunContext(start, open_index_for_writing(start.index)) {}

RunContext::RunContext(const RunStart& start, Database db)
    : index_(start.index), db_(std::move(db)), fork_(start.fork), pause_(start.pause) {
  reap_stale_runs(db_, now_seconds(), index_.home);
  resumed_ = start.resume.has_value();
  std::optional<RunRecord> before;
  if (resumed_) before = load_run(db_, *start.resume);
  record_ = resumed_ ? reopen_run(db_, *start.resume, start.run) : create_run(db_, start.run, index_.home);
  held_attempt_.emplace(db_, RunFence{record_.run, record_.name, record_.attempts});
  directory_ = index_.home + "/" + record_.dir;
  seed_ = start.run.seed.value_or(record_.seed.value_or(0));
  try {
    if (::mkdir(directory_.c_str(), 0777) != 0 && !(resumed_ && errno == EEXIST))
      throw IndexError(fmt::format("{}: cannot create the run directory: {}", directory_, std::strerror(errno)));
    if (resumed_) previous_script_ = read_text_file(directory_ + "/script.lua");
    write_text_file(directory_ + "/script.lua", start.script_text);
    write_text_file(directory_ + "/config.json", core::json_text(record_.config, 2) + "\n");
    reserve_final_status(directory_);
    core::attach_log_file(directory_ + "/log.txt");
    core::log_to_file(
        core::LogLevel::info,
        fmt::format("attempt {} of run {} ({}): config {}, world size {}, hosts {}", record_.attempts, record_.name,
                    record_.id, core::json_text(record_.config), record_.world_size, fmt::join(record_.hosts, ", ")));
    if (before) {
      const std::string changes = attempt_changes(*before, record_);
      if (!changes.empty())
        core::log(core::LogLevel::info,
                  fmt::format("attempt {} of run {} changes {}", record_.attempts, record_.name, changes));
    }
    writer_ = std::make_unique<MetricWriter>(index_, record_.run, start.writer);
    if (start.system_metrics_seconds > 0)
      system_metrics_ = std::make_unique<SystemMetrics>(
          *writer_, [this] { return step(); },
          SystemMetricsOptions{start.system_metrics_seconds, core::parse_device(record_.device),
                               static_cast<int>(record_.world_size)});
  } catch (const std::exception& error) {
    finish_run(db_, record_.run, "failed", std::string("the run could not start: ") + error.what());
    core::detach_log_file();
    finished_ = true;
    throw;
  }
}

RunContext::RunContext(const index::IndexLocation& index, int64_t run, std::optional<int64_t> fork)
    : index_(index), db_(open_index_for_reading(index)), follower_(true) {
  record_ = load_run(db_, run);
  directory_ = index_.home + "/" + record_.dir;
  seed_ = record_.seed.value_or(0);
  resumed_ = record_.attempts > 1;
  if (fork) fork_ = load_run(db_, *fork);
}

RunContext::~RunContext() {
  try {
    finish("interrupted", "the run was not finished (the process ended early)");
  } catch (const std::exception& error) {
    core::log(core::LogLevel::error, std::string("run ") + record_.name + ": " + error.what());
  }
}

void RunContext::log_metric(std::string_view key, int64_t step, double value, double time) {
  if (follower_) return;
  writer_->log(key, step, value, time);
  note_pause(key, step);
}

void RunContext::log_histogram(const std::string& key, int64_t step, const at::Tensor& values, double time) {
  if (follower_) return;
  core::require_utf8(key, "histogram key");
  const TensorHistogram histogram = tensor_histogram(values);
  recorded_ = true;
  index::add_histogram(db_, record_.run,
                       {key, step, time, histogram.low, histogram.high, histogram.counts, histogram.nonfinite});
}

void RunContext::log_metric(std::string_view key, int64_t step, const at::Tensor& value, double time) {
  if (follower_) return;
  writer_->log(key, step, value, time);
  note_pause(key, step);
}

void RunContext::note_pause(std::string_view key, int64_t step) {
  if (pause_ && key == pause_->metric && step >= pause_->step) pause_due_ = true;
}

void RunContext::set_step(int64_t step) {
  step_ = step;
  if (writer_) writer_->set_step(step);
}

void RunContext::continue_from(int64_t step) {
  set_step(step);
  attempt_start_step_ = step;
  if (!follower_) set_attempt_start(db_, record_.run, step);
}

void RunContext::merge_summary(const nlohmann::json& values) {
  if (follower_) return;
  recorded_ = true;
  index::merge_summary(db_, record_.run, values);
}

void RunContext::add_tags(const std::vector<std::string>& tags) {
  if (follower_) return;
  index::add_run_tags(db_, record_.run, tags);
  record_.tags = index::load_run(db_, record_.run).tags;
}

void RunContext::set_note(const std::string& note) {
  if (follower_) return;
  index::set_run_note(db_, record_.run, note);
  record_.note = note.empty() ? std::nullopt : std::optional<std::string>(note);
}

void RunContext::record_intervention(const std::string& chunk, const std::vector<std::string>& changes) {
  if (follower_) return;
  recorded_ = true;
  const int64_t at = step();
  // The record keeps a long chunk's start and its size: it goes into the log and every look at the run.
  constexpr std::size_t kChunkKept = 4096;
  std::string text = chunk;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.size() > kChunkKept)
    text = fmt::format("{}\n... (cut: {} in all)", core::utf8_prefix(text, kChunkKept),
                       core::byte_size_text(chunk.size()));
  std::string indented;
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    indented += "\n  " + text.substr(start, end - start);
    start = end + 1;
  }
  core::log(core::LogLevel::info,
            fmt::format("runner attach after step {} changed {}:{}", at, fmt::join(changes, ", "), indented));
  index::add_intervention(db_, record_.run, {at, index::now_seconds(), text, changes});
}

std::string RunContext::save_images(const std::string& name, int64_t step, const at::Tensor& images,
                                    const image::GridOptions& options) {
  check_artifact_name(name);
  const std::string folder = directory_ + "/images";
  if (::mkdir(folder.c_str(), 0777) != 0 && errno != EEXIST)
    throw IndexError(fmt::format("{}: cannot create the directory: {}", folder, std::strerror(errno)));
  const std::string relative = fmt::format("images/{}-{:07d}.png", name, step);
  const std::string path = directory_ + "/" + relative;
  if (follower_) return path;
  recorded_ = true;
  check_write_access(db_);  // nothing into the run folder of a run resumed elsewhere
  image::save_grid(path, images, options);
  struct stat info {};
  ::stat(path.c_str(), &info);
  add_artifact(db_, {0, record_.run, step, "image", name, relative, static_cast<int64_t>(info.st_size), 0});
  return path;
}

void RunContext::record_input(const std::string& kind, const std::string& path, const nlohmann::json& detail) {
  if (follower_) return;
  std::error_code error;
  std::filesystem::path resolved = std::filesystem::weakly_canonical(std::filesystem::absolute(path, error), error);
  if (error) resolved = std::filesystem::absolute(path);
  index::InputRecord input;
  input.attempt = record_.attempts;
  input.kind = kind;
  input.path = resolved.string();
  input.detail = detail;
  struct stat info {};
  if (::stat(input.path.c_str(), &info) == 0) {
    if (S_ISREG(info.st_mode)) input.bytes = static_cast<int64_t>(info.st_size);
    input.modified_at = static_cast<double>(info.st_mtim.tv_sec) + static_cast<double>(info.st_mtim.tv_nsec) * 1e-9;
  }
  add_input(db_, record_.run, input);
}

void RunContext::record_file(const std::string& name, int64_t step, const std::string& relative) {
  check_artifact_name(name);
  if (follower_) return;
  recorded_ = true;
  const std::string path = directory_ + "/" + relative;
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw IndexError(fmt::format("{}: cannot record the artifact: {}", path, std::strerror(errno)));
  add_artifact(db_, {0, record_.run, step, "file", name, relative, static_cast<int64_t>(info.st_size), 0});
}

void RunContext::finish(const std::string& status, const std::optional<std::string>& error) {
  if (finished_) return;
  finished_ = true;
  if (follower_) return;
  std::string final_status = status;
  std::optional<std::string> final_error = error;
  std::string lost;  // what could not be recorded
  if (system_metrics_) system_metrics_->stop();
  try {
    writer_->close();
  } catch (const std::exception& failure) {
    lost = failure.what();
    if (status == "finished") final_status = "failed";
    final_error = (error ? *error + "; " : std::string()) + lost;
  }
  core::log(core::LogLevel::info, fmt::format("run {} ({}) {}", record_.name, record_.id, final_status));
  core::detach_log_file();
  // A full disk may clear: the status is retried as the metric writer retries its last commit, then written
  // into the file reserved for it, from which the next start of a run or `runner gc` records it.
  constexpr int kAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    try {
      finish_run(db_, record_.run, final_status, final_error);
      record_ = load_run(db_, record_.run);
      break;
    } catch (const std::exception& failure) {
      if (attempt < kAttempts) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500 * attempt));
        continue;
      }
      std::string fallback;
      try {
        write_final_status(directory_, {final_status, final_error, now_seconds()});
        fallback = fmt::format("; it is in {}/{}, and the next run started or `runner gc` records it", directory_,
                               kFinalStatusFile);
      } catch (const std::exception& also) {
        fallback = fmt::format("; nor could it be written beside the index: {}", also.what());
      }
      lost += fmt::format("{}the run's final status ({}) could not be recorded: {}{}", lost.empty() ? "" : "; ",
                          final_status, failure.what(), fallback);
      break;
    }
  }
  held_attempt_.reset();
  if (!lost.empty()) throw index::IndexError(lost);
}

std::optional<std::string> RunContext::withdraw() {
  if (finished_ || follower_ || recorded_ || step_ != attempt_start_step_) return std::nullopt;
  // The system metrics are not the script's records: an attempt that logged only them is taken back too.
  if (system_metrics_) system_metrics_->stop();
  if (writer_->values_logged() != (system_metrics_ ? system_metrics_->values_logged() : 0)) return std::nullopt;
  const std::string name = fmt::format("{} ({})", record_.name, record_.id);
  const std::string why = "stopped on a usage error before its first step";
  try {
    writer_->close();
    // The fence is checked once more, then let go: taking the attempt back changes what it compares (or deletes the
    // run), and a retry of that after a lost answer would take this process for one whose run was resumed elsewhere.
    check_write_access(db_);
    held_attempt_.reset();
    if (!resumed_) {
      core::detach_log_file();
      remove_run(db_, index_.home, record_);
      release_run_name(db_, record_.name);
      finished_ = true;
      return fmt::format("run {} is not kept: it {}", name, why);
    }
    core::log_to_file(core::LogLevel::info, fmt::format("attempt {} is taken back: it {}", record_.attempts, why));
    core::detach_log_file();
    record_ = drop_latest_attempt(db_, record_.run, record_.attempts);
    finished_ = true;
    write_text_file(directory_ + "/config.json", core::json_text(record_.config, 2) + "\n");
    if (previous_script_) write_text_file(directory_ + "/script.lua", *previous_script_);
    return fmt::format("run {} is left as it was: the attempt {}", name, why);
  } catch (const std::exception& error) {
    if (finished_)
      return fmt::format("run {} is left as it was in the index, but its files are not: {}", name, error.what());
    core::log(core::LogLevel::warn,
              fmt::format("run {}: the attempt that {} could not be taken back: {}", name, why, error.what()));
    held_attempt_.emplace(db_, RunFence{record_.run, record_.name, record_.attempts});  // the run stays open
    return std::nullopt;
  }
}

}  // namespace runner::run
