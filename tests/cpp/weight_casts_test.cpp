// cast_weights_once: under bf16 autocast (here on the CPU) a DiT trained with its weights cast once per step gives
// the losses and weights of autocast's casts at each use, bit for bit, with one multi-tensor copy instead of a
// cast per weight.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "runtime/nn/dit.h"
#include "runtime/train/trainer.h"
#include "tests/cpp/operator_counts.h"
#include "tests/cpp/small_dit.h"

namespace {

namespace train = runner::train;

struct DiTTraining {
  runner::nn::DiT dit{nullptr};
  std::shared_ptr<train::Trainer> trainer;

  explicit DiTTraining(bool cast_weights_once) {
    at::manual_seed(31);
    dit = runner::nn::DiT(runner::testing::small_dit_options());
    {
      const at::NoGradGuard no_grad;  // adaLN-Zero's zeros would leave most weights without gradients at first
      for (auto& p : dit->parameters()) {
        if (p.requires_grad()) p.normal_(0, 0.05);
      }
    }
    train::TrainerModel model;
    for (const auto& item : dit->named_parameters()) model.parameters.emplace_back(item.key(), item.value());
    train::ParamGroup group = train::default_param_group(train::OptimizerKind::adamw);
    group.lr = 1e-3;
    for (const auto& [name, p] : model.parameters) {
      if (p.requires_grad()) group.params.push_back(p);
    }
    auto optimizer =
        std::make_shared<train::Optimizer>(train::OptimizerKind::adamw, std::vector<train::ParamGroup>{group});
    train::StepOptions step;
    step.amp = "bf16";
    step.accumulate = 2;
    step.clip = 1.0;
    step.cast_weights_once = cast_weights_once;
    trainer = std::make_shared<train::Trainer>(model, optimizer, train::LrScheduleOptions{},
                                               std::vector<train::EmaOptions>{}, step, c10::Device(c10::kCPU));
  }

  train::StepResult step(std::int64_t n) {
    at::manual_seed(100 + n);
    const auto x = at::randn({4, 4, 8, 8});
    const auto t = at::randint(0, 1000, {4}, at::kLong);
    const auto labels = at::randint(0, 3, {4}, at::kLong);
    const auto target = at::randn({4, 8, 8, 8});
    return trainer->step([&](std::int64_t micro, std::int64_t count) {
      const auto rows = at::arange(micro * 4 / count, (micro + 1) * 4 / count);
      const auto out = dit->forward(x.index_select(0, rows), t.index_select(0, rows), labels.index_select(0, rows));
      return (out.to(at::kFloat) - target.index_select(0, rows)).square().mean();
    });
  }
};

}  // namespace

TEST_CASE("weights cast once per step give autocast's losses and weights bit for bit over 20 steps", "[train]") {
  DiTTraining once(true), each_use(false);
  for (std::int64_t n = 0; n < 20; ++n) {
    INFO("step " << n + 1);
    const auto a = once.step(n), b = each_use.step(n);
    REQUIRE(at::equal(a.loss, b.loss));
    REQUIRE(at::equal(a.grad_norm, b.grad_norm));
  }
  const auto reference = each_use.dit->named_parameters();
  for (const auto& p : once.dit->named_parameters()) {
    INFO(p.key());
    CHECK(at::equal(p.value(), reference[p.key()]));
  }
}

TEST_CASE("weights cast once per step take one multi-tensor copy in place of a cast per weight", "[train]") {
  DiTTraining once(true), each_use(false);
  once.step(0);
  each_use.step(0);
  const auto ops_once = runner::testing::operators_called([&] { once.step(1); });
  const auto ops_each_use = runner::testing::operators_called([&] { each_use.step(1); });
  const auto calls = [](const std::map<std::string, int>& ops, const char* name) {
    const auto found = ops.find(name);
    return found == ops.end() ? 0 : found->second;
  };
  CHECK(calls(ops_once, "aten::_foreach_copy_") == 1);
  CHECK(calls(ops_each_use, "aten::_foreach_copy_") == 0);
  // The Linear layers' weights and biases (2 blocks x 5 + the timestep MLP's 2 + the final layer's adaLN
  // projection and projection = 14 layers, 28 tensors), in each of the 2 micro-batches' forwards, are no longer
  // cast.
  CHECK(calls(ops_each_use, "aten::_to_copy") - calls(ops_once, "aten::_to_copy") == 2 * 28);
}
