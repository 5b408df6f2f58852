// The Gaussian diffusion training loss of a batch and the diffusion objective of the trainer.
#include "runtime/diffusion/diffusion_objective.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace runner::diffusion {

KeyedLoss keyed_training_loss(const DiffusionTraining& training, const ModelFunction& model, const at::Tensor& x0,
                              const TrainingLabels& labels, const at::Tensor& keys) {
  const SampleStreams& streams = *training.streams;
  KeyedLoss out;
  out.t = streams.timesteps(keys, training.schedule.timesteps(), x0.device(), training.timestep_sampling);
  const at::Tensor noise = streams.noise(keys, x0.sizes().slice(1), x0.options());
  out.terms =
      training_loss(training.schedule, model, x0, out.t, noise, dropped_labels(streams, labels, keys), training.loss);
  return out;
}

KeyedLoss keyed_training_loss(const DiffusionTraining& training, const ModelFunction& model, const at::Tensor& x0,
                              const TrainingLabels& labels, const at::Tensor* indices,
                              std::optional<std::int64_t> epoch) {
  if (x0.dim() < 2)
    throw std::invalid_argument(fmt::format("loss: x0 must be a batch [B, C, ...], got {} dimensions", x0.dim()));
  return keyed_training_loss(training, model, x0, labels, training_keys(*training.streams, x0.size(0), indices, epoch));
}

DiffusionObjective::DiffusionObjective(DiffusionTraining training, ModelFunction model, ModelLabels labels,
                                       std::optional<double> label_dropout, CaptureCheck capture_check)
    : KeyedObjective(training.streams, labels, label_dropout, std::move(capture_check)),
      training_(std::move(training)),
      model_(std::move(model)) {}

at::Tensor DiffusionObjective::keyed_loss(const at::Tensor& x, const TrainingLabels& labels, const at::Tensor& keys) {
  if (training_.schedule.betas.device() != x.device()) training_.schedule = training_.schedule.on(x.device());
  return keyed_training_loss(training_, model_, x, labels, keys).terms.loss;
}

std::string DiffusionObjective::describe() const {
  std::string text =
      fmt::format("diffusion loss ({} prediction, {} timesteps", prediction_name(training_.loss.prediction),
                  timestep_sampling_name(training_.timestep_sampling.kind));
  if (training_.loss.min_snr_gamma) text += fmt::format(", min-SNR {}", *training_.loss.min_snr_gamma);
  return text + labels_description() + ")";
}

}  // namespace runner::diffusion
