// A two-layer model trained through runtime/run without Lua: start, steps, checkpoints, rotation, restore
// into a fresh trainer and loader (bit-identical continuation), a graceful stop, and the launch context.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <memory>
#include <cstdlib>
#include <string>
#include <tuple>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/launch_context.h"
#include "runtime/data/datasets.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_store.h"
#include "runtime/run/checkpoint_format.h"
#include "runtime/run/run_start.h"
#include "runtime/run/trainer_observers.h"
#include "runtime/run/training_run.h"
#include "runtime/train/progress_observer.h"
#include "tests/cpp/temp_directory.h"
#include "tests/cpp/test_index_location.h"

namespace {

using namespace runner;
using Catch::Contains;

// Two linear layers with their parameters named as a state dict names them.
struct TwoLayers {
  torch::nn::Linear first{4, 8}, second{8, 1};
  train::TrainerModel model() const {
    return {
        {{"0.weight", first->weight}, {"0.bias", first->bias}, {"1.weight", second->weight}, {"1.bias", second->bias}},
        {}};
  }
  at::Tensor forward(const at::Tensor& x) { return second->forward(at::tanh(first->forward(x))); }
};

struct Setup {
  TwoLayers net;
  std::shared_ptr<train::Trainer> trainer;
  std::shared_ptr<data::Loader> loader;
  explicit Setup(uint64_t seed, train::StepOptions step_options = {}) {
    at::manual_seed(seed);
    net = TwoLayers();
    train::ParamGroup group = train::default_param_group(train::OptimizerKind::adamw);
    group.lr = 1e-2;
    for (const auto& [name, p] : net.model().parameters) group.params.push_back(p);
    auto optimizer =
        std::make_shared<train::Optimizer>(train::OptimizerKind::adamw, std::vector<train::ParamGroup>{group});
    train::EmaOptions ema;
    ema.decay = 0.9;
    trainer =
        std::make_shared<train::Trainer>(net.model(), optimizer, train::LrScheduleOptions{},
                                         std::vector<train::EmaOptions>{ema}, step_options, c10::Device(c10::kCPU));
    data::LoaderOptions options;
    options.batch = 4;
    options.workers = 0;
    options.seed = 7;
    loader = std::make_shared<data::Loader>(data::make_shapes({.size = 8, .count = 64, .seed = 3}), options);
  }
  // One step on the loader's next batch: fit the mean pixel of a 4-pixel patch.
  void step() {
    const data::Batch batch = loader->next();
    const at::Tensor x = batch.data.reshape({batch.data.size(0), -1}).narrow(1, 0, 4);
    const at::Tensor y = x.mean(1, true);
    trainer->step([&](int64_t, int64_t) { return (net.forward(x) - y).pow(2).mean(); });
  }
};

run::StartRequest request(const std::string& name) {
  run::StartRequest r;
  r.script = "experiments/two_layers.lua";
  r.script_text = "-- two layers\n";
  r.name = name;
  r.config = {{"lr", 0.01}};
  r.seed = 5;
  r.resume = false;
  r.writer.flush_interval_seconds = 0.05;
  return r;
}

run::CheckpointPolicy keep_two() {
  run::CheckpointPolicy policy;
  policy.rotation.keep_last = 2;
  return policy;
}

std::vector<at::Tensor> weights(const Setup& setup) {
  std::vector<at::Tensor> list;
  for (const auto& [name, p] : setup.net.model().parameters) list.push_back(p.detach().clone());
  return list;
}

}  // namespace

