// The files of a training checkpoint: writing them from a trainer and a loader, and restoring from them.
#include "runtime/run/checkpoint_format.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>

#include "runtime/ckpt/safetensors.h"
#include "runtime/ckpt/sharded_checkpoint.h"
#include "runtime/ckpt/staged_files.h"
#include "runtime/core/logging.h"
#include "runtime/nn/state_loading.h"
#include "runtime/train/rng_state.h"

namespace runner::run {
namespace {

using train::NamedTensorList;

// A snapshot copy of one tensor: pinned host memory filled asynchronously for device tensors, a CPU clone
// otherwise.
at::Tensor host_copy(const at::Tensor& tensor) {
  const at::Tensor source = tensor.detach();
  if (source.is_cpu()) return source.clone(at::MemoryFormat::Contiguous);
  at::Tensor copy = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(true));
  copy.copy_(source, /*non_blocking=*/true);
  return copy;
}

std::vector<ckpt::NamedTensor> host_copies(const NamedTensorList& tensors) {
  std::vector<ckpt::NamedTensor> copies;
  copies.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) copies.push_back({name, host_copy(tensor)});
  return copies;
}

std::string ema_file_name(std::size_t index, std::size_t count) {
  return count == 1 || index == 0 ? std::string("ema.safetensors") : fmt::format("ema-{}.safetensors", index + 1);
}

NamedTensorList state_dict_of(const train::TrainerModel& model) {
  NamedTensorList state_dict = model.parameters;
  state_dict.insert(state_dict.end(), model.buffers.begin(), model.buffers.end());
  return state_dict;
}

nlohmann::json parse_metadata(const std::map<std::string, std::string>& metadata, const std::string& key,
                              const std::string& path) {
  auto found = metadata.find(key);
  if (found == metadata.end()) throw std::invalid_argument(fmt::format("{}: the '{}' metadata is missing", path, key));
  try {
    return nlohmann::json::parse(found->second);
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument(fmt::format("{}: the '{}' metadata is not JSON: {}", path, key, error.what()));
  }
}

// One file of the optimizer state or an EMA as a restore reads it: whole, or split over a sharded checkpoint's
// rank files. read(i, rows): tensor i whole, or the rows dist::rows_of would give of it.
struct SavedStateFile {
  std::string path;
  std::map<std::string, std::string> metadata;
  std::vector<std::string> names;
  std::vector<at::Tensor> shapes;  // per tensor: its shape and dtype, on the meta device (no data)
  std::function<at::Tensor(std::size_t, std::optional<dist::RowRange>)> read;
};

SavedStateFile whole_state_file(const std::string& checkpoint_dir, const std::string& name) {
  SavedStateFile file{checkpoint_dir + "/" + name, {}, {}, {}};
  std::shared_ptr<ckpt::SafetensorsContents> contents;
  try {
    contents = std::make_shared<ckpt::SafetensorsContents>(ckpt::load_safetensors(file.path));
  } catch (const std::exception& error) {
    throw std::invalid_argument(error.what());
  }
  file.metadata = contents->metadata;
  for (const auto& t : contents->tensors) {
    file.names.push_back(t.name);
    file.shapes.push_back(at::empty(t.tensor.sizes(), t.tensor.options().device(at::kMeta)));
  }
  file.read = [contents](std::size_t i, std::optional<dist::RowRange> rows) {
    const at::Tensor& tensor = contents->tensors.at(i).tensor;
    return rows ? dist::rows_of(tensor, *rows) : tensor;
  };
  return file;
}

SavedStateFile split_state_file(const ckpt::ShardedCheckpoint& checkpoint, const std::string& name) {
  const ckpt::ShardedFile* split = checkpoint.file(name);
  if (!split)
    throw std::invalid_argument(
        fmt::format("{}/manifest.json: the sharded checkpoint has no {}", checkpoint.directory(), name));
  SavedStateFile file{
      fmt::format("{}/{} (split over {} rank files)", checkpoint.directory(), name, checkpoint.layout().ranks),
      split->metadata,
      {},
      {},
      {}};
  for (const auto& t : split->tensors) {
    file.names.push_back(t.name);
    file.shapes.push_back(at::empty(t.shape, at::TensorOptions().dtype(checkpoint.dtype(*split, t)).device(at::kMeta)));
  }
  file.read = [&checkpoint, split](std::size_t i, std::optional<dist::RowRange> rows) {
    const ckpt::ShardedTensor& tensor = split->tensors.at(i);
    return rows ? checkpoint.read_rows(*split, tensor, rows->begin, rows->end) : checkpoint.read(*split, tensor);
  };
  return file;
}

