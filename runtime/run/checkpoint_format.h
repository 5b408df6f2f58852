// The files of a training checkpoint, and restoring a trainer and a loader from them:
//   model.safetensors      parameters and buffers under their state-dict names
//   ema.safetensors        the first average (float32) under the model's names; ema-<k>.safetensors for the k-th
//   optimizer.safetensors  the optimizer's state tensors; metadata "hyperparameters" (JSON)
//   trainer.safetensors    loss scale, skip count, every RNG stream ("rng.*"; rank r > 0 of a data-parallel job
//                          "rank<r>.rng.*"); metadata "trainer" (JSON): step, precision, accumulate, world size,
//                          schedule and EMA counters, and "extra": {"loader": loader state, "state": the
//                          script's named state objects}
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
};

// The optimizer state and EMA shadows a checkpoint saves, as unsharded training holds them
// (Trainer::full_optimizer_state, full_ema_shadow): under sharded data parallel a collective, which every rank runs
// before rank 0 takes the snapshot.
struct FullTrainerState {
  train::NamedTensorList optimizer;
  std::vector<std::vector<at::Tensor>> ema_shadows;
};
FullTrainerState full_trainer_state(train::Trainer& trainer);

// `state`: full_trainer_state(trainer). `loader` may be null; `named_state` is a JSON object (name -> state) or null.
// `rank_rng_states`: in a data-parallel job, every rank's capture_rng_states() in rank order; empty: this process's.
TrainingSnapshot snapshot_training(const train::Trainer& trainer, const FullTrainerState& state,
                                   const data::Loader* loader, const nlohmann::json& named_state,
                                   const std::vector<train::NamedTensorList>& rank_rng_states = {});

struct RestoredTraining {
  std::int64_t step = 0;
  std::optional<data::LoaderState> loader;  // the saved loader state, when one was saved
  nlohmann::json named_state = nlohmann::json::object();
};

// Reads the files of `checkpoint_dir`, checks everything against the trainer (a different model, optimizer
// or number of EMAs is std::invalid_argument naming the file and what differs) and only then restores the
// trainer: weights, EMAs, optimizer state and hyperparameters (a sharded trainer takes its rows of them, whatever the
// world size or sharding that saved them), loss scale, counters, schedule and every RNG
// stream. The loader is left to the caller (it needs the same setup; data::Loader::restore checks that).
// Rank `rank` of `world_size` restores its own RNG streams; at another world size than the checkpoint's, a
// rank without saved streams keeps its own, and a warning says that they cannot continue exactly.
RestoredTraining restore_training(const std::string& checkpoint_dir, train::Trainer& trainer, int rank = 0,
                                  int world_size = 1);

}  // namespace runner::run