TEST_CASE("a training run checkpoints, rotates and restores into a fresh trainer bit for bit", "[run]") {
  testing::TempDir tmp("training-run");
  const std::string home = tmp.path + "/home";
  core::LaunchContext launch;

  // Straight through: 12 steps.
  Setup straight(1);
  for (int i = 0; i < 12; ++i) straight.step();

  // Interrupted: 8 steps with checkpoints every 2, then a fresh process continues from the newest.
  {
    Setup first(1);
    auto context = run::start_run(request("two-layers"), testing::launch_at(home, launch));
    run::TrainingRun training(
        *context, first.trainer, first.loader,
        [] {
          return nlohmann::json{{"counter", {{"n", 3}}}};
        },
        keep_two());
    CHECK_FALSE(training.restore());
    for (int i = 0; i < 8; ++i) {
      first.step();
      CHECK(context->step() == i + 1);
      if (context->step() % 2 == 0) training.checkpoint({std::nullopt, std::nullopt, /*wait=*/true});
    }
    training.finish();
    context->finish("interrupted", "stopped by the test");
    // Rotation kept the newest two: steps 6 and 8.
    index::Database db = index::open_index_for_reading(runner::testing::index_at(home));
    auto kept = db.prepare("SELECT step FROM checkpoints WHERE kept = 1 ORDER BY step");
    std::vector<int64_t> steps;
    while (kept.step()) steps.push_back(kept.integer(0));
    CHECK(steps == std::vector<int64_t>{6, 8});
    // The dropped ones are forgotten with their files: `runner gc` finds nothing of them to delete.
    auto all = db.prepare("SELECT count(*) FROM checkpoints");
    REQUIRE(all.step());
    CHECK(all.integer(0) == 2);
    CHECK_FALSE(std::filesystem::exists(context->directory() + "/checkpoints/step-0000004"));
    CHECK(std::filesystem::exists(context->directory() + "/checkpoints/step-0000008/model.safetensors"));
  }
  Setup second(99);  // other initial weights: everything must come from the checkpoint
  run::StartRequest again = request("");
  again.resume = std::string("two-layers");
  auto context = run::start_run(again, testing::launch_at(home, launch));
  CHECK(context->resumed());
  CHECK(context->seed() == 5);
  run::TrainingRun training(*context, second.trainer, second.loader, nullptr, keep_two());
  const auto restored = training.restore();
  REQUIRE(restored);
  CHECK(restored->step == 8);
  CHECK(restored->named_state == nlohmann::json{{"counter", {{"n", 3}}}});
  CHECK(context->step() == 8);
  CHECK(second.loader->position() == 8);
  CHECK(second.trainer->step_count() == 8);
  for (int i = 0; i < 4; ++i) second.step();
  const auto expected = weights(straight), got = weights(second);
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(at::equal(expected[i], got[i]));
  CHECK(at::equal(straight.trainer->emas()[0].shadow()[0], second.trainer->emas()[0].shadow()[0]));
  training.finish();
  context->finish("finished");
}

TEST_CASE("a stop request is taken before the next step: a checkpoint, the run interrupted, a request to exit",
          "[run]") {
  testing::TempDir tmp("training-run");
  const std::string home = tmp.path + "/home";
  Setup setup(2);
  auto context = run::start_run(request("stopped"), testing::launch_at(home, core::LaunchContext{}));
  run::TrainingRun training(*context, setup.trainer, setup.loader, nullptr, keep_two());
  setup.step();
  REQUIRE(core::graceful_stop_enabled());
  REQUIRE(core::request_stop(SIGTERM));
  int status = -1;
  try {
    setup.step();
  } catch (const core::ExitRequest& request) {
    status = request.status;
    CHECK_THAT(request.what(), Contains("stopped by SIGTERM at step 1 after saving a checkpoint"));
  }
  core::set_graceful_stop(false);
  CHECK(status == core::kExitOk);
  CHECK(context->record().status == "interrupted");
  CHECK(setup.trainer->step_count() == 1);  // the second step never started
  CHECK(std::filesystem::exists(context->directory() + "/checkpoints/step-0000001/trainer.safetensors"));
}