ckpt::CheckpointFileContent optimizer_file_of(const train::Trainer& trainer, NamedTensorList state) {
  return {"optimizer.safetensors",
          host_copies(state),
          {{"format", "runner.optimizer"}, {"hyperparameters", trainer.optimizer().hyperparameters().dump()}}};
}

ckpt::CheckpointFileContent ema_file_of(const train::Trainer& trainer, std::size_t e) {
  const train::TrainerModel& model = trainer.model();
  const train::Ema& ema = trainer.emas()[e];
  NamedTensorList averaged;
  for (std::size_t i = 0; i < ema.shadow().size(); ++i)
    averaged.emplace_back(model.parameters[i].first, ema.shadow()[i]);
  for (std::size_t i = 0; i < ema.shadow_buffers().size(); ++i)
    averaged.emplace_back(model.buffers[i].first, ema.shadow_buffers()[i]);
  return {ema_file_name(e, trainer.emas().size()),
          host_copies(averaged),
          {{"format", "runner.ema"}, {"decay", fmt::format("{}", ema.options().decay)}}};
}

// The files a sharded trainer splits, as this rank holds them: its rows of the sharded tensors and, per tensor,
// the shard it is split as (nullopt: held whole).
struct SplitFiles {
  std::vector<ckpt::CheckpointFileContent> files;
  std::vector<std::vector<std::optional<std::size_t>>> shard_of;
};

SplitFiles split_files(const train::Trainer& trainer) {
  SplitFiles split;
  if (trainer.shards()->mode() == dist::ShardMode::weights) {  // each rank's rows are the only copy of its weights
    NamedTensorList state = trainer.readable_parameters();
    const std::size_t parameters = state.size();
    state.insert(state.end(), trainer.model().buffers.begin(), trainer.model().buffers.end());
    split.files.push_back({"model.safetensors", host_copies(state), {{"format", "runner.model"}}});
    split.shard_of.emplace_back();
    for (std::size_t i = 0; i < state.size(); ++i)
      split.shard_of.back().push_back(i < parameters ? trainer.weight_shard(i) : std::nullopt);
  }
  split.files.push_back(optimizer_file_of(trainer, trainer.optimizer().state_tensors()));
  split.shard_of.emplace_back();
  for (const auto& t : split.files.back().tensors)
    split.shard_of.back().push_back(trainer.optimizer_state_shard(t.name));
  for (std::size_t e = 0; e < trainer.emas().size(); ++e) {
    split.files.push_back(ema_file_of(trainer, e));
    split.shard_of.emplace_back();
    const std::size_t parameters = trainer.emas()[e].shadow().size();
    for (std::size_t i = 0; i < split.files.back().tensors.size(); ++i)
      split.shard_of.back().push_back(i < parameters ? trainer.ema_shard(i) : std::nullopt);
  }
  return split;
}

// Rank `rank`'s shard file: its rows of the split tensors, and rank 0 the tensors held whole.
ckpt::CheckpointFileContent shard_file_of(const SplitFiles& split, int rank, int ranks) {
  ckpt::CheckpointFileContent shard{ckpt::shard_file_name(rank, ranks), {}, {{"format", "runner.shard"}}};
  for (std::size_t f = 0; f < split.files.size(); ++f)
    for (std::size_t t = 0; t < split.files[f].tensors.size(); ++t)
      if (rank == 0 || split.shard_of[f][t])
        shard.tensors.push_back({ckpt::shard_tensor_name(split.files[f].name, split.files[f].tensors[t].name),
                                 split.files[f].tensors[t].tensor});
  return shard;
}

ckpt::ShardLayout shard_layout_of(const train::Trainer& trainer, const SplitFiles& split) {
  const dist::ParameterShards& shards = *trainer.shards();
  ckpt::ShardLayout layout;
  layout.ranks = shards.ranks();
  for (std::size_t f = 0; f < split.files.size(); ++f) {
    ckpt::ShardedFile file{split.files[f].name, split.files[f].metadata, {}};
    for (std::size_t t = 0; t < split.files[f].tensors.size(); ++t) {
      const auto& k = split.shard_of[f][t];
      ckpt::ShardedTensor tensor{split.files[f].tensors[t].name, {}, {}};
      if (k) {
        tensor.shape = shards.shape(*k).vec();
        const std::int64_t rows = tensor.shape.empty() ? 1 : tensor.shape.front();
        for (int r = 0; r < layout.ranks; ++r) {
          const dist::RowRange range = dist::shard_rows(rows, r, layout.ranks);
          tensor.rows.push_back({range.begin, range.end});
        }
      } else {
        tensor.shape = split.files[f].tensors[t].tensor.sizes().vec();
        tensor.rows.push_back({0, tensor.shape.empty() ? 1 : tensor.shape.front()});
      }
      file.tensors.push_back(std::move(tensor));
    }
    layout.files.push_back(std::move(file));
  }
  return layout;
}

