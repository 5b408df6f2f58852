// The graph-or-eager decision of a trainer's step and the graphs kept per batch signature.
#include "runtime/train/step_graph_policy.h"

#include <fmt/format.h>

#include <stdexcept>

#include "runtime/core/enum_table.h"
#include "runtime/core/logging.h"
#include "runtime/core/shape_text.h"

namespace runner::train {
namespace {

constexpr const char* kLossFunctionBlocker =
    "the loss is a function called at every step, which a CUDA graph cannot capture";

}  // namespace

const core::EnumTable<GraphMode, 3> kGraphModes{
    {{{GraphMode::on, "true"}, {GraphMode::off, "false"}, {GraphMode::automatic, "auto"}}},
    core::NameQuotes::none,
    "runner.trainer: 'graph' must be true, false or \"auto\", got \"{got}\""};

GraphMode parse_graph_mode(const std::string& name) { return kGraphModes.parse(name); }

StepGraphPolicy::StepGraphPolicy(GraphMode mode, c10::Device device, std::optional<std::string> device_blocker)
    : mode_(mode), device_(device) {
  if (mode_ == GraphMode::off) return;
  if (device_blocker) {
    if (mode_ == GraphMode::on)
      throw std::invalid_argument(fmt::format("runner.trainer: graph = true, but {}", *device_blocker));
    note_eager(*device_blocker);
    return;
  }
  recorder_ = std::make_unique<CudaGraphRecorder>(device);
}

StepGraphPolicy::~StepGraphPolicy() = default;

StepGraphPolicy::Decision StepGraphPolicy::decide(const Objective* objective, const std::string& signature,
                                                  bool stream_capturing) {
  if (mode_ == GraphMode::off || stream_capturing) return {};
  // The objective's own blocker first: it holds on any device (and a device without graphs is said at construction).
  std::optional<std::string> blocker;
  if (objective == nullptr)
    blocker = kLossFunctionBlocker;
  else if (!(blocker = objective->capture_blocker()) && !recorder_)
    blocker = status_.eager_reason.value_or("CUDA graphs are off");
  if (blocker) {
    if (mode_ == GraphMode::on) {
      throw std::invalid_argument(
          objective == nullptr
              ? fmt::format("runner.trainer: graph = true, but {}: give the trainer an objective (e.g. "
                            "ddpm:objective(model)), or use graph = \"auto\" to run such steps eagerly",
                            *blocker)
              : fmt::format("runner.trainer: graph = true, but {} (graph = \"auto\" runs such steps eagerly)",
                            *blocker));
    }
    note_eager(*blocker);
    return {};
  }
  auto found = by_signature_.find(signature);
  if (found == by_signature_.end()) {
    if (by_signature_.size() >= kMaxGraphs) {
      note_eager(fmt::format("more than {} batch shapes: steps of the shapes beyond them run eagerly", kMaxGraphs));
      return {};
    }
    found = by_signature_.emplace(signature, Graph{}).first;
    found->second.id = next_id_++;
  }
  Graph& graph = found->second;
  if (graph.recorded) return {Run::replay, &graph};
  if (graph.warmups < kWarmupSteps) {
    ++graph.warmups;
    return {Run::warmup, &graph};
  }
  return {Run::capture, &graph};
}

void StepGraphPolicy::forget(const Graph& graph) {
  for (auto it = by_signature_.begin(); it != by_signature_.end(); ++it)
    if (&it->second == &graph) {
      by_signature_.erase(it);
      return;
    }
}

void StepGraphPolicy::clear() {
  if (recorder_) recorder_->clear();
  by_signature_.clear();
}

void StepGraphPolicy::note_eager(const std::string& reason) {
  if (status_.eager_reason == reason) return;
  status_.eager_reason = reason;
  core::log(device_.is_cuda() ? core::LogLevel::info : core::LogLevel::debug,
            fmt::format("CUDA graphs: steps run eagerly: {}", reason));
}

std::string batch_signature(const StepBatch& batch) {
  std::string text;
  for (const auto& [name, tensor] : batch.tensors)
    text += fmt::format("{} {} {}; ", name, c10::toString(tensor.scalar_type()), core::shape_text(tensor.sizes()));
  return text;
}

}  // namespace runner::train
