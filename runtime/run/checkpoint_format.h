// The files of a training checkpoint, and restoring a trainer and a loader from them:
//   model.safetensors      parameters and buffers under their state-dict names
//   ema.safetensors        the first average (float32) under the model's names; ema-<k>.safetensors for the k-th
//   optimizer.safetensors  the optimizer's state tensors; metadata "hyperparameters" (JSON)
//   trainer.safetensors    loss scale, skip count, every RNG stream ("rng.*"; rank r > 0 of a data-parallel job
//                          "rank<r>.rng.*"); metadata "trainer" (JSON): step, precision, accumulate, world size,
//                          schedule and EMA counters, and "extra": {"loader": loader state, "state": the
//                          script's named state objects}
// Under sharded data parallel, optimizer.safetensors and the EMA files are split by rows over the ranks instead:
//   shard-<r>-of-<N>.safetensors  rank r's rows ("optimizer/<name>", "ema/<name>"), with the layout in the manifest
// checkpoint_directory.h writes them (partial directory, hashes, manifest, rename).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/data/loader.h"
#include "runtime/train/trainer.h"

namespace runner::run {

// A checkpoint's files copied off the training tensors: a CUDA tensor goes to pinned host memory
// asynchronously, and wait_ready() blocks until every copy has landed.
struct TrainingSnapshot {
  std::vector<ckpt::CheckpointFileContent> files;
  std::function<void()> wait_ready;
  nlohmann::json manifest_extra = nlohmann::json::object();  // a sharded checkpoint's layout: {"shards": ...}
};

// `loader` may be null; `named_state` is a JSON object (name -> state) or null.
// `rank_rng_states`: in a data-parallel job, every rank's capture_rng_states() in rank order; empty: this process's.
// Sharded data parallel (trainer.shards()) saves the optimizer state and the EMAs split (ckpt/sharded_checkpoint.h):
// this is rank 0's snapshot, with its own shard file and the other ranks' (snapshot_rank_shard) as staged files of
// `run_dir`'s checkpoint `step`, waited for up to the process group's timeout.
TrainingSnapshot snapshot_training(const train::Trainer& trainer, const data::Loader* loader,
                                   const nlohmann::json& named_state,
                                   const std::vector<train::NamedTensorList>& rank_rng_states = {},
                                   const std::string& run_dir = "", std::int64_t step = 0);
// Under sharded data parallel, the shard file of a rank other than 0: its rows of the optimizer state and EMAs.
TrainingSnapshot snapshot_rank_shard(const train::Trainer& trainer);

struct RestoredTraining {
  std::int64_t step = 0;
  std::optional<data::LoaderState> loader;  // the saved loader state, when one was saved
  nlohmann::json named_state = nlohmann::json::object();
};

// Reads the files of `checkpoint_dir`, checks everything against the trainer (a different model, optimizer
// or number of EMAs is std::invalid_argument naming the file and what differs) and only then restores the
// trainer: weights, EMAs, optimizer state and hyperparameters (a sharded trainer takes its rows of them, whatever the
// world size or sharding that saved them), loss scale, counters, schedule and every RNG
// stream. A sharded checkpoint's rows are read from the rank files that hold them (a missing one is named). The
// loader is left to the caller (it needs the same setup; data::Loader::restore checks that).
// Rank `rank` of `world_size` restores its own RNG streams; at another world size than the checkpoint's, a
// rank without saved streams keeps its own, and a warning says that they cannot continue exactly.
RestoredTraining restore_training(const std::string& checkpoint_dir, train::Trainer& trainer, int rank = 0,
                                  int world_size = 1);

}  // namespace runner::run
