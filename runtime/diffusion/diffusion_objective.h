// The Gaussian diffusion training loss of a batch: the keyed draws of each sample (timestep, noise, label dropout)
// and training_loss; and the same loss as a trainer objective (train:step(batch)).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/diffusion/gaussian_diffusion.h"
#include "runtime/diffusion/noise_schedule.h"
#include "runtime/diffusion/keyed_objective.h"
#include "runtime/diffusion/sample_streams.h"

namespace runner::diffusion {

// The training side of runner.diffusion.gaussian. The streams are shared with the objectives made from it, so
// that the running keys of batches without dataset indices continue from one to the other.
struct DiffusionTraining {
  NoiseSchedule schedule;
  LossOptions loss;
  TimestepSampling timestep_sampling;
  std::shared_ptr<SampleStreams> streams;
};

struct KeyedLoss {
  LossTerms terms;
  at::Tensor t;  // int64 [B]: the timesteps drawn
};

// Timestep, noise and label dropout of each sample drawn from its key (any device), then training_loss.
KeyedLoss keyed_training_loss(const DiffusionTraining& training, const ModelFunction& model, const at::Tensor& x0,
                              const TrainingLabels& labels, const at::Tensor& keys);
// The same with the keys of training_keys(indices, epoch).
KeyedLoss keyed_training_loss(const DiffusionTraining& training, const ModelFunction& model, const at::Tensor& x0,
                              const TrainingLabels& labels, const at::Tensor* indices,
                              std::optional<std::int64_t> epoch);

// The loss of a denoiser on loader batches as a trainer objective: the same numbers as d:loss(model, batch) with the
// same streams.
class DiffusionObjective : public KeyedObjective {
 public:
  DiffusionObjective(DiffusionTraining training, ModelFunction model, ModelLabels labels,
                     std::optional<double> label_dropout, CaptureCheck capture_check = {});

  std::string describe() const override;

 protected:
  at::Tensor keyed_loss(const at::Tensor& x, const TrainingLabels& labels, const at::Tensor& keys) override;

 private:
  DiffusionTraining training_;
  ModelFunction model_;
};

}  // namespace runner::diffusion
