// Tests of runtime/dist/parameter_shards through the trainer on 2 and 3 ranks over Gloo (threads, each its own
// process group): each shard mode trains as unsharded data parallel does (weights, EMA, losses, gradient norms,
// optimizer state), with uneven and empty shares, clipping and accumulation; gradients mode frees the full
// gradients, weights mode the blocks' weights between their uses; checkpoints that each rank writes its rows of,
// restored at other world sizes and consolidated.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/ckpt/sharded_checkpoint.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/ckpt/staged_files.h"
#include "runtime/dist/parameter_shards.h"
#include "runtime/dist/process_group.h"
#include "runtime/nn/parameter_group_hooks.h"
#include "runtime/run/checkpoint_format.h"
#include "runtime/train/trainer.h"
#include "tests/cpp/temp_directory.h"
#include "tests/cpp/thread_ranks.h"

using runner::dist::ShardMode;

namespace {

constexpr std::int64_t kBatch = 12;  // divisible by 2 and 3 ranks, and by 2 micro-batches on each

// The two blocks' brackets, as a built-in model's forward has them.
struct Blocks : runner::nn::GroupedForward {
  std::vector<std::string> parameter_groups() const override { return {"blocks.0", "blocks.1"}; }
  void enter(std::size_t block) const { before_group("blocks", block); }
  void leave(std::size_t block, const std::vector<at::Tensor>& outputs) const { after_group("blocks", block, outputs); }
};

struct Model {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  std::shared_ptr<Blocks> blocks = std::make_shared<Blocks>();
  bool rounded = false;  // the forward sees the weights rounded to bf16 (what a bf16 gather gives it)
  at::Tensor get(const std::string& name) const {
    for (const auto& [n, t] : parameters)
      if (n == name) return rounded ? t + (t.to(at::kBFloat16).to(at::kFloat) - t).detach() : t;  // grad unrounded
    throw std::logic_error(name);
  }
  // The weights as whole tensors: each block's read inside its bracket (sharded over the weights, a gather).
  std::vector<at::Tensor> whole_weights() const {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> weights;
    for (const auto& [name, p] : parameters) {
      const bool in_block = name.rfind("blocks.", 0) == 0;
      const std::size_t block = in_block ? static_cast<std::size_t>(name[7] - '0') : 0;
      if (in_block) blocks->enter(block);
      weights.push_back(p.detach().clone());
      if (in_block) blocks->leave(block, {});
    }
    return weights;
  }
};

// Two numbered blocks (two shard groups), a head of 2 rows (rank 2 of 3 holds none of it), a 0-dim scale and a
// parameter the loss never uses (no gradient: zeros).
Model make_model() {
  const at::Tensor source = at::arange(1, 200, at::kFloat);
  auto weights = [&](std::vector<std::int64_t> shape, double phase) {
    std::int64_t numel = 1;
    for (std::int64_t size : shape) numel *= size;
    return at::sin(source.narrow(0, 0, numel) * 0.7 + phase).reshape(shape).mul(0.5).requires_grad_(true);
  };
  Model model;
  model.parameters = {{"blocks.0.weight", weights({5, 4}, 0.1)},
                      {"blocks.0.bias", weights({5}, 0.2)},
                      {"blocks.1.weight", weights({3, 5}, 0.3)},
                      {"blocks.1.bias", weights({3}, 0.4)},
                      {"head.weight", weights({2, 3}, 0.5)},
                      {"scale", weights({}, 0.6)},
                      {"unused", weights({4}, 0.7)}};
  return model;
}

// Storage bytes of blocks.0.weight seen by the forward of blocks.1 (per call): 0 once sharding over the weights
// released it.
thread_local std::vector<std::size_t> block0_bytes_in_block1;

at::Tensor loss_of(const Model& m, std::int64_t first, std::int64_t count) {
  static const at::Tensor x = at::cos(at::arange(kBatch * 4, at::kFloat) * 1.3).reshape({kBatch, 4});
  static const at::Tensor y = at::sin(at::arange(kBatch * 2, at::kFloat) * 0.9).reshape({kBatch, 2});
  m.blocks->enter(0);
  at::Tensor h = at::relu(at::linear(x.narrow(0, first, count), m.get("blocks.0.weight"), m.get("blocks.0.bias")));
  m.blocks->leave(0, {h});
  m.blocks->enter(1);
  block0_bytes_in_block1.push_back(m.get("blocks.0.weight").storage().nbytes());
  h = at::relu(at::linear(h, m.get("blocks.1.weight"), m.get("blocks.1.bias")));
  m.blocks->leave(1, {h});
  return (at::linear(h, m.get("head.weight")) * m.get("scale") - y.narrow(0, first, count)).pow(2).mean();
}

struct Trained {
  std::vector<at::Tensor> weights, ema;
  std::vector<double> losses, norms;
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state;  // full, as a checkpoint saves it
  std::vector<bool> full_gradient_kept;                             // after the last step, per parameter
  std::vector<std::size_t> storage_bytes;                           // between steps, per parameter
  std::vector<std::size_t> block0_bytes_in_block1;
  runner::train::Trainer::StateBytes bytes;
  std::int64_t skipped = 0;
  std::int64_t prefetched_gathers = 0;
  std::vector<at::Tensor> model_state;  // train:model_state(): the fp32 weights the optimizer holds, gathered
};

struct Setup {
  int ranks = 2;
  ShardMode shard = ShardMode::none;
  std::int64_t accumulate = 1;
  std::optional<double> clip;
  int steps = 10;
  bool overlap = true;
  int nan_step = 0;  // rank 1's loss is NaN at this step (1-based; 0: never)
  runner::dist::WeightGather gather = runner::dist::WeightGather::fp32;
  bool rounded_forward = false;  // Model::rounded
};

// AdamW (weight decay) with an EMA over `group`'s ranks.
std::unique_ptr<runner::train::Trainer> make_trainer(const Setup& setup, const Model& model,
                                                     runner::dist::ProcessGroup& group) {
  runner::train::TrainerModel trainer_model;
  trainer_model.grouped = model.blocks;
  runner::train::ParamGroup adamw = runner::train::default_param_group(runner::train::OptimizerKind::adamw);
  adamw.lr = 2e-2;
  for (const auto& [name, p] : model.parameters) {
    trainer_model.parameters.emplace_back(name, p);
    adamw.params.push_back(p);
  }
  auto optimizer = std::make_shared<runner::train::Optimizer>(runner::train::OptimizerKind::adamw,
                                                              std::vector<runner::train::ParamGroup>{adamw});
  runner::train::StepOptions options;
  options.amp = "fp32";
  options.shard = setup.shard;
  options.accumulate = setup.accumulate;
  options.clip = setup.clip;
  options.data_parallel.overlap = setup.overlap;
  options.shard_gather = setup.gather;
  runner::train::EmaOptions ema;
  ema.decay = 0.9;
  return std::make_unique<runner::train::Trainer>(trainer_model, optimizer, runner::train::LrScheduleOptions{},
                                                  std::vector<runner::train::EmaOptions>{ema}, options, at::kCPU,
                                                  &group);
}

// Rank `rank`'s result of `setup.steps` steps over `setup.ranks` ranks.
std::vector<Trained> train(const Setup& setup) {
  std::vector<Trained> result(static_cast<std::size_t>(setup.ranks));
  runner::test::on_ranks(setup.ranks, [&](runner::dist::ProcessGroup& group, int rank) {
    Model model = make_model();
    model.rounded = setup.rounded_forward;
    const std::unique_ptr<runner::train::Trainer> made = make_trainer(setup, model, group);
    runner::train::Trainer& trainer = *made;
    const runner::train::Optimizer* optimizer = &trainer.optimizer();
    Trained& out = result[static_cast<std::size_t>(rank)];
    const std::int64_t rows = kBatch / setup.ranks / setup.accumulate;
    for (int step = 0; step < setup.steps; ++step) {
      const runner::train::StepResult done = trainer.step([&](std::int64_t micro, std::int64_t) {
        const at::Tensor loss = loss_of(model, rank * kBatch / setup.ranks + micro * rows, rows);
        return rank == 1 && step + 1 == setup.nan_step ? loss * std::nan("") : loss;
      });
      out.skipped = done.skipped.item<std::int64_t>();
      out.losses.push_back(done.loss.item<double>());
      out.norms.push_back(done.grad_norm.item<double>());
    }
    trainer.check_ranks_agree();
    out.block0_bytes_in_block1 = block0_bytes_in_block1;
    block0_bytes_in_block1.clear();
    for (const auto& [name, p] : model.parameters) {
      out.storage_bytes.push_back(p.storage().nbytes());
      out.ema.push_back(at::empty(p.sizes(), p.options().requires_grad(false)));
      out.full_gradient_kept.push_back(p.grad().defined());
    }
    out.weights = model.whole_weights();
    trainer.copy_ema(0, out.ema, {});
    out.optimizer_state = trainer.full_optimizer_state();
    out.bytes = trainer.state_bytes();
    if (trainer.shards()) out.prefetched_gathers = trainer.shards()->prefetched_gathers();
    for (const auto& [name, tensor] : trainer.full_model_state()) out.model_state.push_back(tensor);
    // A restore gives each rank its rows of the full state back.
    const auto local = trainer.local_optimizer_state(out.optimizer_state);
    const auto own = optimizer->state_tensors();
    if (local.size() != own.size()) throw std::logic_error("local_optimizer_state: another count");
    for (std::size_t i = 0; i < own.size(); ++i)
      if (local[i].first != own[i].first || !at::equal(local[i].second, own[i].second))
        throw std::logic_error("local_optimizer_state: rank's rows differ for " + own[i].first);
  });
  return result;
}

// Equal within the tolerance of PyTorch's own FSDP2-versus-DDP tests (summation orders differ in the norm).
void check_same_training(const std::vector<Trained>& sharded, const std::vector<Trained>& reference) {
  for (std::size_t rank = 0; rank < sharded.size(); ++rank) {
    const Trained& got = sharded[rank];
    const Trained& want = reference[rank];
    for (std::size_t i = 0; i < want.weights.size(); ++i) {
      INFO("rank " << rank << ", parameter " << i);
      CHECK(at::allclose(got.weights[i], want.weights[i], 1.3e-6, 1e-5));
      CHECK(at::allclose(got.ema[i], want.ema[i], 1.3e-6, 1e-5));
    }
    CHECK(got.skipped == want.skipped);
    for (std::size_t s = 0; s < want.losses.size(); ++s) {
      INFO("rank " << rank << ", step " << s + 1);
      if (std::isnan(want.losses[s])) {
        CHECK(std::isnan(got.losses[s]));
        continue;
      }
      CHECK(got.losses[s] == Approx(want.losses[s]).epsilon(1.3e-6).margin(1e-6));
      CHECK(got.norms[s] == Approx(want.norms[s]).epsilon(1.3e-6).margin(1e-6));
    }
    REQUIRE(got.optimizer_state.size() == want.optimizer_state.size());
    for (std::size_t i = 0; i < want.optimizer_state.size(); ++i) {
      INFO("rank " << rank << ", " << want.optimizer_state[i].first);
      CHECK(got.optimizer_state[i].first == want.optimizer_state[i].first);
      CHECK(got.optimizer_state[i].second.sizes() == want.optimizer_state[i].second.sizes());
      CHECK(at::allclose(got.optimizer_state[i].second, want.optimizer_state[i].second, 1.3e-6, 1e-5));
    }
  }
}

std::vector<std::string> names_in(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("sharded data parallel: the row split is torch.chunk's", "[dist]") {
  using runner::dist::shard_rows;
  CHECK(shard_rows(5, 0, 2).begin == 0);
  CHECK(shard_rows(5, 0, 2).end == 3);
  CHECK(shard_rows(5, 1, 2).begin == 3);
  CHECK(shard_rows(5, 1, 2).end == 5);
  // 2 rows over 3 ranks: chunks of 1, the third rank none.
  CHECK(shard_rows(2, 1, 3).size() == 1);
  CHECK(shard_rows(2, 2, 3).size() == 0);
  CHECK(shard_rows(2, 2, 3).begin == 2);
  // torch.chunk(arange(10), 4) gives 3, 3, 3, 1.
  CHECK(shard_rows(10, 3, 4).size() == 1);
  CHECK_THROWS_WITH(runner::dist::parse_shard_mode("zero2"),
                    "shard must be \"none\", \"optimizer\" (ZeRO-1), \"gradients\" (ZeRO-2) or \"weights\" (ZeRO-3), "
                    "got \"zero2\"");
}

TEST_CASE("sharded data parallel on 2 ranks trains as unsharded data parallel does", "[dist]") {
  const ShardMode mode = GENERATE(ShardMode::optimizer, ShardMode::gradients, ShardMode::weights);
  INFO("shard " << runner::dist::shard_mode_name(mode));
  Setup setup;
  const std::vector<Trained> reference = train(setup);
  setup.shard = mode;
  const std::vector<Trained> sharded = train(setup);
  check_same_training(sharded, reference);
  // The weights themselves are the same bits: the same sums, then elementwise updates.
  for (std::size_t i = 0; i < reference[0].weights.size(); ++i) {
    INFO("parameter " << i);
    CHECK(at::equal(sharded[0].weights[i], reference[0].weights[i]));
    CHECK(at::equal(sharded[1].weights[i], reference[0].weights[i]));
  }
  for (std::size_t i = 0; i + 1 < reference[0].weights.size(); ++i)  // the last, unused, never has a gradient
    CHECK(sharded[0].full_gradient_kept[i] == (mode == ShardMode::optimizer));
  // The ranks' EMAs and optimizer moments partition one copy (each rank keeps its own step counts: 7 floats).
  CHECK(sharded[0].bytes.ema + sharded[1].bytes.ema == reference[0].bytes.ema);
  CHECK(sharded[0].bytes.optimizer + sharded[1].bytes.optimizer == reference[0].bytes.optimizer + 7 * 4);
  CHECK(sharded[0].bytes.optimizer < reference[0].bytes.optimizer);
  if (mode != ShardMode::weights) {
    CHECK(sharded[0].bytes.weights == reference[0].bytes.weights);
    return;
  }
  // The blocks' weights are released between their uses: the forward of blocks.1 runs without blocks.0's, and
  // between steps each rank holds its rows of them (blocks.0: 3 of 5 rows padded, blocks.1: 2 of 3) and the root
  // group whole (11 values) beside its rows (6).
  for (std::size_t rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(sharded[rank].bytes.weights == (3 * 5 + 2 * 6 + 11 + 6) * 4);
    CHECK(sharded[rank].storage_bytes == std::vector<std::size_t>{0, 0, 0, 0, 6 * 4, 4, 4 * 4});
    REQUIRE(sharded[rank].block0_bytes_in_block1.size() == 10);
    for (std::size_t bytes : sharded[rank].block0_bytes_in_block1) CHECK(bytes == 0);
    // From the second step the forward of blocks.1 finds its gather started by blocks.0's, and from the first the
    // backward of blocks.0 finds its own started by blocks.1's.
    CHECK(sharded[rank].prefetched_gathers == 9 + 10);
  }
  CHECK(reference[0].block0_bytes_in_block1.front() == 5 * 4 * 4);
}

TEST_CASE("sharded data parallel on 3 ranks: uneven and empty shares, clipping and accumulation", "[dist]") {
  const ShardMode mode = GENERATE(ShardMode::optimizer, ShardMode::gradients, ShardMode::weights);
  const bool overlap = GENERATE(true, false);
  INFO("shard " << runner::dist::shard_mode_name(mode) << ", overlap " << overlap);
  Setup setup;
  setup.overlap = overlap;
  setup.ranks = 3;
  setup.accumulate = 2;
  setup.clip = 0.05;  // below the norms of the first steps: clipping acts
  setup.steps = 6;
  const std::vector<Trained> reference = train(setup);
  REQUIRE(reference[0].norms[0] > 0.05);
  setup.shard = mode;
  check_same_training(train(setup), reference);
}

TEST_CASE("sharded data parallel over the weights with bf16 gathers trains on the rounded weights", "[dist]") {
  // The reference: unsharded data parallel whose forward rounds every weight to bf16 (the gradient passes the
  // rounding unchanged), the fp32 weights stepped by the optimizer.
  Setup setup;
  setup.rounded_forward = true;
  const std::vector<Trained> reference = train(setup);
  setup.rounded_forward = false;
  setup.shard = ShardMode::weights;
  setup.gather = runner::dist::WeightGather::bf16;
  const std::vector<Trained> sharded = train(setup);
  for (std::size_t rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    for (std::size_t s = 0; s < reference[0].losses.size(); ++s) {
      INFO("step " << s + 1);
      CHECK(sharded[rank].losses[s] == Approx(reference[rank].losses[s]).epsilon(1.3e-6).margin(1e-6));
      CHECK(sharded[rank].norms[s] == Approx(reference[rank].norms[s]).epsilon(1.3e-6).margin(1e-6));
    }
    for (std::size_t i = 0; i < reference[0].weights.size(); ++i) {
      INFO("parameter " << i);
      // The optimizer's weights stay fp32 (not rounded); what the forward reads is their bf16 rounding.
      CHECK(at::allclose(sharded[rank].model_state[i], reference[0].weights[i], 1.3e-6, 1e-5));
      CHECK(at::equal(sharded[rank].weights[i], reference[0].weights[i].to(at::kBFloat16).to(at::kFloat)));
      CHECK(at::allclose(sharded[rank].ema[i], reference[rank].ema[i], 1.3e-6, 1e-5));
    }
  }
  // The rounding changes the numbers: the same training with fp32 gathers ends elsewhere.
  setup.gather = runner::dist::WeightGather::fp32;
  const std::vector<Trained> exact = train(setup);
  CHECK_FALSE(at::allclose(exact[0].model_state[0], sharded[0].model_state[0], 1e-4, 1e-5));
}

TEST_CASE("sharded data parallel: bf16 gathers need shard = weights", "[dist]") {
  Setup setup;
  setup.shard = ShardMode::gradients;
  setup.gather = runner::dist::WeightGather::bf16;
  CHECK_THROWS_WITH(train(setup),
                    Catch::Contains("shard_gather = \"bf16\" needs shard = \"weights\" (the other modes keep each "
                                    "rank's own rows of the weights in the model, which a gather in another dtype "
                                    "would round)"));
  CHECK_THROWS_WITH(runner::dist::parse_weight_gather("fp16"),
                    "shard_gather must be \"fp32\" or \"bf16\", got \"fp16\"");
}

TEST_CASE("sharded data parallel: a non-finite loss on one rank skips the step on every rank", "[dist]") {
  const ShardMode mode = GENERATE(ShardMode::optimizer, ShardMode::gradients, ShardMode::weights);
  INFO("shard " << runner::dist::shard_mode_name(mode));
  Setup setup;
  setup.steps = 4;
  setup.nan_step = 2;
  const std::vector<Trained> reference = train(setup);
  REQUIRE(reference[0].skipped == 1);
  setup.shard = mode;
  const std::vector<Trained> sharded = train(setup);
  CHECK(sharded[0].skipped == 1);
  check_same_training(sharded, reference);
}

TEST_CASE("process group: all_gather_into and reduce_scatter_into over Gloo", "[dist]") {
  const int ranks = GENERATE(2, 3);
  INFO(ranks << " ranks");
  runner::test::on_ranks(ranks, [&](runner::dist::ProcessGroup& group, int rank) {
    for (std::int64_t numel : {1, 7, 30}) {
      const at::Tensor mine = at::arange(numel, at::kFloat) + 100.0 * rank;
      at::Tensor all = at::empty({ranks * numel}, at::kFloat);
      group.all_gather_into(all, mine, "test all_gather");
      for (int r = 0; r < ranks; ++r)
        if (!at::equal(all.narrow(0, r * numel, numel), at::arange(numel, at::kFloat) + 100.0 * r))
          throw std::logic_error("all_gather_into: slice " + std::to_string(r) + " wrong");
      const at::Tensor input = at::arange(ranks * numel, at::kFloat) * (rank + 1);
      at::Tensor out = at::empty({numel}, at::kFloat);
      group.reduce_scatter_into(out, input, "test reduce_scatter");
      const double factor = ranks * (ranks + 1) / 2.0;
      if (!at::equal(out, at::arange(rank * numel, (rank + 1) * numel, at::kFloat) * factor))
        throw std::logic_error("reduce_scatter_into: wrong sum");
    }
  });
}

TEST_CASE("sharded data parallel: each rank saves its rows, and 1, 2 or 3 ranks restore them as saved", "[dist]") {
  runner::testing::TempDir run_dir("sharded-checkpoint");
  const std::string checkpoint = run_dir.path + "/" + runner::ckpt::checkpoint_path(3);
  const ShardMode saved_mode = GENERATE(ShardMode::gradients, ShardMode::weights);
  const bool weights = saved_mode == ShardMode::weights;
  INFO("saved with shard " << runner::dist::shard_mode_name(saved_mode));
  Setup setup;
  setup.shard = saved_mode;
  std::vector<std::pair<std::string, at::Tensor>> saved_optimizer;
  std::vector<at::Tensor> saved_ema, saved_weights;
  runner::test::on_ranks(2, [&](runner::dist::ProcessGroup& group, int rank) {
    Model model = make_model();
    const auto trainer = make_trainer(setup, model, group);
    for (int step = 0; step < 3; ++step)
      trainer->step([&](std::int64_t, std::int64_t) { return loss_of(model, rank * kBatch / 2, kBatch / 2); });
    const auto optimizer_state = trainer->full_optimizer_state();
    const auto ema = trainer->full_ema_shadow(0);
    const auto whole = model.whole_weights();
    if (rank == 0) {
      saved_optimizer = optimizer_state;
      saved_ema = ema;
      saved_weights = whole;
      auto snapshot = runner::run::snapshot_training(*trainer, nullptr, nullptr, {}, run_dir.path, 3);
      snapshot.wait_ready();
      runner::ckpt::write_checkpoint(run_dir.path, 3, snapshot.files, snapshot.manifest_extra);
    } else {
      runner::ckpt::StagedFileWriter writer(run_dir.path);
      auto snapshot = runner::run::snapshot_rank_shard(*trainer);
      writer.submit(3, std::move(snapshot.files), snapshot.wait_ready);
      writer.wait();
      for (const std::string& error : writer.take_errors()) throw std::runtime_error(error);
    }
  });
  // Rank 1's rows came through its staging folder, which is gone once they moved in.
  CHECK(names_in(run_dir.path + "/checkpoints") == std::vector<std::string>{"step-0000003"});
  // Sharded over the weights, the rank files hold the model's rows too: no rank holds it whole.
  std::vector<std::string> files{"manifest.json", "model.safetensors", "shard-0-of-2.safetensors",
                                 "shard-1-of-2.safetensors", "trainer.safetensors"};
  if (weights) files.erase(files.begin() + 1);
  CHECK(names_in(checkpoint) == files);
  // Each rank's file holds its rows only: 5 rows of blocks.0.weight split 3 and 2.
  const runner::ckpt::SafetensorsFile rank1(checkpoint + "/shard-1-of-2.safetensors");
  REQUIRE(rank1.find("ema/blocks.0.weight") != nullptr);
  CHECK(rank1.find("ema/blocks.0.weight")->shape == std::vector<std::int64_t>{2, 4});
  CHECK((rank1.find("model/blocks.0.weight") != nullptr) == weights);
  if (weights) CHECK(rank1.find("model/blocks.0.weight")->shape == std::vector<std::int64_t>{2, 4});

  SECTION("consolidated, the files are those unsharded training saves") {
    const std::vector<std::string> written = runner::ckpt::write_consolidated(checkpoint, run_dir.path + "/whole");
    CHECK(written == (weights ? std::vector<std::string>{"model.safetensors", "optimizer.safetensors",
                                                         "ema.safetensors", "trainer.safetensors"}
                              : std::vector<std::string>{"optimizer.safetensors", "ema.safetensors",
                                                         "model.safetensors", "trainer.safetensors"}));
    const auto model = runner::ckpt::load_safetensors(run_dir.path + "/whole/model.safetensors");
    REQUIRE(model.tensors.size() == saved_weights.size());
    for (std::size_t i = 0; i < saved_weights.size(); ++i) CHECK(at::equal(model.tensors[i].tensor, saved_weights[i]));
    const auto optimizer = runner::ckpt::load_safetensors(run_dir.path + "/whole/optimizer.safetensors");
    REQUIRE(optimizer.tensors.size() == saved_optimizer.size());
    for (std::size_t i = 0; i < saved_optimizer.size(); ++i) {
      INFO(saved_optimizer[i].first);
      CHECK(optimizer.tensors[i].name == saved_optimizer[i].first);
      CHECK(at::equal(optimizer.tensors[i].tensor, saved_optimizer[i].second));
    }
    CHECK(optimizer.metadata.count("hyperparameters") == 1);
    const auto ema = runner::ckpt::load_safetensors(run_dir.path + "/whole/ema.safetensors");
    for (std::size_t i = 0; i < saved_ema.size(); ++i) CHECK(at::equal(ema.tensors[i].tensor, saved_ema[i]));
    CHECK_THROWS_WITH(runner::ckpt::write_consolidated(checkpoint, run_dir.path + "/whole"),
                      Catch::Contains("/whole: exists; nothing was written"));
  }

  SECTION("restored at another world size and mode, every tensor is the one saved") {
    const int ranks = GENERATE(1, 2, 3);
    Setup restored;
    restored.ranks = ranks;
    // Each mode restores each: saved with gradients, restored as weights at 2 ranks; saved with weights, restored
    // as optimizer at 2 and weights at 3.
    restored.shard = ranks == 1   ? ShardMode::none
                     : ranks == 2 ? (weights ? ShardMode::optimizer : ShardMode::weights)
                                  : (weights ? ShardMode::weights : ShardMode::gradients);
    // Over the weights at 3 ranks with bf16 gathers: the forward reads the saved weights rounded, the optimizer
    // steps the saved ones.
    if (ranks == 3 && restored.shard == ShardMode::weights) restored.gather = runner::dist::WeightGather::bf16;
    const bool rounded = restored.gather == runner::dist::WeightGather::bf16;
    INFO(ranks << " ranks, shard " << runner::dist::shard_mode_name(restored.shard) << ", rounded " << rounded);
    runner::test::on_ranks(ranks, [&](runner::dist::ProcessGroup& group, int rank) {
      Model model = make_model();
      const auto trainer = make_trainer(restored, model, group);
      if (runner::run::restore_training(checkpoint, *trainer, rank, ranks).step != 3)
        throw std::logic_error("restored another step");
      const auto optimizer_state = trainer->full_optimizer_state();
      const auto ema = trainer->full_ema_shadow(0);
      for (std::size_t i = 0; i < saved_optimizer.size(); ++i)
        if (optimizer_state.at(i).first != saved_optimizer[i].first ||
            !at::equal(optimizer_state[i].second, saved_optimizer[i].second))
          throw std::logic_error("restored optimizer state differs: " + saved_optimizer[i].first);
      for (std::size_t i = 0; i < saved_ema.size(); ++i)
        if (!at::equal(ema.at(i), saved_ema[i])) throw std::logic_error("restored EMA differs: " + std::to_string(i));
      const std::vector<at::Tensor> whole = model.whole_weights();
      const auto state = trainer->full_model_state();
      for (std::size_t i = 0; i < saved_weights.size(); ++i) {
        const at::Tensor read = rounded ? saved_weights[i].to(at::kBFloat16).to(at::kFloat) : saved_weights[i];
        if (!at::equal(whole.at(i), read) || !at::equal(state.at(i).second, saved_weights[i]))
          throw std::logic_error("restored weights differ: " + std::to_string(i));
      }
    });
  }

  SECTION("a missing rank file is named") {
    REQUIRE(::rename((checkpoint + "/shard-1-of-2.safetensors").c_str(), (run_dir.path + "/aside").c_str()) == 0);
    runner::test::on_ranks(1, [&](runner::dist::ProcessGroup& group, int) {
      Model model = make_model();
      const auto trainer = make_trainer(Setup{1}, model, group);
      CHECK_THROWS_WITH(runner::run::restore_training(checkpoint, *trainer),
                        Catch::Contains(std::string("/shard-1-of-2.safetensors: missing: the checkpoint was saved by 2 "
                                                    "ranks and this holds rank 1's share of its ") +
                                        (weights ? "weights, " : "") + "optimizer state and EMA"));
    });
    CHECK_THROWS_WITH(runner::ckpt::write_consolidated(checkpoint, run_dir.path + "/whole"),
                      Catch::Contains("shard-1-of-2.safetensors: missing"));
    CHECK(!std::filesystem::exists(run_dir.path + "/whole"));
  }
}

TEST_CASE("sharded data parallel over the weights: tied weights in a released group are refused", "[dist]") {
  runner::test::on_ranks(2, [&](runner::dist::ProcessGroup& group, int) {
    const at::Tensor shared = at::ones({4, 3}).requires_grad_(true);
    const at::Tensor tied = shared.detach().view({3, 4}).requires_grad_(true);  // another tensor, the same storage
    try {
      runner::dist::ParameterShards shards(group, {{"blocks.0.weight", shared}, {"head.weight", tied}},
                                           ShardMode::weights, runner::dist::ShardOptions{true, {"blocks.0"}});
    } catch (const std::invalid_argument& error) {
      if (std::string(error.what()) !=
          "sharded data parallel over the weights: 'blocks.0.weight' and 'head.weight' share their storage (tied "
          "weights), which a group's release would free for both")
        throw std::logic_error(std::string("another error: ") + error.what());
      return;
    }
    throw std::logic_error("tied weights were accepted");
  });
}
