// What the objectives of both families share: the labels a model takes and d:loss's label rules, the keys of each
// sample's draws, the label dropout drawn from them, and the trainer objective of keyed draws.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/diffusion/sample_streams.h"
#include "runtime/train/objective.h"

namespace runner::diffusion {

// What a model takes as labels, as its info() says.
struct ModelLabels {
  std::int64_t classes = 0;  // 0: unconditional
  double class_dropout = 0;  // the default label dropout in training
  std::optional<std::int64_t> null_label;
};

// The labels a training batch gives the model and their dropout.
struct TrainingLabels {
  std::optional<at::Tensor> labels;  // on the device of the images
  double dropout = 0;
  std::optional<std::int64_t> null_label;
};

// d:loss's rules. `model` is unset for a model whose labels are unknown (a plain function): the labels are used
// as given. An unconditional model ignores a batch's labels (a labelled dataset trains it too) but refuses
// `given_labels`; a class-conditional one needs labels; `label_dropout` defaults to the model's class_dropout and
// needs its null label. Throws std::invalid_argument with the message a script sees ("loss: ...").
TrainingLabels training_labels(const std::optional<ModelLabels>& model, std::optional<at::Tensor> batch_labels,
                               std::optional<at::Tensor> given_labels, std::optional<double> label_dropout,
                               const at::Device& device);

// The label rules of sampling (`what` "sample") and of the likelihood ("likelihood") for a model whose labels are
// known: an unconditional model takes no labels and no guidance scale other than 1, a class-conditional one needs
// labels. The message a script sees ("sample: ..."), or nullopt when the call keeps them.
std::optional<std::string> sampling_labels_problem(const ModelLabels& model, bool labels_given,
                                                   std::optional<double> guidance, std::string_view what);

// The keys of the draws of `size` samples, int64 [size] on the CPU: (epoch, dataset index) when `indices` is given
// (epoch 0-based as data::Batch counts; unset: 0), else the streams' next running keys. Throws
// std::invalid_argument when `indices` does not hold `size` of them.
at::Tensor training_keys(SampleStreams& streams, std::int64_t size, const at::Tensor* indices,
                         std::optional<std::int64_t> epoch);

// The labels the model sees: each sample's label replaced by the null label where its keyed label-dropout draw says.
std::optional<at::Tensor> dropped_labels(const SampleStreams& streams, const TrainingLabels& labels,
                                         const at::Tensor& keys);

// Why a model cannot be captured in a CUDA graph now (e.g. its activation checkpointing), or nullopt.
using CaptureCheck = std::function<std::optional<std::string>()>;

// What the trainer's objectives of keyed draws share (the diffusion objective of diffusion_objective.h, the flow
// objective of flow.h): loader batches ({data, label, index} and the epoch), d:loss's label rules, and the keys.
// prepare() adds the batch's keys as the int64 tensor "sample_keys" [B] (a batch that has one already is refused);
// loss() of a micro-batch with them draws from them and reads nothing on the host, so it can be captured unless
// `capture_check` says otherwise.
class KeyedObjective : public train::Objective {
 public:
  KeyedObjective(std::shared_ptr<SampleStreams> streams, ModelLabels labels, std::optional<double> label_dropout,
                 CaptureCheck capture_check);

  at::Tensor loss(const train::StepBatch& micro) final;
  train::StepBatch prepare(const train::StepBatch& batch) final;
  std::optional<std::string> capture_blocker() const final;

 protected:
  // The loss of images x [B, C, ...] with their labels and the keys of their draws.
  virtual at::Tensor keyed_loss(const at::Tensor& x, const TrainingLabels& labels, const at::Tensor& keys) = 0;
  // ", N classes, label dropout p" for a class-conditional model, else "".
  std::string labels_description() const;

 private:
  std::shared_ptr<SampleStreams> streams_;
  ModelLabels labels_;
  std::optional<double> label_dropout_;
  CaptureCheck capture_check_;
};

}  // namespace runner::diffusion