TEST_CASE("rotation drops a checkpoint's row before its files: one it cannot delete is no longer listed", "[run]") {
  testing::TempDir tmp("training-run");
  const std::string home = tmp.path + "/home";
  Setup setup(4);
  auto context = run::start_run(request("undeletable"), testing::launch_at(home, core::LaunchContext{}));
  run::CheckpointPolicy keep_one;
  keep_one.rotation.keep_last = 1;
  run::TrainingRun training(*context, setup.trainer, setup.loader, nullptr, keep_one);
  setup.step();
  training.checkpoint({std::nullopt, std::nullopt, /*wait=*/true});
  // An immutable file (chattr +i binds root too) makes the first checkpoint's deletion fail part way.
  const std::string pinned = context->directory() + "/checkpoints/step-0000001/trainer.safetensors";
  if (std::system(("chattr +i '" + pinned + "' 2>/dev/null").c_str()) != 0) {
    WARN("SKIP: chattr +i does not work on " << tmp.path << " (a file system without immutable files)");
    training.finish();
    context->finish("finished");
    return;
  }
  struct Unpin {
    std::string path;
    ~Unpin() { [[maybe_unused]] const int status = std::system(("chattr -i '" + path + "'").c_str()); }
  } unpin{pinned};
  setup.step();
  CHECK_NOTHROW(training.checkpoint({std::nullopt, std::nullopt, /*wait=*/true}));  // the save itself succeeded
  index::Database db = index::open_index_for_reading(runner::testing::index_at(home));
  auto rows = db.prepare("SELECT step, path, kept FROM checkpoints ORDER BY step");
  std::vector<std::tuple<int64_t, std::string, int64_t>> listed;
  while (rows.step()) listed.emplace_back(rows.integer(0), rows.text(1), rows.integer(2));
  REQUIRE(listed.size() == 2);
  CHECK(std::get<2>(listed[0]) == 0);  // step 1: no longer kept, though some of its files are left
  CHECK(std::get<2>(listed[1]) == 1);
  CHECK(std::filesystem::exists(pinned));
  // Every checkpoint the index keeps is whole.
  for (const auto& record : index::checkpoints(db, context->record().run)) {
    if (!record.kept) continue;
    std::vector<ckpt::CheckpointFileRecord> files;
    for (const auto& f : record.files) files.push_back({f.name, f.bytes, f.hash});
    CHECK(ckpt::verify_checkpoint(context->directory(), record.path, files).empty());
  }
  training.finish();
  context->finish("finished");
}

TEST_CASE("a snapshot holds the checkpoint's four files, and the loader state reads back", "[run]") {
  Setup setup(3);
  const run::TrainingSnapshot snapshot = run::snapshot_training(*setup.trainer, setup.loader.get(), nullptr);
  REQUIRE(snapshot.files.size() == 4);
  CHECK(snapshot.files[0].name == "model.safetensors");
  CHECK(snapshot.files[1].name == "ema.safetensors");
  CHECK(snapshot.files[2].name == "optimizer.safetensors");
  CHECK(snapshot.files[3].name == "trainer.safetensors");
  CHECK(data::loader_state_from_json(data::loader_state_json(setup.loader->state()), "here").seed == 7);
  CHECK(data::loader_state_from_json(
            {{"seed", "18446744073709551615"}, {"position", 2}, {"dataset_size", 64}, {"batch", 4}}, "old")
            .seed == 18446744073709551615ULL);
  CHECK_THROWS_WITH(data::loader_state_from_json({{"seed", 1}}, "x.safetensors"),
                    Contains("x.safetensors: the loader state lacks 'position'"));
}

