// runner.trainer { graph = ... }: a step replayed from a CUDA graph gives what the eager step gives, a new batch
// shape or a restore captures again, and what cannot be captured is refused (graph = true) or runs eagerly ("auto").
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "tests/cpp/cuda_skip.h"
#include "tests/cpp/small_diffusion_trainer.h"

namespace {

using namespace runner;
namespace diff = runner::diffusion;
using Setup = testing::SmallDiffusionTrainer;
using testing::batch;

std::vector<float> values(const std::vector<at::Tensor>& tensors) {
  std::vector<float> out;
  for (const auto& t : tensors) out.push_back(t.item<float>());
  return out;
}

}  // namespace

TEST_CASE("graph = true is refused off CUDA; graph = \"auto\" runs eagerly there and says why", "[train][graph]") {
  const c10::Device cpu(c10::kCPU);
  CHECK_THROWS_WITH(Setup(cpu, train::GraphMode::on),
                    "runner.trainer: graph = true, but CUDA graphs need a CUDA device; the model is on cpu");

  Setup eager(cpu, train::GraphMode::off, 1);
  Setup automatic(cpu, train::GraphMode::automatic, 1);
  for (std::int64_t n = 0; n < 4; ++n) {
    const float a = eager.trainer->step(batch(cpu, n, 4)).loss.item<float>();
    const float b = automatic.trainer->step(batch(cpu, n, 4)).loss.item<float>();
    CHECK(a == b);
  }
  const train::GraphStatus status = automatic.trainer->graph_status();
  CHECK(status.captured == 0);
  CHECK(status.replayed == 0);
  CHECK(status.eager_reason == std::optional<std::string>("CUDA graphs need a CUDA device; the model is on cpu"));
  CHECK_FALSE(eager.trainer->graph_status().eager_reason.has_value());
}

TEST_CASE("the diffusion objective prepares a batch's keys on the host and refuses a batch that has its name",
          "[train][graph]") {
  const c10::Device cpu(c10::kCPU);
  Setup setup(cpu, train::GraphMode::off, 1);
  train::StepBatch b = batch(cpu, 5, 4);
  const train::StepBatch prepared = setup.objective->prepare(b);
  const at::Tensor* keys = prepared.find("sample_keys");
  REQUIRE(keys != nullptr);
  // (epoch, dataset index): epoch 1, indices 20..23.
  CHECK(at::equal(*keys, diff::SampleStreams::loader_keys(1, at::arange(20, 24, at::kLong))));
  // The loss of a prepared batch is the loss of the batch itself.
  at::manual_seed(0);
  const at::Tensor direct = setup.objective->loss(b);
  const at::Tensor from_keys = setup.objective->loss(prepared);
  CHECK(at::equal(direct, from_keys));
  CHECK_THROWS_WITH(setup.objective->prepare(prepared),
                    "loss: the batch has a tensor named 'sample_keys', a name the objective keeps for itself");
}

TEST_CASE("a step replayed from a CUDA graph equals the eager step; new shapes and restores capture again",
          "[train][graph][cuda]") {
  SKIP_WITHOUT_CUDA("replaying training steps from CUDA graphs");
  const c10::Device cuda(c10::kCUDA, 0);
  core::set_tf32(false);
  Setup eager(cuda, train::GraphMode::off);
  Setup graph(cuda, train::GraphMode::on);
  auto compare = [&](std::int64_t n, std::int64_t size) {
    const train::StepResult a = eager.trainer->step(batch(cuda, n, size));
    const train::StepResult b = graph.trainer->step(batch(cuda, n, size));
    INFO("step " << a.step << ", batch of " << size);
    CHECK(a.step == b.step);
    CHECK(a.lr == b.lr);
    CHECK(b.loss.item<float>() == Approx(a.loss.item<float>()).epsilon(1e-5));
    CHECK(b.grad_norm.item<float>() == Approx(a.grad_norm.item<float>()).epsilon(1e-4));
  };
  // Step 1 (the EMA copies the weights) and steps 2-3 warm up, step 4 is captured, 5-8 are replayed.
  for (std::int64_t n = 0; n < 8; ++n) compare(n, 8);
  train::GraphStatus status = graph.trainer->graph_status();
  CHECK(status.captured == 1);
  CHECK(status.replayed == 5);
  CHECK_FALSE(status.eager_reason.has_value());
  CHECK(graph.trainer->optimizer().step_count() == 8);
  CHECK(graph.trainer->emas()[0].update_count() == 8);
  CHECK(graph.trainer->emas()[0].last_update_step() == 8);

  // Another batch size: two warm-up steps, then a capture of its own; the first size replays as before.
  for (std::int64_t n = 8; n < 12; ++n) compare(n, 4);
  compare(12, 8);
  status = graph.trainer->graph_status();
  CHECK(status.captured == 2);
  CHECK(status.replayed == 8);

  // A restore drops the graphs: the next steps warm up and capture again.
  for (Setup* setup : {&eager, &graph}) setup->trainer->restore_counters(13, setup->trainer->skipped());
  for (std::int64_t n = 13; n < 17; ++n) compare(n, 8);
  status = graph.trainer->graph_status();
  CHECK(status.captured == 3);
  CHECK(status.replayed == 10);

  const auto weights = [](Setup& s) {
    std::vector<at::Tensor> out;
    for (const auto& p : s.unet->parameters()) out.push_back(p.detach().cpu());
    return out;
  };
  const std::vector<at::Tensor> a = weights(eager), b = weights(graph);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(at::allclose(a[i], b[i], 1e-4, 1e-6));
  const std::vector<at::Tensor>& shadow_a = eager.trainer->emas()[0].shadow();
  const std::vector<at::Tensor>& shadow_b = graph.trainer->emas()[0].shadow();
  for (std::size_t i = 0; i < shadow_a.size(); ++i) CHECK(at::allclose(shadow_a[i], shadow_b[i], 1e-4, 1e-6));
  CHECK(values({eager.trainer->skipped()}) == values({graph.trainer->skipped()}));
  core::set_tf32(true);
}

