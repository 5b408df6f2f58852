// Tests of runtime/dist/gradient_averager on 2 ranks over Gloo (two threads, each its own process group): the
// gradients are views of the bucket buffers and keep their addresses across steps, and the averaged gradients
// equal one process's on the whole batch, with and without accumulation and when a step replaces a .grad; and
// trainers given those groups (one process holding trainers of two groups) train as one process does.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/dist/gradient_averager.h"
#include "runtime/dist/process_group.h"
#include "runtime/train/trainer.h"
#include "tests/cpp/thread_ranks.h"

using runner::dist::GradientAverager;
using runner::dist::GradientAveragingOptions;

namespace {

constexpr int kRanks = 2;
constexpr std::int64_t kBatch = 8;  // the global batch: rows [4r, 4r + 4) on rank r
constexpr double kLearningRate = 0.1;

// A two-layer MLP, the same starting weights everywhere, and a parameter the loss never uses (its gradient
// counts as zeros).
std::vector<at::Tensor> make_parameters() {
  const at::Tensor seed_source = at::arange(1, 200, at::kFloat);
  auto weights = [&](std::vector<std::int64_t> shape, double phase) {
    std::int64_t numel = 1;
    for (std::int64_t size : shape) numel *= size;
    return at::sin(seed_source.narrow(0, 0, numel) * 0.7 + phase).reshape(shape).mul(0.5).requires_grad_(true);
  };
  return {weights({8, 4}, 0.1), weights({8}, 0.2), weights({5}, 0.3), weights({3, 8}, 0.4), weights({3}, 0.5)};
}

const at::Tensor& inputs() {
  static const at::Tensor x = at::cos(at::arange(kBatch * 4, at::kFloat) * 1.3).reshape({kBatch, 4});
  return x;
}

const at::Tensor& targets() {
  static const at::Tensor y = at::sin(at::arange(kBatch * 3, at::kFloat) * 0.9).reshape({kBatch, 3});
  return y;
}

// Mean squared error over the rows [first, first + count).
at::Tensor loss_of(const std::vector<at::Tensor>& p, std::int64_t first, std::int64_t count) {
  const at::Tensor x = inputs().narrow(0, first, count);
  const at::Tensor hidden = at::relu(at::linear(x, p[0], p[1]));
  return (at::linear(hidden, p[3], p[4]) - targets().narrow(0, first, count)).pow(2).mean();
}

void sgd(const std::vector<at::Tensor>& parameters) {
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : parameters)
    if (p.grad().defined()) const_cast<at::Tensor&>(p).sub_(p.grad() * kLearningRate);
}

// One process on the whole batch: every step's gradients (an unused parameter's as zeros).
std::vector<std::vector<at::Tensor>> one_process(int steps) {
  std::vector<at::Tensor> parameters = make_parameters();
  std::vector<std::vector<at::Tensor>> gradients;
  for (int step = 0; step < steps; ++step) {
    for (at::Tensor& p : parameters) p.mutable_grad().reset();
    loss_of(parameters, 0, kBatch).backward();
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : parameters) grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
    gradients.push_back(grads);
    sgd(parameters);
  }
  return gradients;
}

// What one rank saw at the end of each step.
struct RankStep {
  std::vector<at::Tensor> gradients;   // copies of the averaged gradients
  std::vector<const void*> addresses;  // the gradients' data pointers
  std::vector<bool> in_a_bucket;       // whether each gradient lies inside a bucket buffer
};

// Called between micro-batches (micro > 0) and before a step's first one (micro == 0) to play a user's part.
using Tamper = std::function<void(std::vector<at::Tensor>& parameters, int step, std::int64_t micro)>;

void on_ranks(const std::function<void(runner::dist::ProcessGroup& group, int rank)>& rank_main) {
  runner::test::on_ranks(kRanks, rank_main);
}

// Trains `steps` SGD steps on kRanks ranks as the trainer drives the averager; returns each rank's steps.
std::vector<std::vector<RankStep>> data_parallel(int steps, std::int64_t accumulate, GradientAveragingOptions options,
                                                 const Tamper& tamper = {}) {
  std::vector<std::vector<RankStep>> seen(kRanks);
  on_ranks([&](runner::dist::ProcessGroup& group, int rank) {
    std::vector<at::Tensor> parameters = make_parameters();
    GradientAverager averager(group, parameters, options);
    const std::int64_t rows = kBatch / kRanks / accumulate;
    for (int step = 0; step < steps; ++step) {
      averager.start_step();
      for (std::int64_t micro = 0; micro < accumulate; ++micro) {
        if (tamper) tamper(parameters, step, micro);
        if (micro == accumulate - 1) averager.expect_last_backward();
        const at::Tensor loss = loss_of(parameters, rank * kBatch / kRanks + micro * rows, rows);
        (loss / static_cast<double>(accumulate)).backward();
      }
      averager.average();
      RankStep record;
      for (const at::Tensor& p : parameters) {
        const at::Tensor& grad = p.grad();
        record.gradients.push_back(grad.clone());
        record.addresses.push_back(grad.data_ptr());
        bool inside = false;
        for (std::size_t b = 0; b < averager.bucket_count(); ++b) {
          const at::Tensor& bucket = averager.bucket_gradients(b);
          const auto* begin = static_cast<const char*>(bucket.data_ptr());
          const auto* address = static_cast<const char*>(grad.data_ptr());
          inside = inside || (grad.storage().is_alias_of(bucket.storage()) && address >= begin &&
                              address + grad.numel() * grad.element_size() <= begin + bucket.nbytes());
        }
        record.in_a_bucket.push_back(inside);
      }
      seen[rank].push_back(record);
      sgd(parameters);
    }
  });
  return seen;
}