TEST_CASE("a checkpoint of another model is refused before anything changes", "[run]") {
  testing::TempDir tmp("training-run");
  // The source trained longer from other weights: every tensor and counter it saved differs from the target's.
  Setup source(4);
  for (int i = 0; i < 5; ++i) source.step();
  Setup target(3);
  for (int i = 0; i < 2; ++i) target.step();

  // The source's checkpoint with its model file edited into another model's; the other files fit the target,
  // so only the model check stands between them and the target's state.
  auto write_checkpoint = [&](const std::string& name,
                              const std::function<void(std::vector<ckpt::NamedTensor>&)>& edit) {
    const std::string dir = tmp.path + "/" + name;
    std::filesystem::create_directories(dir);
    for (auto& file : run::snapshot_training(*source.trainer, source.loader.get(), nullptr).files) {
      if (file.name == "model.safetensors") edit(file.tensors);
      ckpt::save_safetensors(dir + "/" + file.name, file.tensors, file.metadata);
    }
    return dir;
  };
  auto without = [](const std::string& name) {
    return [name](std::vector<ckpt::NamedTensor>& tensors) {
      std::erase_if(tensors, [&](const ckpt::NamedTensor& t) { return t.name == name; });
    };
  };
  const std::string missing = write_checkpoint("missing", without("1.bias"));
  const std::string extra = write_checkpoint("extra", [](std::vector<ckpt::NamedTensor>& tensors) {
    tensors.push_back({"2.weight", at::ones({1, 1})});
  });
  const std::string reshaped = write_checkpoint("reshaped", [&](std::vector<ckpt::NamedTensor>& tensors) {
    without("1.weight")(tensors);
    tensors.push_back({"1.weight", at::ones({1, 6})});
  });
  // Each odd tensor comes after some that fit: a restore that copied while it checked would change the target.
  std::vector<std::string> order;
  for (const auto& [name, p] : target.net.model().parameters) order.push_back(name);
  REQUIRE(order == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"});

  struct State {
    std::vector<at::Tensor> weights, ema;
    std::vector<std::pair<std::string, at::Tensor>> optimizer;
    nlohmann::json hyperparameters;
    int64_t step;
    at::Tensor skipped;
  };
  auto state_of = [](const Setup& setup) {
    State state{weights(setup),
                {},
                {},
                setup.trainer->optimizer().hyperparameters(),
                setup.trainer->step_count(),
                setup.trainer->skipped().clone()};
    for (const auto& t : setup.trainer->emas()[0].shadow()) state.ema.push_back(t.clone());
    for (const auto& [name, t] : setup.trainer->optimizer().state_tensors())
      state.optimizer.emplace_back(name, t.clone());
    return state;
  };
  // What differs between two states: "" when everything is bit for bit the same.
  auto differences = [](const State& a, const State& b) {
    auto same = [](const std::vector<at::Tensor>& x, const std::vector<at::Tensor>& y) {
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!at::equal(x[i], y[i])) return false;
      return true;
    };
    bool same_optimizer = a.optimizer.size() == b.optimizer.size();
    for (std::size_t i = 0; same_optimizer && i < a.optimizer.size(); ++i)
      same_optimizer =
          a.optimizer[i].first == b.optimizer[i].first && at::equal(a.optimizer[i].second, b.optimizer[i].second);
    std::string text;
    if (!same(a.weights, b.weights)) text += " weights";
    if (!same(a.ema, b.ema)) text += " ema";
    if (!same_optimizer) text += " optimizer-state";
    if (a.hyperparameters != b.hyperparameters) text += " optimizer-hyperparameters";
    if (a.step != b.step) text += " step";
    if (!at::equal(a.skipped, b.skipped)) text += " skipped";
    return text;
  };
  const State before = state_of(target);
  REQUIRE(before.optimizer.size() == 12);  // step, exp_avg, exp_avg_sq of each parameter
  const State saved = state_of(source);
  CHECK(differences(before, saved) == " weights ema optimizer-state optimizer-hyperparameters step");

  using Catch::Matchers::Message;
  CHECK_THROWS_MATCHES(
      run::restore_training(missing, *target.trainer), std::invalid_argument,
      Message(missing + "/model.safetensors: the weights do not fit the trainer's model: missing keys: 1.bias"));
  CHECK(differences(state_of(target), before) == "");
  CHECK_THROWS_MATCHES(
      run::restore_training(extra, *target.trainer), std::invalid_argument,
      Message(extra + "/model.safetensors: the weights do not fit the trainer's model: unexpected keys: 2.weight"));
  CHECK(differences(state_of(target), before) == "");
  CHECK_THROWS_MATCHES(
      run::restore_training(reshaped, *target.trainer), std::invalid_argument,
      Message(reshaped + "/model.safetensors: the weights do not fit the trainer's model: shape mismatch for 1.weight: "
                         "state has [1, 6], module has [1, 8]"));
  CHECK(differences(state_of(target), before) == "");

  const std::string doubled = write_checkpoint("doubled", [&](std::vector<ckpt::NamedTensor>& tensors) {
    for (auto& t : tensors)
      if (t.name == "1.weight") t.tensor = t.tensor.to(at::kDouble);
  });
  CHECK_THROWS_WITH(run::restore_training(doubled, *target.trainer),
                    Catch::Contains("1.weight") && Catch::Contains("Double"));
  CHECK(differences(state_of(target), before) == "");
  // The trainer's record of the checkpoint: without a step, or with another number of EMAs, it is refused whole.
  auto write_trainer_state = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = write_checkpoint(name, [](std::vector<ckpt::NamedTensor>&) {});
    ckpt::SafetensorsContents trainer_file = ckpt::load_safetensors(dir + "/trainer.safetensors");
    nlohmann::json state = nlohmann::json::parse(trainer_file.metadata.at("trainer"));
    edit(state);
    trainer_file.metadata["trainer"] = state.dump();
    ckpt::save_safetensors(dir + "/trainer.safetensors", trainer_file.tensors, trainer_file.metadata);
    return dir;
  };
  const std::string stepless = write_trainer_state("stepless", [](nlohmann::json& state) { state.erase("step"); });
  CHECK_THROWS_MATCHES(run::restore_training(stepless, *target.trainer), std::invalid_argument,
                       Message(stepless + "/trainer.safetensors: the step is missing"));
  const std::string two_emas =
      write_trainer_state("two-emas", [](nlohmann::json& state) { state["emas"].push_back(state["emas"][0]); });
  CHECK_THROWS_MATCHES(run::restore_training(two_emas, *target.trainer), std::invalid_argument,
                       Message(two_emas + ": the checkpoint has 2 EMA averages, the trainer 1"));
  CHECK(differences(state_of(target), before) == "");

  // The same checkpoint with its own model file restores, and the comparison sees everything it brings.
  const std::string intact = write_checkpoint("intact", [](std::vector<ckpt::NamedTensor>&) {});
  CHECK(run::restore_training(intact, *target.trainer).step == 5);
  CHECK(differences(state_of(target), saved) == "");
}