TEST_CASE("what a CUDA graph cannot capture is an error with graph = true and runs eagerly with \"auto\"",
          "[train][graph][cuda]") {
  SKIP_WITHOUT_CUDA("the fallbacks of CUDA graph capture");
  const c10::Device cuda(c10::kCUDA, 0);
  const diff::CaptureCheck checkpointing = [] {
    return std::optional<std::string>("the model recomputes activations");
  };
  Setup strict(cuda, train::GraphMode::on, 1, checkpointing);
  CHECK_THROWS_WITH(
      strict.trainer->step(batch(cuda, 0)),
      "runner.trainer: graph = true, but the model recomputes activations (graph = \"auto\" runs such steps eagerly)");
  const train::LossFunction loss_function = [&](std::int64_t, std::int64_t) {
    return strict.objective->loss(batch(cuda, 0));
  };
  CHECK_THROWS_WITH(strict.trainer->step(loss_function),
                    "runner.trainer: graph = true, but the loss is a function called at every step, which a CUDA graph "
                    "cannot capture: give the trainer an objective (e.g. ddpm:objective(model)), or use graph = "
                    "\"auto\" to run such steps eagerly");

  Setup relaxed(cuda, train::GraphMode::automatic, 1, checkpointing);
  for (std::int64_t n = 0; n < 4; ++n) relaxed.trainer->step(batch(cuda, n));
  const train::GraphStatus status = relaxed.trainer->graph_status();
  CHECK(status.captured == 0);
  CHECK(status.eager_reason == std::optional<std::string>("the model recomputes activations"));
  CHECK(relaxed.trainer->step_count() == 4);
}

TEST_CASE("a replayed step skips a non-finite update on the device and the stop comes one step later",
          "[train][graph][cuda]") {
  SKIP_WITHOUT_CUDA("non-finite steps replayed from a CUDA graph");
  const c10::Device cuda(c10::kCUDA, 0);
  Setup setup(cuda, train::GraphMode::on, 1, {}, "fp32", train::NonFinitePolicy::stop);
  for (std::int64_t n = 0; n < 5; ++n) setup.trainer->step(batch(cuda, n));
  REQUIRE(setup.trainer->graph_status().replayed == 2);
  std::vector<at::Tensor> before;
  for (const auto& p : setup.unet->parameters()) before.push_back(p.detach().clone());
  train::StepBatch bad = batch(cuda, 5);
  bad.tensors[0].second[0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  const train::StepResult result = setup.trainer->step(bad);  // replayed: nothing is read back yet
  CHECK(std::isnan(result.loss.item<float>()));
  CHECK(setup.trainer->graph_status().replayed == 3);
  CHECK_THROWS_WITH(setup.trainer->step(batch(cuda, 6)), Catch::Contains("non-finite values at step 6"));
  std::size_t i = 0;
  for (const auto& p : setup.unet->parameters()) CHECK(at::equal(p.detach(), before[i++]));
  CHECK(setup.trainer->skipped().item<std::int64_t>() == 2);
}

TEST_CASE("fp16 steps with the loss scaler replay from a CUDA graph as they run eagerly", "[train][graph][cuda]") {
  SKIP_WITHOUT_CUDA("fp16 loss scaling in a CUDA graph");
  const c10::Device cuda(c10::kCUDA, 0);
  Setup eager(cuda, train::GraphMode::off, 1, {}, "fp16");
  Setup graph(cuda, train::GraphMode::on, 1, {}, "fp16");
  for (std::int64_t n = 0; n < 8; ++n) {
    const train::StepResult a = eager.trainer->step(batch(cuda, n));
    const train::StepResult b = graph.trainer->step(batch(cuda, n));
    INFO("step " << a.step);
    CHECK(b.loss.item<float>() == Approx(a.loss.item<float>()).epsilon(1e-3));
    CHECK(b.loss_scale.item<float>() == a.loss_scale.item<float>());
  }
  CHECK(graph.trainer->graph_status().replayed == 5);
}
