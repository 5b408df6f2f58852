// On a CUDA device: a whole diffusion training step captured in a throwaway CUDA graph, so that anything in
// the step that waits for the device or reads a value back fails loudly.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "runtime/diffusion/diffusion_objective.h"
#include "runtime/nn/unet.h"
#include "runtime/train/trainer.h"
#include "tests/cpp/cuda_graph_capture.h"
#include "tests/cpp/cuda_skip.h"

#if RUNNER_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

using namespace runner;
namespace diff = runner::diffusion;

}  // namespace

TEST_CASE("a diffusion step on CUDA captures in a CUDA graph: nothing in it waits for the device", "[train][cuda]") {
  SKIP_WITHOUT_CUDA("capturing a training step in a CUDA graph");
#if RUNNER_WITH_CUDA
  const c10::Device cuda(c10::kCUDA, 0);
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
  nn::UNet unet(options);
  unet->to(cuda);
  train::TrainerModel model;
  for (const auto& item : unet->named_parameters()) model.parameters.emplace_back(item.key(), item.value());
  for (const auto& item : unet->named_buffers()) model.buffers.emplace_back(item.key(), item.value());
  train::ParamGroup group = train::default_param_group(train::OptimizerKind::adamw);
  group.lr = 1e-3;
  for (const auto& [name, p] : model.parameters) group.params.push_back(p);
  auto optimizer =
      std::make_shared<train::Optimizer>(train::OptimizerKind::adamw, std::vector<train::ParamGroup>{group});
  train::StepOptions trainer_options;
  trainer_options.clip = 1.0;
  trainer_options.accumulate = 2;
  train::Trainer trainer(model, optimizer, train::LrScheduleOptions{}, {train::EmaOptions{.decay = 0.999}},
                         trainer_options, cuda);
  diff::ScheduleOptions schedule;
  schedule.timesteps = 1000;
  diff::DiffusionTraining training{diff::make_schedule(schedule), diff::LossOptions{}, diff::TimestepSampling{},
                                   std::make_shared<diff::SampleStreams>(11)};
  const diff::Denoiser denoiser = [net = unet](const at::Tensor& x, const at::Tensor& t,
                                               const std::optional<at::Tensor>& labels) mutable {
    return net->forward(x, t, labels);
  };
  trainer.set_objective(
      std::make_shared<diff::DiffusionObjective>(training, denoiser, diff::ModelLabels{3, 0.25, 3}, std::nullopt));
  train::Batch batch;
  batch.tensors = {{"data", at::randn({8, 3, 8, 8}, at::TensorOptions().device(cuda))},
                   {"index", at::arange(8, at::kLong)},
                   {"label", at::tensor(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0, 1}).to(cuda)}};
  batch.epoch = 1;

  // Warm-up steps on a side stream (allocator pools, cuBLAS handles, optimizer state), as torch.cuda.graphs asks.
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) trainer.step(batch);
  }
  side.synchronize();
  const float before = trainer.step(batch).loss.item<float>();
  CHECK(std::isfinite(before));

  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    testing::capture_into(graph, [&] { trainer.step(batch); });
  }
  graph.replay();
  side.synchronize();
  CHECK(std::isfinite(trainer.step(batch).loss.item<float>()));
#endif
}
