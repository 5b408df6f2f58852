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

NamedTensorList as_list(const ckpt::SafetensorsContents& contents) {
  NamedTensorList list;
  for (const auto& t : contents.tensors) list.emplace_back(t.name, t.tensor);
  return list;
}

NamedTensorList state_dict_of(const train::TrainerModel& model) {
  NamedTensorList state_dict = model.parameters;
  state_dict.insert(state_dict.end(), model.buffers.begin(), model.buffers.end());
  return state_dict;
}

nlohmann::json parse_metadata(const ckpt::SafetensorsContents& file, const std::string& key, const std::string& path) {
  auto found = file.metadata.find(key);
  if (found == file.metadata.end())
    throw std::invalid_argument(fmt::format("{}: the '{}' metadata is missing", path, key));
  try {
    return nlohmann::json::parse(found->second);
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument(fmt::format("{}: the '{}' metadata is not JSON: {}", path, key, error.what()));
  }
}

}  // namespace

FullTrainerState full_trainer_state(train::Trainer& trainer) {
  FullTrainerState state;
  state.optimizer = trainer.full_optimizer_state();
  for (std::size_t e = 0; e < trainer.emas().size(); ++e) state.ema_shadows.push_back(trainer.full_ema_shadow(e));
  return state;
}

TrainingSnapshot snapshot_training(const train::Trainer& trainer, const FullTrainerState& full,
                                   const data::Loader* loader, const nlohmann::json& named_state,
                                   const std::vector<train::NamedTensorList>& rank_rng_states) {
  const train::TrainerModel& model = trainer.model();
  std::vector<ckpt::CheckpointFileContent> files;
  files.push_back({"model.safetensors", host_copies(state_dict_of(model)), {{"format", "runner.model"}}});

  const auto& emas = trainer.emas();
  for (std::size_t e = 0; e < emas.size(); ++e) {
    NamedTensorList averaged;
    const auto& shadow = full.ema_shadows.at(e);
    const auto& shadow_buffers = emas[e].shadow_buffers();
    for (std::size_t i = 0; i < shadow.size(); ++i) averaged.emplace_back(model.parameters[i].first, shadow[i]);
    for (std::size_t i = 0; i < shadow_buffers.size(); ++i)
      averaged.emplace_back(model.buffers[i].first, shadow_buffers[i]);
    files.push_back({ema_file_name(e, emas.size()),
                     host_copies(averaged),
                     {{"format", "runner.ema"}, {"decay", fmt::format("{}", emas[e].options().decay)}}});
  }

  files.push_back(
      {"optimizer.safetensors",
       host_copies(full.optimizer),
       {{"format", "runner.optimizer"}, {"hyperparameters", trainer.optimizer().hyperparameters().dump()}}});

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

  TrainingSnapshot snapshot{std::move(files), [] {}};
  if (trainer.device().is_cuda()) {
    auto copied = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
    c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
    copied->record(guard.getStream(trainer.device()));
    snapshot.wait_ready = [copied] { copied->synchronize(); };
  }
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
  const auto model_file = load("model.safetensors");
  const auto trainer_file = load("trainer.safetensors");
  const auto optimizer_file = load("optimizer.safetensors");
  std::vector<ckpt::SafetensorsContents> ema_files;
  for (std::size_t e = 0; e < emas.size(); ++e) ema_files.push_back(load(ema_file_name(e, emas.size())));

  // Everything is checked against this trainer before anything changes.
  const std::string model_path = checkpoint_dir + "/model.safetensors";
  std::vector<ckpt::NamedTensor> model_tensors;
  for (const auto& [name, tensor] : state_dict_of(model)) model_tensors.push_back({name, tensor});
  nn::StateLoadOptions exact;
  exact.same_dtype = true;
  const std::vector<nn::StateCopy> model_copies =
      nn::match_state(model_tensors, model_file.tensors, model_path, "the trainer's model", exact);
  const std::string trainer_path = checkpoint_dir + "/trainer.safetensors";
  const nlohmann::json state = parse_metadata(trainer_file, "trainer", trainer_path);
  if (!state.contains("step") || !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0)
    throw std::invalid_argument(trainer_path + ": the step is missing");
  if (state.value("emas", nlohmann::json::array()).size() != emas.size())
    throw std::invalid_argument(fmt::format("{}: the checkpoint has {} EMA averages, the trainer {}", checkpoint_dir,
                                            state.value("emas", nlohmann::json::array()).size(), emas.size()));
  const nlohmann::json optimizer_hyperparameters =
      parse_metadata(optimizer_file, "hyperparameters", checkpoint_dir + "/optimizer.safetensors");
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
  optimizer.load_state_tensors(trainer.local_optimizer_state(as_list(optimizer_file)));
  for (std::size_t e = 0; e < emas.size(); ++e) {
    NamedTensorList named;
    std::map<std::string, std::string> slot;
    std::map<std::string, std::size_t> parameter;
    for (std::size_t i = 0; i < model.parameters.size(); ++i) {
      slot[model.parameters[i].first] = fmt::format("param{}", i);
      parameter[model.parameters[i].first] = i;
    }
    for (std::size_t i = 0; i < model.buffers.size(); ++i) slot[model.buffers[i].first] = fmt::format("buffer{}", i);
    for (const auto& t : ema_files[e].tensors) {
      auto it = slot.find(t.name);
      if (it == slot.end())
        throw std::invalid_argument(
            fmt::format("{}/{}: '{}' is not in the model", checkpoint_dir, ema_file_name(e, emas.size()), t.name));
      auto p = parameter.find(t.name);
      named.emplace_back(it->second, p == parameter.end() ? t.tensor : trainer.local_ema_weight(p->second, t.tensor));
    }
    emas[e].load_state_tensors(named);
    emas[e].load_hyperparameters(state["emas"][e]);
  }
  {
    at::NoGradGuard no_grad;
    for (const auto& copy : model_copies) const_cast<at::Tensor&>(copy.target).copy_(copy.source);
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
