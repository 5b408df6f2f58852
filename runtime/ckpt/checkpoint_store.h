// A run's checkpoints over time: saving on a background thread (write, verify, index row, rotation) and
// choosing the newest good checkpoint to restore, skipping damaged ones.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/ckpt/checkpoint_rotation.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_store.h"
#include "runtime/index/database.h"
#include "runtime/index/index_database.h"

namespace runner::ckpt {

struct SaveRequest {
  int64_t step = 0;
  std::vector<CheckpointFileContent> files;  // host tensors (see wait_ready)
  std::function<void()> wait_ready;          // called on the saving thread before the files are written
  // Called on the saving thread once the files verify, before the index row that makes the checkpoint the
  // restore point (the run's metrics up to the checkpoint are committed first). A throw fails the save.
  std::function<void()> before_record;
  nlohmann::json manifest_extra = nlohmann::json::object();
  std::optional<std::string> metric;  // the metric rotation's keep_best ranks by, and its value
  std::optional<double> metric_value;
};

struct SaveReport {
  int64_t step = 0;
  std::string path;  // relative to the run directory
  int64_t bytes = 0;
  double write_seconds = 0;          // on the saving thread: write, fsync, verify, index row, rotation
  std::optional<std::string> error;  // set when the save failed; nothing of it is left behind
  std::vector<std::string> dropped;  // checkpoints rotation deleted
  // Checkpoints rotation dropped from the index but could not delete ("path: reason"); `runner gc` deletes
  // them later. The save itself succeeded.
  std::vector<std::string> undeleted;
};

// One save at a time: submit() waits for the previous one first. Each save writes the directory
// (checkpoint_directory.h), reads every file back against its hash, records the checkpoint and its files
// in the index (replacing a row of the same step), and only then drops what rotation drops: first its row
// (kept = 0), then its files, so the index never lists a checkpoint whose files are gone.
class CheckpointSaver {
 public:
  CheckpointSaver(index::IndexLocation index, int64_t run, std::string run_dir, RotationPolicy rotation);
  ~CheckpointSaver();  // waits for the save in flight
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  void submit(SaveRequest request);
  // Waits for the save in flight, if any.
  void wait();
  // The reports of saves finished since the last call (never blocks).
  std::vector<SaveReport> take_reports();
  bool busy();

  const RotationPolicy& rotation() const { return rotation_; }

 private:
  SaveReport save(SaveRequest& request);

  index::IndexLocation index_;
  int64_t run_;
  std::string run_dir_;
  RotationPolicy rotation_;
  std::thread worker_;
  std::mutex mutex_;
  bool running_ = false;
  std::vector<SaveReport> reports_;
};

struct RestoreChoice {
  std::optional<index::CheckpointRecord> checkpoint;  // the newest kept checkpoint whose files verify
  std::string directory;                              // its absolute directory
  std::vector<std::string> rejected;                  // "checkpoints/step-0000300: model.safetensors: ..." per bad one
  std::vector<int64_t> steps;                         // of every kept checkpoint, oldest first
};

// Looks through the run's kept checkpoints, newest first, verifying each file's size and sha256 against the
// index, and stops at the first good one; with `step`, looks at that step's only.
RestoreChoice choose_checkpoint(index::Database& db, int64_t run, const std::string& run_dir,
                                std::optional<int64_t> step = std::nullopt);

// choose_checkpoint for a reader of the run `run_name`: the chosen checkpoint, or std::invalid_argument saying
// that the run has none, none of `step` (listing the steps it has) or that it is damaged (naming the files).
RestoreChoice require_checkpoint(index::Database& db, int64_t run, const std::string& run_name,
                                 const std::string& run_dir, std::optional<int64_t> step);

}  // namespace runner::ckpt
