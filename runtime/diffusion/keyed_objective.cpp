// d:loss's label rules, the keys of the draws and the trainer objective of keyed draws.
#include "runtime/diffusion/keyed_objective.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace runner::diffusion {
namespace {

constexpr const char* kSampleKeys = "sample_keys";

void require_null_label(bool has_labels, double dropout, const std::optional<std::int64_t>& null_label) {
  if (has_labels && dropout > 0 && !null_label)
    throw std::invalid_argument("loss: label_dropout needs a model with a null label (class_dropout > 0)");
}

}  // namespace

TrainingLabels training_labels(const std::optional<ModelLabels>& model, std::optional<at::Tensor> batch_labels,
                               std::optional<at::Tensor> given_labels, std::optional<double> label_dropout,
                               const at::Device& device) {
  TrainingLabels out;
  out.labels = std::move(batch_labels);
  if (given_labels) {
    if (model && model->classes == 0)
      throw std::invalid_argument(
          "loss: labels were given but the model is unconditional (build it with classes = N to condition on them)");
    out.labels = std::move(given_labels);
  }
  if (model && model->classes == 0) out.labels.reset();
  if (model && model->classes > 0 && !out.labels)
    throw std::invalid_argument(
        fmt::format("loss: the model is class-conditional ({} classes) but the batch has no labels", model->classes));
  out.dropout = label_dropout ? *label_dropout : model ? model->class_dropout : 0.0;
  if (model) out.null_label = model->null_label;
  require_null_label(out.labels.has_value(), out.dropout, out.null_label);
  if (!out.labels) out.dropout = 0;
  // Checked before dropout, which would hide an out-of-range label; on the host only (no device synchronisation).
  if (out.labels && model && out.labels->device().is_cpu() && out.labels->numel() > 0 &&
      !at::isFloatingType(out.labels->scalar_type())) {
    const std::int64_t lowest = out.labels->min().item<std::int64_t>();
    const std::int64_t highest = out.labels->max().item<std::int64_t>();
    const std::int64_t limit = model->null_label ? model->classes : model->classes - 1;
    if (lowest < 0 || highest > limit)
      throw std::invalid_argument(fmt::format(
          "loss: labels must be in 0..{} ({} classes{}), got values in {}..{}", limit, model->classes,
          model->null_label ? fmt::format(", {} = no label", *model->null_label) : std::string(), lowest, highest));
  }
  if (out.labels && out.labels->device() != device) out.labels = out.labels->to(device);
  return out;
}

std::optional<std::string> sampling_labels_problem(const ModelLabels& model, bool labels_given,
                                                   std::optional<double> guidance, std::string_view what) {
  if (model.classes == 0 && labels_given)
    return fmt::format(
        "{}: labels were given but the model is unconditional (build it with classes = N to condition on them)", what);
  if (model.classes == 0 && guidance && *guidance != 1)
    return fmt::format("{}: guidance {:g} needs a class-conditional model; this one is unconditional", what, *guidance);
  if (model.classes > 0 && !labels_given)
    return fmt::format("{}: the model is class-conditional ({} classes): give labels", what, model.classes);
  return std::nullopt;
}

at::Tensor training_keys(SampleStreams& streams, std::int64_t size, const at::Tensor* indices,
                         std::optional<std::int64_t> epoch) {
  if (indices == nullptr) return streams.next_keys(size);
  const at::Tensor cpu_indices = indices->to(at::kCPU).to(at::kLong);
  if (cpu_indices.dim() != 1 || cpu_indices.size(0) != size)
    throw std::invalid_argument(
        fmt::format("loss: batch.index must hold {} dataset indices, got {}", size, cpu_indices.numel()));
  return SampleStreams::loader_keys(epoch.value_or(0), cpu_indices);
}

std::optional<at::Tensor> dropped_labels(const SampleStreams& streams, const TrainingLabels& labels,
                                         const at::Tensor& keys) {
  std::optional<at::Tensor> model_labels = labels.labels;
  if (model_labels && labels.dropout > 0) {
    const at::Tensor drop = streams.label_drop(keys, labels.dropout, model_labels->device());
    model_labels = at::where(drop, at::full_like(*model_labels, *labels.null_label), *model_labels);
  }
  return model_labels;
}

KeyedObjective::KeyedObjective(std::shared_ptr<SampleStreams> streams, ModelLabels labels,
                               std::optional<double> label_dropout, CaptureCheck capture_check)
    : streams_(std::move(streams)),
      labels_(labels),
      label_dropout_(label_dropout),
      capture_check_(std::move(capture_check)) {
  if (label_dropout_ && (*label_dropout_ < 0 || *label_dropout_ >= 1))
    throw std::invalid_argument(fmt::format("objective: label_dropout must be in [0, 1), got {}", *label_dropout_));
  require_null_label(labels_.classes > 0, label_dropout_.value_or(labels_.class_dropout), labels_.null_label);
}

at::Tensor KeyedObjective::loss(const train::StepBatch& micro) {
  const at::Tensor* x = micro.find("data");
  if (x == nullptr) throw std::invalid_argument("loss: the batch has no 'data' tensor (the images)");
  const at::Tensor* label = micro.find("label");
  const TrainingLabels labels = training_labels(labels_, label ? std::optional<at::Tensor>(*label) : std::nullopt,
                                                std::nullopt, label_dropout_, x->device());
  if (x->dim() < 2)
    throw std::invalid_argument(fmt::format("loss: x0 must be a batch [B, C, ...], got {} dimensions", x->dim()));
  if (const at::Tensor* keys = micro.find(kSampleKeys)) return keyed_loss(*x, labels, *keys);
  return keyed_loss(*x, labels, training_keys(*streams_, x->size(0), micro.find("index"), micro.epoch));
}

train::StepBatch KeyedObjective::prepare(const train::StepBatch& batch) {
  const at::Tensor* x0 = batch.find("data");
  if (x0 == nullptr) throw std::invalid_argument("loss: the batch has no 'data' tensor (the images)");
  if (x0->dim() < 2)
    throw std::invalid_argument(fmt::format("loss: x0 must be a batch [B, C, ...], got {} dimensions", x0->dim()));
  if (batch.find(kSampleKeys) != nullptr)
    throw std::invalid_argument(
        fmt::format("loss: the batch has a tensor named '{}', a name the objective keeps for itself", kSampleKeys));
  train::StepBatch prepared = batch;
  prepared.tensors.emplace_back(kSampleKeys, training_keys(*streams_, x0->size(0), batch.find("index"), batch.epoch));
  return prepared;
}

std::optional<std::string> KeyedObjective::capture_blocker() const {
  return capture_check_ ? capture_check_() : std::nullopt;
}

std::string KeyedObjective::labels_description() const {
  if (labels_.classes == 0) return "";
  return fmt::format(", {} classes, label dropout {}", labels_.classes, label_dropout_.value_or(labels_.class_dropout));
}

}  // namespace runner::diffusion
