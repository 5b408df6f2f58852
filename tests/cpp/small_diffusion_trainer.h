// Test fixture: a small class-conditional UNet with its trainer and diffusion objective, and loader batches for it.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/diffusion/diffusion_objective.h"
#include "runtime/nn/unet.h"
#include "runtime/train/trainer.h"

namespace runner::testing {

namespace diff = runner::diffusion;

// A small class-conditional UNet, its trainer (AdamW, clipping, a warmed-up EMA, `accumulate` micro-batches) and
// its diffusion objective; the same seed gives the same weights.
struct SmallDiffusionTrainer {
  nn::UNet unet{nullptr};
  std::shared_ptr<train::Trainer> trainer;
  std::shared_ptr<diff::DiffusionObjective> objective;

  SmallDiffusionTrainer(const c10::Device& device, train::GraphMode graph, std::int64_t accumulate = 2,
                        diff::CaptureCheck capture_check = {}, const std::string& amp = "fp32",
                        train::NonFinitePolicy on_nonfinite = train::NonFinitePolicy::skip) {
    at::manual_seed(3);
    nn::UNetOptions options;
    options.channels = 32;
    options.mults = {1, 2};
    options.blocks = 1;
    options.attention = {4};
    options.image = 8;
    options.groups = 8;
    options.dropout = 0;
    options.classes = 3;
    options.class_dropout = 0.25;
    unet = nn::UNet(options);
    unet->to(device);
    train::TrainerModel model;
    for (const auto& item : unet->named_parameters()) model.parameters.emplace_back(item.key(), item.value());
    for (const auto& item : unet->named_buffers()) model.buffers.emplace_back(item.key(), item.value());
    train::ParamGroup group = train::default_param_group(train::OptimizerKind::adamw);
    group.lr = 1e-3;
    for (const auto& [name, p] : model.parameters) group.params.push_back(p);
    auto optimizer =
        std::make_shared<train::Optimizer>(train::OptimizerKind::adamw, std::vector<train::ParamGroup>{group});
    train::StepOptions step;
    step.amp = amp;
    step.on_nonfinite = on_nonfinite;
    step.clip = 1.0;
    step.accumulate = accumulate;
    step.graph = graph;
    train::LrScheduleOptions schedule;
    schedule.warmup_steps = 4;
    trainer = std::make_shared<train::Trainer>(
        model, optimizer, schedule, std::vector<train::EmaOptions>{{.decay = 0.999, .warmup = true}}, step, device);
    diff::ScheduleOptions noise;
    noise.timesteps = 1000;
    diff::DiffusionTraining training{diff::make_schedule(noise), diff::LossOptions{}, diff::TimestepSampling{},
                                     std::make_shared<diff::SampleStreams>(11)};
    const diff::ModelFunction denoiser = [net = unet](const at::Tensor& x, const at::Tensor& t,
                                                      const std::optional<at::Tensor>& labels) mutable {
      return net->forward(x, t, labels);
    };
    objective = std::make_shared<diff::DiffusionObjective>(training, denoiser, diff::ModelLabels{3, 0.25, 3},
                                                           std::nullopt, std::move(capture_check));
    trainer->set_objective(objective);
  }
};

// Loader batch `n` of `size` images: new images, labels and dataset indices each time.
inline train::StepBatch batch(const c10::Device& device, std::int64_t n, std::int64_t size = 8) {
  at::manual_seed(100 + n);
  train::StepBatch b;
  b.tensors = {{"data", at::randn({size, 3, 8, 8}).to(device)},
               {"index", at::arange(n * size, (n + 1) * size, at::kLong)},
               {"label", at::randint(0, 3, {size}, at::kLong).to(device)}};
  b.epoch = n / 4;
  return b;
}

}  // namespace runner::testing