TEST_CASE("the launch context reads torchrun's and Slurm's variables and refuses bad ones", "[run]") {
  const core::LaunchContext torchrun = core::launch_context_from_environment({{"RANK", "3"},
                                                                              {"WORLD_SIZE", "8"},
                                                                              {"LOCAL_RANK", "1"},
                                                                              {"LOCAL_WORLD_SIZE", "4"},
                                                                              {"MASTER_ADDR", "node0"},
                                                                              {"MASTER_PORT", "29500"},
                                                                              {"SLURM_PROCID", "5"},
                                                                              {"RUNNER_SWEEP", "2"},
                                                                              {"RUNNER_TRIAL", "11"}});
  CHECK(torchrun.rank == 3);
  CHECK(torchrun.world_size == 8);
  CHECK(torchrun.local_rank == 1);
  CHECK(torchrun.local_world_size == 4);
  CHECK(torchrun.master_addr == "node0");
  CHECK(torchrun.master_port == 29500);
  CHECK(torchrun.sweep == 2);
  CHECK(torchrun.trial == 11);
  const core::LaunchContext slurm =
      core::launch_context_from_environment({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}});
  CHECK(slurm.rank == 2);
  CHECK(slurm.world_size == 4);
  const core::LaunchContext slurm_job =
      core::launch_context_from_environment({{"SLURM_PROCID", "1"},
                                             {"SLURM_NTASKS", "8"},
                                             {"SLURM_JOB_NODELIST", "gpu[003-006,9],cpu1"},
                                             {"SLURM_JOB_ID", "123456"}});
  CHECK(slurm_job.master_addr == "gpu003");
  CHECK(slurm_job.master_port == 20000 + 123456 % 20000);
  CHECK(core::first_slurm_host("node7,node8") == "node7");
  CHECK(core::first_slurm_host("single") == "single");
  CHECK(core::first_slurm_host("n[12,14]") == "n12");
  const core::LaunchContext single = core::launch_context_from_environment(std::map<std::string, std::string>{});
  CHECK_FALSE(single.distributed());
  CHECK_THROWS_WITH(core::launch_context_from_environment({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
                    "rank 4 is not below the world size 4 (RANK / WORLD_SIZE)");
  CHECK_THROWS_WITH(core::launch_context_from_environment({{"WORLD_SIZE", "two"}}),
                    "environment variable WORLD_SIZE='two' is not a whole number");
}

TEST_CASE("the launch context carries the index's location and the collective timeout", "[run]") {
  const core::LaunchContext unset = core::launch_context_from_environment(std::map<std::string, std::string>{});
  CHECK(unset.home == "runs");
  CHECK(unset.index_url == "");
  CHECK(unset.dist_timeout_seconds == 300);
  const core::LaunchContext given = core::launch_context_from_environment({{"RUNNER_HOME", "/data/experiments//"},
                                                                           {"RUNNER_INDEX", "postgresql://u@db:5432/x"},
                                                                           {"RUNNER_DIST_TIMEOUT", "42.5"}});
  CHECK(given.dist_timeout_seconds == 42.5);
  const index::IndexLocation where = index::index_location(given);
  CHECK(where.home == "/data/experiments");
  CHECK(where.url == "postgresql://u@db:5432/x");
  CHECK(where.shown() == "postgresql://u@db:5432/x");
  CHECK(index::index_location(unset).shown() == "runs/index.db");
  CHECK_THROWS_WITH(core::launch_context_from_environment({{"RUNNER_DIST_TIMEOUT", "5m"}}),
                    "RUNNER_DIST_TIMEOUT='5m' is not a number of seconds > 0");
  core::LaunchContext wrong = unset;
  wrong.index_url = "mysql://u:secret@db/x";
  CHECK_THROWS_WITH(index::index_location(wrong),
                    "RUNNER_INDEX / --index 'mysql://u:***@db/x' is not a postgresql:// URL (leave it unset for the "
                    "SQLite index in RUNNER_HOME)");
}

TEST_CASE("the launch context names the REPL's history file and whether a launcher set RANK / WORLD_SIZE", "[run]") {
  const core::LaunchContext plain = core::launch_context_from_environment({{"HOME", "/home/ada"}});
  CHECK(plain.repl_history == "/home/ada/.runner_history");
  CHECK_FALSE(plain.rank_variables);
  CHECK(plain.profile.empty());  // a command line fact (--profile), never the environment's
  CHECK(core::launch_context_from_environment({{"HOME", "/home/ada"}, {"RUNNER_HISTORY", "/tmp/h"}}).repl_history ==
        "/tmp/h");
  CHECK(core::launch_context_from_environment({{"HOME", "/home/ada"}, {"RUNNER_HISTORY", ""}}).repl_history.empty());
  CHECK(core::launch_context_from_environment(std::map<std::string, std::string>{}).repl_history.empty());
  CHECK(core::launch_context_from_environment({{"RANK", "0"}}).rank_variables);
  CHECK(core::launch_context_from_environment({{"WORLD_SIZE", "1"}}).rank_variables);
  CHECK_FALSE(core::launch_context_from_environment({{"SLURM_PROCID", "0"}}).rank_variables);
}

TEST_CASE("a run pauses at the ASHA rung of the launch context it was started with, not the process's", "[run]") {
  testing::TempDir tmp("run-pause");
  const std::string home = tmp.path + "/home";
  core::LaunchContext launch;
  launch.sweep_pause = core::SweepPause{"loss", 4};
  REQUIRE_FALSE(core::launch_context().sweep_pause);  // the process's context has no rung
  auto paused = run::start_run(request("paused"), testing::launch_at(home, launch));
  paused->log_metric("loss", 3, 0.5, 0.0);
  CHECK_FALSE(paused->pause_due());
  paused->log_metric("other", 4, 0.5, 0.0);
  CHECK_FALSE(paused->pause_due());
  paused->log_metric("loss", 4, 0.5, 0.0);
  CHECK(paused->pause_due());
  paused->finish("finished");
  auto unpaused = run::start_run(request("unpaused"), testing::launch_at(home, core::LaunchContext{}));
  unpaused->log_metric("loss", 100, 0.5, 0.0);
  CHECK_FALSE(unpaused->pause_due());
  unpaused->finish("finished");
}

TEST_CASE("the steps of a training run from C++ alone: the run's step, lr and timing metrics, the progress line",
          "[run]") {
  testing::TempDir tmp("observed-steps");
  const std::string home = tmp.path + "/home";
  core::LaunchContext launch;
  train::StepOptions options;
  options.steps = 30;
  Setup setup(1, options);
  const std::string progress_path = tmp.path + "/progress.txt";
  std::FILE* progress_file = std::fopen(progress_path.c_str(), "w");
  REQUIRE(progress_file != nullptr);
  train::ProgressOptions progress;
  progress.total_steps = 30;
  progress.batch = 4;
  progress.line_seconds = 1e9;  // plain lines: the first and the last step
  // The trainer's observers, installed once: the step metrics go to the attached training run's run.
  run::TrainerObservers::of(*setup.trainer)->show_progress(progress, progress_file);
  auto context = run::start_run(request("observed"), testing::launch_at(home, launch));
  {
    run::TrainingRun training(*context, setup.trainer, setup.loader, {}, keep_two());
    for (int i = 0; i < 30; ++i) setup.step();
    CHECK(context->step() == 30);
    training.finish();
  }
  context->finish("finished", std::nullopt);
  std::fclose(progress_file);

  // time/<part>_ms: the means over steps 1-25, then over 26-30 (the last step), for each part of the step.
  index::Database db = index::open_index_for_reading(runner::testing::index_at(home));
  auto logged = db.prepare("SELECT key, step FROM metrics WHERE run = ? AND key LIKE 'time/%' ORDER BY key, step");
  logged.bind(1, context->record().run);
  std::vector<std::string> rows;
  while (logged.step()) rows.push_back(logged.text(0) + "@" + std::to_string(logged.integer(1)));
  CHECK(rows == std::vector<std::string>{"time/batch_wait_ms@25", "time/batch_wait_ms@30", "time/between_steps_ms@25",
                                         "time/between_steps_ms@30", "time/ema_ms@25", "time/ema_ms@30",
                                         "time/forward_backward_ms@25", "time/forward_backward_ms@30",
                                         "time/optimizer_ms@25", "time/optimizer_ms@30"});
  // lr at every step.
  auto lr = db.prepare("SELECT count(*), min(value), max(value) FROM metrics WHERE run = ? AND key = 'lr'");
  lr.bind(1, context->record().run);
  REQUIRE(lr.step());
  CHECK(lr.integer(0) == 30);
  CHECK(lr.real(1) == 1e-2);
  CHECK(lr.real(2) == 1e-2);
  auto forward = db.prepare("SELECT value FROM metrics WHERE run = ? AND key = 'time/forward_backward_ms'");
  forward.bind(1, context->record().run);
  while (forward.step()) CHECK(forward.real(0) > 0);

  // The progress line: the first step and the last, with the loss and the learning rate.
  std::ifstream in(progress_path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Contains("step  1/30"));
  CHECK_THAT(text, Contains("step 30/30 100%"));
  CHECK_THAT(text, Contains("loss "));
  CHECK_THAT(text, Contains("lr 1.00e-02"));
}
