// A full diffusion training step driven from C++ without Lua: a UNet, the diffusion objective, AdamW and the
// trainer, against the loss written out from the schedule, the keyed draws and training_loss.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "runtime/diffusion/diffusion_objective.h"
#include "runtime/nn/unet.h"
#include "runtime/train/trainer.h"

namespace {

using namespace runner;
namespace diff = runner::diffusion;

struct DiffusionSetup {
  nn::UNet unet{nullptr};
  std::shared_ptr<train::Trainer> trainer;
  diff::DiffusionTraining training;
  std::shared_ptr<diff::DiffusionObjective> objective;

  explicit DiffusionSetup(std::int64_t accumulate) {
    at::manual_seed(3);
    nn::UNetOptions options;
    options.channels = 8;
    options.mults = {1};
    options.blocks = 1;
    options.attention = {};
    options.image = 8;
    options.groups = 4;
    options.dropout = 0;
    options.classes = 3;
    options.class_dropout = 0.5;
    unet = nn::UNet(options);
    {
      at::NoGradGuard no_grad;  // a fresh UNet's zero output convolution would give every sample the same loss
      for (auto& p : unet->parameters()) p.copy_(at::randn_like(p) * 0.2);
    }
    train::TrainerModel model;
    for (const auto& item : unet->named_parameters()) model.parameters.emplace_back(item.key(), item.value());
    train::ParamGroup group = train::default_param_group(train::OptimizerKind::adamw);
    group.lr = 1e-2;
    for (const auto& [name, p] : model.parameters) group.params.push_back(p);
    auto optimizer =
        std::make_shared<train::Optimizer>(train::OptimizerKind::adamw, std::vector<train::ParamGroup>{group});
    train::StepOptions trainer_options;
    trainer_options.accumulate = accumulate;
    trainer =
        std::make_shared<train::Trainer>(model, optimizer, train::LrScheduleOptions{}, std::vector<train::EmaOptions>{},
                                         trainer_options, c10::Device(c10::kCPU));
    diff::ScheduleOptions schedule;
    schedule.timesteps = 100;
    diff::LossOptions loss;
    loss.min_snr_gamma = 5.0;
    training = {diff::make_schedule(schedule), loss, diff::TimestepSampling{},
                std::make_shared<diff::SampleStreams>(11)};
    const diff::ModelFunction denoiser = [net = unet](const at::Tensor& x, const at::Tensor& t,
                                                      const std::optional<at::Tensor>& labels) mutable {
      return net->forward(x, t, labels);
    };
    objective =
        std::make_shared<diff::DiffusionObjective>(training, denoiser, diff::ModelLabels{3, 0.5, 3}, std::nullopt);
    trainer->set_objective(objective);
  }
};

train::StepBatch loader_batch() {
  at::manual_seed(4);
  train::StepBatch batch;
  batch.tensors = {{"data", at::randn({6, 3, 8, 8})},
                   {"index", at::tensor(std::vector<std::int64_t>{4, 8, 15, 16, 23, 42})},
                   {"label", at::tensor(std::vector<std::int64_t>{0, 1, 2, 2, 1, 0})}};
  batch.epoch = 1;  // the second epoch (Lua's batch.epoch 2)
  return batch;
}

}  // namespace

TEST_CASE("a diffusion step runs from C++: the objective's loss is the keyed loss, and the weights move",
          "[diffusion][objective]") {
  DiffusionSetup setup(1);
  const train::StepBatch batch = loader_batch();
  const at::Tensor& x0 = *batch.find("data");
  const at::Tensor& labels = *batch.find("label");

  // The loss written out: keys of (epoch, index), their timesteps, noise and label dropout, then training_loss.
  const at::Tensor keys = diff::SampleStreams::loader_keys(1, *batch.find("index"));
  const diff::SampleStreams& streams = *setup.training.streams;
  const at::Tensor t = streams.timesteps(keys, 100, at::kCPU);
  const at::Tensor noise = streams.noise(keys, x0.sizes().slice(1), x0.options());
  const at::Tensor dropped = at::where(streams.label_drop(keys, 0.5, at::kCPU), at::full_like(labels, 3), labels);
  CHECK(!at::equal(dropped, labels));  // the dropout is exercised
  const diff::ModelFunction denoiser = [net = setup.unet](const at::Tensor& x, const at::Tensor& tt,
                                                          const std::optional<at::Tensor>& l) mutable {
    return net->forward(x, tt, l);
  };
  at::Tensor expected;
  {
    at::NoGradGuard no_grad;
    expected = diff::training_loss(setup.training.schedule, denoiser, x0, t, noise, dropped, setup.training.loss).loss;
  }

  std::vector<at::Tensor> before;
  for (const auto& p : setup.unet->parameters()) before.push_back(p.detach().clone());
  const train::StepResult result = setup.trainer->step(batch);
  CHECK(at::equal(result.loss, expected));
  CHECK(result.step == 1);
  CHECK(result.skipped.item<std::int64_t>() == 0);
  CHECK(result.grad_norm.item<float>() > 0);
  std::size_t moved = 0, index = 0;
  for (const auto& p : setup.unet->parameters()) moved += at::equal(p, before[index++]) ? 0 : 1;
  CHECK(moved == before.size());
  CHECK(streams.counter() == 0);  // loader keys: the running keys are untouched
  CHECK(setup.objective->describe() ==
        "diffusion loss (eps prediction, uniform timesteps, min-SNR 5, 3 classes, label dropout 0.5)");
}

TEST_CASE("a diffusion step over micro-batches averages their losses, each keyed by its own samples",
          "[diffusion][objective]") {
  DiffusionSetup whole(1), split(3);
  const train::StepBatch batch = loader_batch();
  const at::Tensor loss_whole = whole.trainer->step(batch).loss;
  // Each micro-batch's loss is the mean over its 2 samples of the same per-sample terms: equal to float rounding.
  const at::Tensor loss_split = split.trainer->step(batch).loss;
  CHECK(at::allclose(loss_split, loss_whole, 1e-5, 1e-6));
  REQUIRE_THROWS_WITH(DiffusionSetup(4).trainer->step(batch),
                      "train:step: a batch of 6 does not split into 4 equal micro-batches (accumulate)");

  train::StepBatch unlabelled;
  unlabelled.tensors = {{"data", *batch.find("data")}};
  REQUIRE_THROWS_WITH(whole.trainer->step(unlabelled),
                      "loss: the model is class-conditional (3 classes) but the batch has no labels");
}