std::function<void()> wait_for_copies(const train::Trainer& trainer) {
  if (!trainer.device().is_cuda()) return [] {};
  auto copied = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
  c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  copied->record(guard.getStream(trainer.device()));
  return [copied] { copied->synchronize(); };
}

}  // namespace

TrainingSnapshot snapshot_training(const train::Trainer& trainer, const data::Loader* loader,
                                   const nlohmann::json& named_state,
                                   const std::vector<train::NamedTensorList>& rank_rng_states,
                                   const std::string& run_dir, std::int64_t step) {
  const train::TrainerModel& model = trainer.model();
  const auto& emas = trainer.emas();
  TrainingSnapshot snapshot;
  std::vector<ckpt::CheckpointFileContent>& files = snapshot.files;
  const dist::ParameterShards* shards = trainer.shards();
  if (!shards || shards->mode() != dist::ShardMode::weights)
    files.push_back({"model.safetensors", host_copies(state_dict_of(model)), {{"format", "runner.model"}}});

  if (shards) {
    const SplitFiles split = split_files(trainer);
    snapshot.manifest_extra["shards"] = ckpt::shard_layout_json(shard_layout_of(trainer, split));
    files.push_back(shard_file_of(split, 0, shards->ranks()));
    const auto timeout = shards->process_group().timeout();
    for (int r = 1; r < shards->ranks(); ++r) {
      ckpt::CheckpointFileContent staged{ckpt::shard_file_name(r, shards->ranks()), {}, {}};
      staged.staged = [run_dir, step, name = staged.name, timeout] {
        return ckpt::wait_for_staged_files(run_dir, step, {name}, timeout).front();
      };
      files.push_back(std::move(staged));
    }
  } else {
    for (std::size_t e = 0; e < emas.size(); ++e) files.push_back(ema_file_of(trainer, e));
    files.push_back(optimizer_file_of(trainer, trainer.optimizer().state_tensors()));
  }

  NamedTensorList trainer_tensors = rank_rng_states.empty() ? train::capture_rng_states() : rank_rng_states.front();
  for (std::size_t r = 1; r < rank_rng_states.size(); ++r)
    for (const auto& [name, state] : rank_rng_states[r])
      trainer_tensors.emplace_back(fmt::format("rank{}.{}", r, name), state);
  if (const train::LossScaler* scaler = trainer.loss_scaler())
    for (const auto& [name, tensor] : scaler->state_tensors()) trainer_tensors.emplace_back("scaler." + name, tensor);
  trainer_tensors.emplace_back("skipped", trainer.skipped());
  nlohmann::json extra = {{"state", named_state.is_object() ? named_state : nlohmann::json::object()}};
  if (loader) extra["loader"] = data::loader_state_json(loader->state());
  nlohmann::json state = {
      {"step", trainer.step_count()},
      {"micro_step", 0},
      {"precision", train::precision_name(trainer.precision())},
      {"accumulate", trainer.step_options().accumulate},
      {"world_size", std::max<std::size_t>(1, rank_rng_states.size())},
      {"shard", dist::shard_mode_name(trainer.shards() ? trainer.shards()->mode() : dist::ShardMode::none)},
      {"schedule", trainer.schedule().state()},
      {"emas", nlohmann::json::array()},
      {"extra", extra}};
  for (const train::Ema& ema : emas) state["emas"].push_back(ema.hyperparameters());
  files.push_back(
      {"trainer.safetensors", host_copies(trainer_tensors), {{"format", "runner.trainer"}, {"trainer", state.dump()}}});
  snapshot.wait_ready = wait_for_copies(trainer);
  return snapshot;
}

TrainingSnapshot snapshot_rank_shard(const train::Trainer& trainer) {
  const dist::ParameterShards& shards = *trainer.shards();
  TrainingSnapshot snapshot;
  snapshot.files.push_back(shard_file_of(split_files(trainer), shards.rank(), shards.ranks()));
  snapshot.wait_ready = wait_for_copies(trainer);
  return snapshot;
}

