// The diffusion training loss of a batch and the diffusion objective of the trainer.
#include "runtime/diffusion/diffusion_objective.h"

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
  if (out.labels && out.labels->device() != device) out.labels = out.labels->to(device);
  return out;
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

KeyedLoss keyed_training_loss(const DiffusionTraining& training, const Denoiser& model, const at::Tensor& x0,
                              const TrainingLabels& labels, const at::Tensor& keys) {
  const SampleStreams& streams = *training.streams;
  KeyedLoss out;
  out.t = streams.timesteps(keys, training.schedule.timesteps(), x0.device(), training.timestep_sampling);
  const at::Tensor noise = streams.noise(keys, x0.sizes().slice(1), x0.options());
  std::optional<at::Tensor> model_labels = labels.labels;
  if (model_labels && labels.dropout > 0) {
    const at::Tensor drop = streams.label_drop(keys, labels.dropout, model_labels->device());
    model_labels = at::where(drop, at::full_like(*model_labels, *labels.null_label), *model_labels);
  }
  out.terms = training_loss(training.schedule, model, x0, out.t, noise, model_labels, training.loss);
  return out;
}

KeyedLoss keyed_training_loss(const DiffusionTraining& training, const Denoiser& model, const at::Tensor& x0,
                              const TrainingLabels& labels, const at::Tensor* indices,
                              std::optional<std::int64_t> epoch) {
  if (x0.dim() < 2)
    throw std::invalid_argument(fmt::format("loss: x0 must be a batch [B, C, ...], got {} dimensions", x0.dim()));
  return keyed_training_loss(training, model, x0, labels, training_keys(*training.streams, x0.size(0), indices, epoch));
}

DiffusionObjective::DiffusionObjective(DiffusionTraining training, Denoiser model, ModelLabels labels,
                                       std::optional<double> label_dropout, CaptureCheck capture_check)
    : training_(std::move(training)),
      model_(std::move(model)),
      labels_(labels),
      label_dropout_(label_dropout),
      capture_check_(std::move(capture_check)) {
  if (label_dropout_ && (*label_dropout_ < 0 || *label_dropout_ >= 1))
    throw std::invalid_argument(fmt::format("objective: label_dropout must be in [0, 1), got {}", *label_dropout_));
  require_null_label(labels_.classes > 0, label_dropout_.value_or(labels_.class_dropout), labels_.null_label);
}

at::Tensor DiffusionObjective::loss(const train::Batch& micro) {
  const at::Tensor* x0 = micro.find("data");
  if (x0 == nullptr) throw std::invalid_argument("loss: the batch has no 'data' tensor (the images)");
  if (training_.schedule.betas.device() != x0->device()) training_.schedule = training_.schedule.on(x0->device());
  const at::Tensor* label = micro.find("label");
  const TrainingLabels labels = training_labels(labels_, label ? std::optional<at::Tensor>(*label) : std::nullopt,
                                                std::nullopt, label_dropout_, x0->device());
  if (const at::Tensor* keys = micro.find(kSampleKeys)) {
    if (x0->dim() < 2)
      throw std::invalid_argument(fmt::format("loss: x0 must be a batch [B, C, ...], got {} dimensions", x0->dim()));
    return keyed_training_loss(training_, model_, *x0, labels, *keys).terms.loss;
  }
  return keyed_training_loss(training_, model_, *x0, labels, micro.find("index"), micro.epoch).terms.loss;
}

train::Batch DiffusionObjective::prepare(const train::Batch& batch) {
  const at::Tensor* x0 = batch.find("data");
  if (x0 == nullptr) throw std::invalid_argument("loss: the batch has no 'data' tensor (the images)");
  if (x0->dim() < 2)
    throw std::invalid_argument(fmt::format("loss: x0 must be a batch [B, C, ...], got {} dimensions", x0->dim()));
  if (batch.find(kSampleKeys) != nullptr)
    throw std::invalid_argument(fmt::format(
        "loss: the batch has a tensor named '{}', a name the diffusion objective keeps for itself", kSampleKeys));
  train::Batch prepared = batch;
  prepared.tensors.emplace_back(kSampleKeys,
                                training_keys(*training_.streams, x0->size(0), batch.find("index"), batch.epoch));
  return prepared;
}

std::optional<std::string> DiffusionObjective::capture_blocker() const {
  return capture_check_ ? capture_check_() : std::nullopt;
}

std::string DiffusionObjective::describe() const {
  std::string text =
      fmt::format("diffusion loss ({} prediction, {} timesteps", prediction_name(training_.loss.prediction),
                  timestep_sampling_name(training_.timestep_sampling.kind));
  if (training_.loss.min_snr_gamma) text += fmt::format(", min-SNR {}", *training_.loss.min_snr_gamma);
  if (labels_.classes > 0)
    text +=
        fmt::format(", {} classes, label dropout {}", labels_.classes, label_dropout_.value_or(labels_.class_dropout));
  return text + ")";
}

}  // namespace runner::diffusion
