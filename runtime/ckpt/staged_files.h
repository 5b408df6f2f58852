// Checkpoint files that ranks other than 0 write for a checkpoint rank 0 publishes: each staged in
// checkpoints/.staged-<step>-<pid>/ of the process that wrote it (a failed write leaves <name>.failed holding the
// error), then moved into the checkpoint by rank 0 once complete (CheckpointFileContent::staged).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/ckpt/checkpoint_directory.h"

namespace runner::ckpt {

// Writes this process's files of checkpoints on a background thread, one checkpoint at a time: submit() waits for
// the previous one first.
class StagedFileWriter {
 public:
  explicit StagedFileWriter(std::string run_dir);
  ~StagedFileWriter();  // waits for the write in flight
  StagedFileWriter(const StagedFileWriter&) = delete;
  StagedFileWriter& operator=(const StagedFileWriter&) = delete;

  // `wait_ready` runs on the writing thread before the files are written (device copies landing).
  void submit(std::int64_t step, std::vector<CheckpointFileContent> files, std::function<void()> wait_ready);
  void wait();
  // The writes that failed since the last call ("<path>: <cause>"); never blocks.
  std::vector<std::string> take_errors();

 private:
  std::string run_dir_;
  std::thread worker_;
  std::mutex mutex_;
  std::vector<std::string> errors_;
};

// Waits until another process has staged each of `names` for checkpoint `step` of `run_dir` (polling the staging
// folders), up to `timeout`, and returns their paths in the order of `names`. Throws CheckpointWriteError naming
// the file when its writer failed (with the writer's error) or when it is not there in time.
std::vector<std::string> wait_for_staged_files(const std::string& run_dir, std::int64_t step,
                                               const std::vector<std::string>& names,
                                               std::chrono::milliseconds timeout);

}  // namespace runner::ckpt
