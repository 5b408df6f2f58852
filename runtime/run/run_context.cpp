// A run from its start to its final status: index row, run directory, log file, metric writer.
#include "runtime/run/run_context.h"

#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <fmt/format.h>
#include <thread>

#include "runtime/core/atomic_file.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/logging.h"
#include "runtime/index/final_status.h"
#include "runtime/index/index_database.h"

namespace runner::run {

using namespace runner::index;
namespace {

void write_text_file(const std::string& path, const std::string& text) {
  core::AtomicFileWriter writer(path);
  writer.write(text.data(), text.size(), "text");
  writer.commit();
}

void check_artifact_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 100 && name[0] != '.';
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
  if (!ok)
    throw std::invalid_argument(fmt::format("image name '{}' is not allowed: use 1 to 100 letters, digits, '_', '-' "
                                            "and '.', not starting with '.'",
                                            name));
}

}  // namespace

RunContext::RunContext(const RunStart& start) : RunContext(start, open_index_for_writing(start.home)) {}

RunContext::RunContext(const RunStart& start, Database db) : home_(start.home), db_(std::move(db)), fork_(start.fork) {
  reap_stale_runs(db_, now_seconds(), home_);
  resumed_ = start.resume.has_value();
  record_ = resumed_ ? reopen_run(db_, *start.resume, start.run) : create_run(db_, start.run, home_);
  directory_ = home_ + "/" + record_.dir;
  seed_ = start.run.seed.value_or(record_.seed.value_or(0));
  try {
    if (::mkdir(directory_.c_str(), 0777) != 0 && !(resumed_ && errno == EEXIST))
      throw IndexError(fmt::format("{}: cannot create the run directory: {}", directory_, std::strerror(errno)));
    write_text_file(directory_ + "/script.lua", start.script_text);
    write_text_file(directory_ + "/config.json", record_.config.dump(2) + "\n");
    reserve_final_status(directory_);
    core::attach_log_file(directory_ + "/log.txt");
    writer_ = std::make_unique<MetricWriter>(home_, record_.run, start.writer);
  } catch (const std::exception& error) {
    finish_run(db_, record_.run, "failed", std::string("the run could not start: ") + error.what());
    core::detach_log_file();
    finished_ = true;
    throw;
  }
}

RunContext::RunContext(const std::string& home, int64_t run, std::optional<int64_t> fork)
    : home_(home), db_(open_index_for_reading(home)), follower_(true) {
  record_ = load_run(db_, run);
  directory_ = home_ + "/" + record_.dir;
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

void RunContext::log_metric(std::string_view key, int64_t step, const at::Tensor& value, double time) {
  if (follower_) return;
  writer_->log(key, step, value, time);
  note_pause(key, step);
}

void RunContext::note_pause(std::string_view key, int64_t step) {
  const auto& pause = core::launch_context().sweep_pause;
  if (pause && key == pause->metric && step >= pause->step) pause_due_ = true;
}

void RunContext::set_step(int64_t step) {
  step_ = step;
  if (writer_) writer_->set_step(step);
}

void RunContext::merge_summary(const nlohmann::json& values) {
  if (!follower_) index::merge_summary(db_, record_.run, values);
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
  image::save_grid(path, images, options);
  struct stat info {};
  ::stat(path.c_str(), &info);
  add_artifact(db_, {0, record_.run, step, "image", name, relative, static_cast<int64_t>(info.st_size), 0});
  return path;
}

void RunContext::record_file(const std::string& name, int64_t step, const std::string& relative) {
  check_artifact_name(name);
  if (follower_) return;
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
  if (!lost.empty()) throw index::IndexError(lost);
}

}  // namespace runner::run
