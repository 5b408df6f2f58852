// The data loader: a seeded per-epoch order sharded by rank, batches assembled by worker threads into
// (pinned) host memory, copied to the device ahead of use; resumable and self-measuring.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/launch_context.h"
#include "runtime/data/dataset.h"
#include "runtime/data/transform.h"

namespace runner::data {

enum class BadSamplePolicy {
  raise,  // the batch's error reaches the caller, naming the file
  skip,   // the sample is left out of its batch, counted, and reported once per file
};

struct LoaderOptions {
  std::int64_t batch = 1;
  bool shuffle = true;
  bool drop_last = false;
  int workers = -1;   // -1: default_worker_count(); 0: batches are made on the calling thread
  int prefetch = -1;  // batches in flight; -1: 2 per worker (at least 2)
  std::uint64_t seed = 0;
  int rank = core::launch_context().rank;  // this process's shard
  int world_size = core::launch_context().world_size;
  c10::Device device = c10::Device(c10::kCPU);
  bool pin_memory = true;  // for CUDA devices
  TransformSpec transform;
  BadSamplePolicy on_error = BadSamplePolicy::raise;
};

// min(4 per GPU (or 4 without one), CPU cores (RUNNER_CORES, else the host's) - 1), at least 1 when there are 2 or more
// cores. For one of R ranks on the node (LOCAL_WORLD_SIZE): its share of the cores, cores / R, and 4 for its one GPU.
int default_worker_count();

struct Batch {
  at::Tensor data;            // [B, ...]
  at::Tensor label;           // int64 [B], undefined when the dataset has no labels
  at::Tensor index;           // int64 [B], the dataset index of each sample
  std::int64_t position = 0;  // global batch number (0-based, across epochs)
  std::int64_t epoch = 0;     // completed epochs before this batch
};

struct LoaderState {
  std::uint64_t seed = 0;
  std::int64_t position = 0;  // batches consumed (the next batch's global number)
  std::int64_t dataset_size = 0;
  std::int64_t batch = 0;
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
  bool drop_last = false;
};

// As JSON: {"seed", "position", "dataset_size", "batch", "rank", "world_size", "shuffle", "drop_last"}, the
// seed an unsigned 64-bit integer (a decimal string, as older checkpoints hold it, is read too).
nlohmann::json loader_state_json(const LoaderState& state);
// Throws std::invalid_argument naming `where` and the missing or bad field.
LoaderState loader_state_from_json(const nlohmann::json& json, const std::string& where);

struct LoaderStats {
  double wait_seconds = 0;     // time next() spent waiting for a batch
  double elapsed_seconds = 0;  // since the first next()
  std::int64_t batches = 0;
  std::int64_t samples = 0;
  std::int64_t skipped = 0;
  // Batches ready when the last next() was called: the one it took (staged on the device or waiting on the host)
  // and those behind it; `prefetch` when the workers keep ahead of the consumer.
  int queue_depth = 0;
  int workers = 0;
};

// A bad sample that the skip policy left out (reported once per file).
struct SkippedSample {
  std::string path;
  std::string message;
};

class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const Dataset& dataset() const;
  const LoaderOptions& options() const;
  std::int64_t batches_per_epoch() const;
  // Dataset indices of global batch `position` for this rank, in order (before any skipping).
  std::vector<std::int64_t> batch_indices(std::int64_t position) const;

  // The next batch, on the device; blocks until it is ready. Errors of the batch are rethrown here.
  Batch next();
  // Called at the start of next(), before the position moves (a training run's stop request). May throw.
  void set_before_next(std::function<void()> before);
  std::int64_t position() const;
  // Continue from global batch `position` (drops batches in flight).
  void seek(std::int64_t position);
  // Stop prefetching at `end` (exclusive global batch number); -1 for no limit. A next() at or past the end
  // lifts it.
  void set_end(std::int64_t end);

  LoaderState state() const;
  // Throws std::invalid_argument naming the mismatch when the state was saved by a different setup.
  void restore(const LoaderState& state);
  LoaderStats stats() const;  // from any thread
  // The bad samples skipped over the loader's life, one per file, in the order they were met.
  const std::vector<SkippedSample>& skip_reports() const;
  // Those of skip_reports() not taken by an earlier call (for logging each once).
  std::vector<SkippedSample> take_new_skip_reports();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace runner::data