RestoredTraining restore_training(const std::string& checkpoint_dir, train::Trainer& trainer, int rank,
                                  int world_size) {
  auto load = [&](const std::string& name) {
    try {
      return ckpt::load_safetensors(checkpoint_dir + "/" + name);
    } catch (const std::exception& error) {
      throw std::invalid_argument(error.what());
    }
  };
  const train::TrainerModel& model = trainer.model();
  auto& emas = trainer.emas();
  const auto trainer_file = load("trainer.safetensors");
  std::optional<ckpt::ShardedCheckpoint> sharded;
  try {
    sharded = ckpt::ShardedCheckpoint::open(checkpoint_dir);
  } catch (const std::exception& error) {
    throw std::invalid_argument(error.what());
  }
  auto state_file = [&](const std::string& name) {
    return sharded ? split_state_file(*sharded, name) : whole_state_file(checkpoint_dir, name);
  };
  const SavedStateFile optimizer_file = state_file("optimizer.safetensors");
  // Sharded over the weights, each rank's file holds its rows of the model too.
  const SavedStateFile model_file = sharded && sharded->file("model.safetensors")
                                        ? split_state_file(*sharded, "model.safetensors")
                                        : whole_state_file(checkpoint_dir, "model.safetensors");

  // Everything is checked against this trainer before anything changes.
  const NamedTensorList model_state = state_dict_of(model);
  std::vector<ckpt::NamedTensor> model_tensors, stored_shapes;
  for (const auto& [name, tensor] : model_state) model_tensors.push_back({name, tensor});
  for (std::size_t t = 0; t < model_file.names.size(); ++t)
    stored_shapes.push_back({model_file.names[t], model_file.shapes[t]});
  nn::StateLoadOptions exact;
  exact.same_dtype = true;
  const std::vector<nn::StateCopy> model_copies =
      nn::match_state(model_tensors, stored_shapes, model_file.path, "the trainer's model", exact);
  const std::string trainer_path = checkpoint_dir + "/trainer.safetensors";
  const nlohmann::json state = parse_metadata(trainer_file.metadata, "trainer", trainer_path);
  if (!state.contains("step") || !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0)
    throw std::invalid_argument(trainer_path + ": the step is missing");
  if (state.value("emas", nlohmann::json::array()).size() != emas.size())
    throw std::invalid_argument(fmt::format("{}: the checkpoint has {} EMA averages, the trainer {}", checkpoint_dir,
                                            state.value("emas", nlohmann::json::array()).size(), emas.size()));
  const nlohmann::json optimizer_hyperparameters =
      parse_metadata(optimizer_file.metadata, "hyperparameters", optimizer_file.path);
  std::vector<SavedStateFile> ema_files;
  for (std::size_t e = 0; e < emas.size(); ++e) ema_files.push_back(state_file(ema_file_name(e, emas.size())));
  NamedTensorList rng, scaler;
  at::Tensor skipped;
  const std::string rng_prefix = rank == 0 ? "rng." : fmt::format("rank{}.rng.", rank);
  const std::string rank_prefix = rank == 0 ? "" : fmt::format("rank{}.", rank);
  for (const auto& t : trainer_file.tensors) {
    if (t.name.rfind(rng_prefix, 0) == 0)
      rng.emplace_back(t.name.substr(rank_prefix.size()), t.tensor);
    else if (t.name.rfind("scaler.", 0) == 0)
      scaler.emplace_back(t.name.substr(7), t.tensor);
    else if (t.name == "skipped")
      skipped = t.tensor;
  }
  const nlohmann::json extra = state.value("extra", nlohmann::json::object());
  RestoredTraining restored;
  restored.step = state["step"].get<int64_t>();
  if (extra.contains("loader")) restored.loader = data::loader_state_from_json(extra["loader"], trainer_path);
  if (extra.contains("state") && extra["state"].is_object()) restored.named_state = extra["state"];

  // Optimizer and EMA loads validate before they change anything; the model's tensors were checked above.
  train::Optimizer& optimizer = trainer.optimizer();
  optimizer.load_hyperparameters(optimizer_hyperparameters);
  NamedTensorList optimizer_state;
  for (std::size_t i = 0; i < optimizer_file.names.size(); ++i) {
    const auto k = trainer.optimizer_state_shard(optimizer_file.names[i]);
    optimizer_state.emplace_back(optimizer_file.names[i],
                                 optimizer_file.read(i, k ? std::optional(trainer.shards()->rows(*k)) : std::nullopt));
  }
  optimizer.load_state_tensors(optimizer_state);
  for (std::size_t e = 0; e < emas.size(); ++e) {
    NamedTensorList named;
    std::map<std::string, std::string> slot;
    std::map<std::string, std::size_t> parameter;
    for (std::size_t i = 0; i < model.parameters.size(); ++i) {
      slot[model.parameters[i].first] = fmt::format("param{}", i);
      parameter[model.parameters[i].first] = i;
    }
    for (std::size_t i = 0; i < model.buffers.size(); ++i) slot[model.buffers[i].first] = fmt::format("buffer{}", i);
    for (std::size_t t = 0; t < ema_files[e].names.size(); ++t) {
      const std::string& name = ema_files[e].names[t];
      auto it = slot.find(name);
      if (it == slot.end())
        throw std::invalid_argument(fmt::format("{}: '{}' is not in the model", ema_files[e].path, name));
      auto p = parameter.find(name);
      const auto k = p == parameter.end() ? std::nullopt : trainer.ema_shard(p->second);
      named.emplace_back(it->second,
                         ema_files[e].read(t, k ? std::optional(trainer.shards()->rows(*k)) : std::nullopt));
    }
    emas[e].load_state_tensors(named);
    emas[e].load_hyperparameters(state["emas"][e]);
  }
  {
    at::NoGradGuard no_grad;
    std::map<const void*, std::size_t> stored_index, model_index;
    for (std::size_t t = 0; t < stored_shapes.size(); ++t)
      stored_index[stored_shapes[t].tensor.unsafeGetTensorImpl()] = t;
    for (std::size_t i = 0; i < model_state.size(); ++i) model_index[model_state[i].second.unsafeGetTensorImpl()] = i;
    for (const auto& copy : model_copies) {
      const std::size_t t = stored_index.at(copy.source.unsafeGetTensorImpl());
      const std::size_t i = model_index.at(copy.target.unsafeGetTensorImpl());
      const auto k = i < model.parameters.size() ? trainer.weight_shard(i) : std::nullopt;
      if (k)
        const_cast<at::Tensor&>(trainer.shards()->local().at(*k)).copy_(model_file.read(t, trainer.shards()->rows(*k)));
      if (!k || !trainer.shards()->released_between_uses(*k))
        const_cast<at::Tensor&>(copy.target).copy_(model_file.read(t, std::nullopt));
    }
    if (trainer.shards()) trainer.shards()->round_whole_weights();
  }
  if (train::LossScaler* loss_scaler = trainer.loss_scaler(); loss_scaler && !scaler.empty())
    loss_scaler->load_state_tensors(scaler);
  trainer.schedule().load_state(state.value("schedule", nlohmann::json::object()));
  // Rank 0's streams are always there; another rank's when the checkpoint's job had that rank.
  if (rank == 0 || !rng.empty()) train::restore_rng_states(rng);
  const int saved_world_size = state.value("world_size", 1);
  if (saved_world_size != world_size && rank == 0)
    core::log(core::LogLevel::warn,
              fmt::format("{}: saved by {} rank{}, continuing with {}: the sample order and the keyed noise streams "
                          "continue exactly, but each rank's default random generator (dropout, torch.rand* in the "
                          "script) cannot continue as it would have{}",
                          checkpoint_dir, saved_world_size, saved_world_size == 1 ? "" : "s", world_size,
                          world_size > saved_world_size
                              ? fmt::format(" (ranks {} and up start from their seed)", saved_world_size)
                              : ""));
  const std::string shard = dist::shard_mode_name(trainer.shards() ? trainer.shards()->mode() : dist::ShardMode::none);
  const std::string saved_shard = state.value("shard", std::string("none"));
  if ((saved_shard != shard || (saved_world_size != world_size && shard != "none")) && rank == 0)
    core::log(core::LogLevel::info,
              fmt::format("{}: saved with shard {} by {} rank{}, continuing with shard {} on {}: each rank takes its "
                          "rows of the saved optimizer state and EMA",
                          checkpoint_dir, saved_shard, saved_world_size, saved_world_size == 1 ? "" : "s", shard,
                          world_size));
  trainer.restore_counters(restored.step, skipped);
  const std::string precision = train::precision_name(trainer.precision());
  if (state.value("accumulate", trainer.step_options().accumulate) != trainer.step_options().accumulate ||
      state.value("precision", precision) != precision)
    core::log(
        core::LogLevel::warn,
        fmt::format("{}: saved with accumulate={} and {}, continuing with accumulate={} and {}: the run no longer "
                    "repeats an uninterrupted one exactly",
                    checkpoint_dir, state.value("accumulate", 0), state.value("precision", std::string("?")),
                    trainer.step_options().accumulate, precision));
  return restored;
}

}  // namespace runner::run