// Each rank's gradients equal one process's (to float rounding: other summation order), every step.
void check_equals_one_process(const std::vector<std::vector<RankStep>>& ranks, int steps) {
  const std::vector<std::vector<at::Tensor>> expected = one_process(steps);
  for (int rank = 0; rank < kRanks; ++rank)
    for (int step = 0; step < steps; ++step)
      for (std::size_t i = 0; i < expected[step].size(); ++i) {
        INFO("rank " << rank << ", step " << step + 1 << ", parameter " << i);
        const at::Tensor& got = ranks[rank][step].gradients[i];
        CHECK(at::allclose(got, expected[step][i], 1e-5, 1e-7));
      }
}

// Every gradient lies in a bucket buffer, at the address it had after the first step.
void check_views_stay_put(const std::vector<std::vector<RankStep>>& ranks) {
  for (int rank = 0; rank < kRanks; ++rank)
    for (std::size_t step = 0; step < ranks[rank].size(); ++step)
      for (std::size_t i = 0; i < ranks[rank][step].addresses.size(); ++i) {
        INFO("rank " << rank << ", step " << step + 1 << ", parameter " << i);
        CHECK(ranks[rank][step].in_a_bucket[i]);
        CHECK(ranks[rank][step].addresses[i] == ranks[rank][0].addresses[i]);
      }
}

GradientAveragingOptions small_buckets(bool overlap) {
  GradientAveragingOptions options;
  options.bucket_mb = 100.0 / (1024 * 1024);  // 100 bytes: the parameters fall into several buckets
  options.overlap = overlap;
  return options;
}

}  // namespace

TEST_CASE("gradient averager: gradients are bucket views that stay put and average to one process's", "[dist]") {
  const bool overlap = GENERATE(true, false);
  INFO("overlap " << overlap);
  const int steps = 3;
  const auto ranks = data_parallel(steps, 1, small_buckets(overlap));
  check_views_stay_put(ranks);
  check_equals_one_process(ranks, steps);
}

TEST_CASE("gradient averager: accumulation over micro-batches adds into the buckets", "[dist]") {
  const std::int64_t accumulate = GENERATE(2, 4);
  INFO("accumulate " << accumulate);
  const int steps = 3;
  const auto ranks = data_parallel(steps, accumulate, small_buckets(true));
  check_views_stay_put(ranks);
  check_equals_one_process(ranks, steps);
}

TEST_CASE("gradient averager: a replaced .grad is copied into its bucket and the view put back", "[dist]") {
  // Parameter 0's grad replaced by a copy between micro-batches (its values must count), parameter 3's set
  // to none before a step (the bucket view must come back), parameter 1's zeroed in place as
  // Optimizer::zero_grad(set_to_none = false) does (detach_ must work on the view).
  const Tamper tamper = [](std::vector<at::Tensor>& p, int step, std::int64_t micro) {
    if (micro == 1) p[0].mutable_grad() = p[0].grad().clone();
    if (micro == 0 && step == 1) p[3].mutable_grad().reset();
    if (micro == 0 && step == 2) p[1].mutable_grad().detach_().zero_();
  };
  const int steps = 3;
  const auto ranks = data_parallel(steps, 2, small_buckets(true), tamper);
  check_views_stay_put(ranks);
  check_equals_one_process(ranks, steps);
}

TEST_CASE("trainers given two ranks' groups average over them: their SGD steps equal one process's", "[dist]") {
  constexpr int kSteps = 3;
  // One process on the whole batch, with the same SGD.
  std::vector<at::Tensor> expected = make_parameters();
  for (int step = 0; step < kSteps; ++step) {
    for (at::Tensor& p : expected) p.mutable_grad().reset();
    loss_of(expected, 0, kBatch).backward();
    sgd(expected);
  }
  std::vector<std::vector<at::Tensor>> trained(kRanks);
  on_ranks([&](runner::dist::ProcessGroup& group, int rank) {
    std::vector<at::Tensor> parameters = make_parameters();
    if (rank == 1)  // the trainer starts every rank from rank 0's weights
      for (at::Tensor& p : parameters) p.detach().add_(1.0);
    runner::train::TrainerModel model;
    runner::train::ParamGroup sgd_group = runner::train::default_param_group(runner::train::OptimizerKind::sgd);
    sgd_group.lr = kLearningRate;
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      model.parameters.emplace_back("p" + std::to_string(i), parameters[i]);
      sgd_group.params.push_back(parameters[i]);
    }
    auto optimizer = std::make_shared<runner::train::Optimizer>(runner::train::OptimizerKind::sgd,
                                                                std::vector<runner::train::ParamGroup>{sgd_group});
    runner::train::Trainer trainer(model, optimizer, {}, {}, {}, at::kCPU, &group);
    if (trainer.process_group() != &group) throw std::logic_error("the trainer does not hold the group it was given");
    for (int step = 0; step < kSteps; ++step)
      trainer.step(
          [&](std::int64_t, std::int64_t) { return loss_of(parameters, rank * kBatch / kRanks, kBatch / kRanks); });
    for (const at::Tensor& p : parameters) trained[rank].push_back(p.detach().clone());
  });
  for (int rank = 0; rank < kRanks; ++rank)
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO("rank " << rank << ", parameter " << i);
      CHECK(at::allclose(trained[rank][i], expected[i].detach(), 1e-5, 1e-7));
    }
}
