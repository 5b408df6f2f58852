// Dynamic loss scaling: unscaling with the inf/NaN check, back-off, growth, state.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <limits>

#include "runtime/train/loss_scaler.h"

using namespace runner::train;

TEST_CASE("the loss scaler unscales gradients and reports non-finite ones", "[loss_scaler]") {
  LossScaler scaler({1024.0, 2.0, 0.5, 3}, at::kCPU);
  CHECK(scaler.scale_loss(at::tensor({0.5f})).item<float>() == 512.0f);
  std::vector<at::Tensor> grads = {at::full({3}, 2048.0f), at::full({2, 2}, -512.0f), at::Tensor()};
  const at::Tensor found = scaler.unscale(grads);
  CHECK(found.item<float>() == 0.0f);
  CHECK(grads[0].equal(at::full({3}, 2.0f)));
  CHECK(grads[1].equal(at::full({2, 2}, -0.5f)));
  std::vector<at::Tensor> bad = {at::ones({2}), at::tensor({1.0f, std::numeric_limits<float>::infinity()})};
  CHECK(scaler.unscale(bad).item<float>() == 1.0f);
  std::vector<at::Tensor> nan = {at::tensor({std::numeric_limits<float>::quiet_NaN()})};
  CHECK(scaler.unscale(nan).item<float>() == 1.0f);
}

TEST_CASE("the scale backs off on overflow and grows after growth_interval good steps", "[loss_scaler]") {
  LossScaler scaler({1024.0, 2.0, 0.5, 3}, at::kCPU);
  const at::Tensor good = at::zeros({1}), overflow = at::ones({1});
  // good, good, overflow, good x3 (grow), good x3 (grow), overflow
  const std::vector<std::pair<bool, double>> steps = {{false, 1024}, {false, 1024}, {true, 512},   {false, 512},
                                                      {false, 512},  {false, 1024}, {false, 1024}, {false, 1024},
                                                      {false, 2048}, {true, 1024}};
  std::vector<int64_t> trackers;
  for (const auto& [inf, expected] : steps) {
    scaler.update(inf ? overflow : good);
    CHECK(scaler.scale() == expected);
    trackers.push_back(scaler.growth_tracker());
  }
  CHECK(trackers == std::vector<int64_t>{1, 2, 0, 1, 2, 0, 1, 2, 0, 0});
}

TEST_CASE("the loss scaler's state round-trips and bad options are refused", "[loss_scaler]") {
  LossScaler scaler({256.0, 2.0, 0.5, 2}, at::kCPU);
  scaler.update(at::ones({1}));
  scaler.update(at::zeros({1}));
  LossScaler restored({65536.0, 2.0, 0.5, 2}, at::kCPU);
  restored.load_state_tensors(scaler.state_tensors());
  CHECK(restored.scale() == 128.0);
  CHECK(restored.growth_tracker() == 1);
  restored.update(at::zeros({1}));
  CHECK(restored.scale() == 256.0);
  CHECK_THROWS_WITH(restored.load_state_tensors({{"scale", at::ones({1})}}),
                    "loss scaler state: needs 'scale' and 'growth_tracker'");
  CHECK_THROWS_WITH(restored.load_state_tensors({{"bogus", at::ones({1})}}),
                    "loss scaler state: unknown tensor 'bogus'");
  CHECK_THROWS_WITH(LossScaler({0.0, 2.0, 0.5, 10}, at::kCPU),
                    "loss scaler: init_scale must be > 0, growth_factor > 1, backoff_factor in (0, 1) and "
                    "growth_interval >= 1 (got 0, 2, 0.5, 10)");
}
