// Tests of runtime/train/lr_schedule: golden sequences from PyTorch's schedulers, options, plateau state, describe().
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/train/lr_schedule.h"

using runner::train::LrSchedule;
using runner::train::LrScheduleOptions;

namespace {

// tests/golden/lr_schedules.json, written by tests/golden/lr_schedules.py with Python torch.
const nlohmann::json& golden() {
  static const nlohmann::json document = [] {
    const std::string path = std::string(RUNNER_SOURCE_DIR) + "/tests/golden/lr_schedules.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    return nlohmann::json::parse(in);
  }();
  return document;
}

LrScheduleOptions options_from(const nlohmann::json& j) {
  LrScheduleOptions o;
  for (const auto& [key, value] : j.items()) {
    if (key == "kind")
      o.kind = value.get<std::string>();
    else if (key == "warmup_steps")
      o.warmup_steps = value.get<std::int64_t>();
    else if (key == "warmup_start_factor")
      o.warmup_start_factor = value.get<double>();
    else if (key == "total_steps")
      o.total_steps = value.get<std::int64_t>();
    else if (key == "min_lr_factor")
      o.min_lr_factor = value.get<double>();
    else if (key == "step_size")
      o.step_size = value.get<std::int64_t>();
    else if (key == "gamma")
      o.gamma = value.get<double>();
    else if (key == "milestones")
      o.milestones = value.get<std::vector<std::int64_t>>();
    else if (key == "mode")
      o.mode = value.get<std::string>();
    else if (key == "factor")
      o.factor = value.get<double>();
    else if (key == "patience")
      o.patience = value.get<std::int64_t>();
    else if (key == "threshold")
      o.threshold = value.get<double>();
    else if (key == "threshold_mode")
      o.threshold_mode = value.get<std::string>();
    else if (key == "cooldown")
      o.cooldown = value.get<std::int64_t>();
    else if (key == "eps")
      o.eps = value.get<double>();
    else
      throw std::runtime_error("unknown option in the golden file: " + key);
  }
  return o;
}

bool is_plateau(const nlohmann::json& c) { return c["options"]["kind"] == "plateau"; }

// The factors of steps 0..steps-1, observing the case's metrics after every observe_every-th step (plateau).
// `resume_at` >= 0 moves the schedule to a fresh object through state() as JSON text after that many steps.
std::vector<double> run_case(const nlohmann::json& c, std::int64_t steps, std::int64_t resume_at = -1,
                             const std::function<void(const LrSchedule&)>& at_resume = {}) {
  const LrScheduleOptions options = options_from(c["options"]);
  auto schedule = std::make_unique<LrSchedule>(options);
  const bool plateau = is_plateau(c);
  const std::int64_t every = plateau ? c["observe_every"].get<std::int64_t>() : 0;
  std::size_t observed = 0;
  std::vector<double> factors;
  for (std::int64_t step = 0; step < steps; ++step) {
    if (step == resume_at) {
      if (at_resume) at_resume(*schedule);
      const std::string saved = schedule->state().dump();
      schedule = std::make_unique<LrSchedule>(options);
      schedule->load_state(nlohmann::json::parse(saved));
    }
    factors.push_back(schedule->factor(step));
    if (plateau && (step + 1) % every == 0) schedule->observe(c["metrics"].at(observed++).get<double>());
  }
  return factors;
}

std::string invalid_argument_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument)";
}

std::string option_error(const std::function<void(LrScheduleOptions&)>& change, const std::string& kind) {
  LrScheduleOptions o;
  o.kind = kind;
  change(o);
  return invalid_argument_text([&] { LrSchedule schedule(o); });
}

LrScheduleOptions make(const std::string& kind, const std::function<void(LrScheduleOptions&)>& change = {}) {
  LrScheduleOptions o;
  o.kind = kind;
  if (change) change(o);
  return o;
}

}  // namespace

TEST_CASE("golden file: written by the script with torch 2.11", "[lr_schedule]") {
  const nlohmann::json& g = golden();
  CHECK(g["generated_by"] == "tests/golden/lr_schedules.py");
  CHECK(g["torch"].get<std::string>().rfind("2.11", 0) == 0);
  CHECK(g["cases"].size() >= 10);
  std::set<std::string> kinds;
  for (const auto& c : g["cases"]) kinds.insert(c["options"]["kind"].get<std::string>());
  CHECK(kinds == std::set<std::string>{"constant", "linear", "cosine", "step", "multistep", "exponential", "plateau"});
}

TEST_CASE("every case equals PyTorch's learning rates to 1e-12 relative", "[lr_schedule]") {
  const nlohmann::json& g = golden();
  const std::int64_t steps = g["steps"].get<std::int64_t>();
  for (const auto& c : g["cases"]) {
    INFO("case: " << c["name"].get<std::string>());
    const std::vector<double> expected = c["lrs"].get<std::vector<double>>();
    REQUIRE(static_cast<std::int64_t>(expected.size()) == steps);
    const std::vector<double> got = run_case(c, steps);
    const std::int64_t until = c["pytorch_until"].get<std::int64_t>();
    for (std::int64_t step = 0; step < until; ++step) {
      INFO("step " << step);
      CHECK(got[step] == Approx(expected[step]).epsilon(1e-12));
    }
    // Past T_max PyTorch's cosine rises again; runner holds min_lr_factor.
    if (until == steps) continue;
    CHECK(c["options"]["kind"] == "cosine");
    const double floor = c["options"].value("min_lr_factor", 0.0);
    CHECK(expected[until - 1] == Approx(floor).epsilon(1e-12));
    CHECK(expected[until] > floor + 1e-3);
    for (std::int64_t step = until; step < steps; ++step) {
      INFO("step " << step << " (past T_max)");
      CHECK(got[step] == floor);
    }
  }
}

TEST_CASE("factor() is a pure function of the step for every kind but plateau", "[lr_schedule]") {
  for (const auto& c : golden()["cases"]) {
    if (is_plateau(c)) continue;
    INFO("case: " << c["name"].get<std::string>());
    const LrSchedule schedule(options_from(c["options"]));
    const std::vector<double> forward = run_case(c, 60);
    const std::vector<double> pytorch = c["lrs"].get<std::vector<double>>();  // the factors, as lr is 1
    const std::int64_t until = c["pytorch_until"].get<std::int64_t>();
    REQUIRE(pytorch.size() >= 60);
    for (std::int64_t step = 59; step >= 0; --step) {
      INFO("step " << step);
      CHECK(schedule.factor(step) == forward[step]);
      if (step < until) CHECK(schedule.factor(step) == Approx(pytorch[step]).epsilon(1e-12));
    }
    CHECK(schedule.factor(1000000000000) >= 0.0);
    CHECK(schedule.factor(37) == forward[37]);
  }
}

TEST_CASE("warmup: the default even ramp, the boundary and warmup from 0", "[lr_schedule]") {
  const LrSchedule even(make("constant", [](auto& o) { o.warmup_steps = 3; }));
  CHECK(even.factor(0) == 0.25);  // the first step already learns
  CHECK(even.factor(1) == 0.5);
  CHECK(even.factor(2) == 0.75);
  CHECK(even.factor(3) == 1.0);

  const LrSchedule from_zero(make("linear", [](auto& o) {
    o.total_steps = 4;
    o.warmup_steps = 4;
    o.warmup_start_factor = 0.0;
  }));
  CHECK(from_zero.factor(0) == 0.0);
  CHECK(from_zero.factor(2) == 0.5);
  CHECK(from_zero.factor(3) == 0.75);
  CHECK(from_zero.factor(4) == 1.0);  // the main schedule's step 0
  CHECK(from_zero.factor(5) == 0.75);
  CHECK(from_zero.factor(8) == 0.0);
  CHECK(from_zero.factor(9) == 0.0);

  const LrSchedule one_step(make("exponential", [](auto& o) {
    o.gamma = 0.5;
    o.warmup_steps = 1;
    o.warmup_start_factor = 0.25;
  }));
  CHECK(one_step.factor(0) == 0.25);
  CHECK(one_step.factor(1) == 1.0);
  CHECK(one_step.factor(2) == 0.5);

  const LrSchedule full_start(make("constant", [](auto& o) {
    o.warmup_steps = 3;
    o.warmup_start_factor = 1.0;
  }));
  for (std::int64_t step = 0; step < 5; ++step) CHECK(full_start.factor(step) == 1.0);
}

TEST_CASE("option errors name the option, the value and what is accepted", "[lr_schedule]") {
  using O = LrScheduleOptions;
  CHECK(option_error([](O&) {}, "warmup") ==
        "lr schedule: kind must be one of constant, linear, cosine, step, multistep, exponential, plateau, got "
        "'warmup'");
  CHECK(option_error([](O& o) { o.warmup_steps = -1; }, "constant") ==
        "lr schedule: warmup_steps must be an integer >= 0, got -1");
  CHECK(option_error([](O& o) { o.warmup_start_factor = 1.5; }, "constant") ==
        "lr schedule: warmup_start_factor must be in [0, 1], got 1.5");
  CHECK(option_error([](O& o) { o.warmup_start_factor = -0.25; }, "constant") ==
        "lr schedule: warmup_start_factor must be in [0, 1], got -0.25");
  CHECK(option_error([](O& o) { o.warmup_start_factor = std::nan(""); }, "constant") ==
        "lr schedule: warmup_start_factor must be in [0, 1], got nan");

  CHECK(option_error([](O&) {}, "cosine") ==
        "lr schedule: total_steps is required by the cosine schedule (an integer >= 1)");
  CHECK(option_error([](O& o) { o.total_steps = 0; }, "linear") ==
        "lr schedule: total_steps must be an integer >= 1, got 0");
  CHECK(option_error([](O& o) { o.total_steps = 10; }, "step") ==
        "lr schedule: total_steps does not apply to the step schedule (only to linear, cosine)");
  CHECK(option_error(
            [](O& o) {
              o.total_steps = 10;
              o.min_lr_factor = 1.25;
            },
            "cosine") == "lr schedule: min_lr_factor must be in [0, 1], got 1.25");
  CHECK(option_error([](O& o) { o.min_lr_factor = 0.1; }, "exponential") ==
        "lr schedule: min_lr_factor does not apply to the exponential schedule (only to linear, cosine, plateau)");

  CHECK(option_error([](O&) {}, "step") == "lr schedule: step_size is required by the step schedule (an integer >= 1)");
  CHECK(option_error([](O& o) { o.step_size = 0; }, "step") == "lr schedule: step_size must be an integer >= 1, got 0");
  CHECK(option_error([](O& o) { o.step_size = 5; }, "multistep") ==
        "lr schedule: step_size does not apply to the multistep schedule (only to step)");
  CHECK(option_error(
            [](O& o) {
              o.step_size = 5;
              o.gamma = 1.5;
            },
            "step") == "lr schedule: gamma must be in (0, 1], got 1.5");
  CHECK(option_error([](O& o) { o.gamma = 0; }, "exponential") == "lr schedule: gamma must be in (0, 1], got 0");
  CHECK(option_error([](O&) {}, "exponential") ==
        "lr schedule: gamma is required by the exponential schedule (a number in (0, 1])");
  CHECK(option_error(
            [](O& o) {
              o.total_steps = 5;
              o.gamma = 0.5;
            },
            "cosine") ==
        "lr schedule: gamma does not apply to the cosine schedule (only to step, multistep, exponential)");

  CHECK(option_error([](O&) {}, "multistep") ==
        "lr schedule: milestones is required by the multistep schedule (strictly increasing integers >= 1)");
  CHECK(option_error(
            [](O& o) {
              o.milestones = {5, 3};
            },
            "multistep") == "lr schedule: milestones must be strictly increasing integers >= 1, got [5, 3]");
  CHECK(option_error(
            [](O& o) {
              o.milestones = {4, 4};
            },
            "multistep") == "lr schedule: milestones must be strictly increasing integers >= 1, got [4, 4]");
  CHECK(option_error(
            [](O& o) {
              o.milestones = {0, 4};
            },
            "multistep") == "lr schedule: milestones must be strictly increasing integers >= 1, got [0, 4]");
  CHECK(option_error([](O& o) { o.milestones = {3}; }, "constant") ==
        "lr schedule: milestones does not apply to the constant schedule (only to multistep)");

  CHECK(option_error([](O& o) { o.mode = "avg"; }, "plateau") == "lr schedule: mode must be min or max, got 'avg'");
  CHECK(option_error([](O& o) { o.factor = 1.0; }, "plateau") == "lr schedule: factor must be in (0, 1), got 1");
  CHECK(option_error([](O& o) { o.factor = 0.0; }, "plateau") == "lr schedule: factor must be in (0, 1), got 0");
  CHECK(option_error([](O& o) { o.patience = -1; }, "plateau") ==
        "lr schedule: patience must be an integer >= 0, got -1");
  CHECK(option_error([](O& o) { o.threshold = -0.1; }, "plateau") ==
        "lr schedule: threshold must be a finite number >= 0, got -0.1");
  CHECK(option_error([](O& o) { o.threshold = std::numeric_limits<double>::infinity(); }, "plateau") ==
        "lr schedule: threshold must be a finite number >= 0, got inf");
  CHECK(option_error([](O& o) { o.threshold_mode = "relative"; }, "plateau") ==
        "lr schedule: threshold_mode must be rel or abs, got 'relative'");
  CHECK(option_error([](O& o) { o.cooldown = -2; }, "plateau") ==
        "lr schedule: cooldown must be an integer >= 0, got -2");
  CHECK(option_error([](O& o) { o.eps = std::nan(""); }, "plateau") ==
        "lr schedule: eps must be a finite number >= 0, got nan");
  CHECK(option_error([](O& o) { o.min_lr_factor = -0.5; }, "plateau") ==
        "lr schedule: min_lr_factor must be in [0, 1], got -0.5");
  for (const char* kind : {"constant", "cosine"}) {
    CHECK(option_error([](O& o) { o.patience = 3; }, kind) ==
          std::string("lr schedule: patience does not apply to the ") + kind + " schedule (only to plateau)");
  }
  CHECK(option_error([](O& o) { o.mode = "min"; }, "step") ==
        "lr schedule: mode does not apply to the step schedule (only to plateau)");

  const LrSchedule constant(make("constant"));
  CHECK(invalid_argument_text([&] { (void)constant.factor(-1); }) == "lr schedule: step must be >= 0, got -1");
}

TEST_CASE("observe() applies to plateau only; a NaN metric counts as bad", "[lr_schedule]") {
  LrSchedule cosine(make("cosine", [](auto& o) { o.total_steps = 10; }));
  CHECK_THROWS_AS(cosine.observe(1.0), std::logic_error);
  CHECK_THROWS_WITH(cosine.observe(1.0), "lr schedule: observe() applies to the plateau schedule, not cosine");

  LrSchedule plateau(make("plateau", [](auto& o) {
    o.patience = 1;
    o.factor = 0.5;
  }));
  plateau.observe(std::nan(""));  // not better than +inf: bad
  CHECK(plateau.state()["best"] == "inf");
  CHECK(plateau.state()["num_bad_epochs"] == 1);
  plateau.observe(std::nan(""));
  CHECK(plateau.factor(0) == 0.5);
  plateau.observe(2.0);
  CHECK(plateau.state()["best"] == 2.0);
}

TEST_CASE("plateau state: a run resumed at any step continues identically", "[lr_schedule]") {
  const nlohmann::json& g = golden();
  const std::int64_t steps = g["steps"].get<std::int64_t>();
  bool saw_cooldown = false, saw_bad = false, saw_infinite_best = false, saw_reduced = false;
  for (const auto& c : g["cases"]) {
    if (!is_plateau(c)) continue;
    INFO("case: " << c["name"].get<std::string>());
    const std::vector<double> uninterrupted = run_case(c, steps);
    const std::vector<double> expected = c["lrs"].get<std::vector<double>>();
    for (std::int64_t resume_at = 0; resume_at < steps; ++resume_at) {
      INFO("resumed at step " << resume_at);
      const auto inspect = [&](const LrSchedule& s) {
        const nlohmann::json state = s.state();
        saw_cooldown |= state["cooldown_counter"].get<std::int64_t>() > 0;
        saw_bad |= state["num_bad_epochs"].get<std::int64_t>() > 0;
        saw_infinite_best |= state["best"].is_string();
        saw_reduced |= state["factor"].get<double>() < 1.0;
      };
      const std::vector<double> resumed = run_case(c, steps, resume_at, inspect);
      CHECK(resumed == uninterrupted);
      for (std::int64_t step = 0; step < steps; ++step) CHECK(resumed[step] == Approx(expected[step]).epsilon(1e-12));
    }
  }
  CHECK(saw_cooldown);
  CHECK(saw_bad);
  CHECK(saw_infinite_best);
  CHECK(saw_reduced);
}

TEST_CASE("plateau state: the fields and their round trip", "[lr_schedule]") {
  LrSchedule s(make("plateau", [](auto& o) {
    o.mode = "max";
    o.patience = 0;
    o.cooldown = 3;
    o.factor = 0.5;
  }));
  CHECK(s.state() == nlohmann::json{{"kind", "plateau"},
                                    {"factor", 1.0},
                                    {"best", "-inf"},
                                    {"num_bad_epochs", 0},
                                    {"cooldown_counter", 0},
                                    {"observations", 0}});
  s.observe(0.3);
  s.observe(0.1);  // bad, patience 0: reduce, cooldown 3
  s.observe(0.1);  // in cooldown
  const nlohmann::json state = s.state();
  CHECK(state == nlohmann::json{{"kind", "plateau"},
                                {"factor", 0.5},
                                {"best", 0.3},
                                {"num_bad_epochs", 0},
                                {"cooldown_counter", 2},
                                {"observations", 3}});
  LrSchedule t(s.options());
  t.load_state(state);
  CHECK(t.state() == state);
  CHECK(t.factor(100) == 0.5);

  const LrSchedule cosine(make("cosine", [](auto& o) { o.total_steps = 3; }));
  CHECK(cosine.state() == nlohmann::json{{"kind", "cosine"}});
}

TEST_CASE("load_state refuses foreign, incomplete and out-of-range states and changes nothing", "[lr_schedule]") {
  LrSchedule s(make("plateau", [](auto& o) { o.patience = 0; }));
  s.observe(1.0);
  s.observe(2.0);
  const nlohmann::json before = s.state();
  const auto error = [&](const nlohmann::json& state) {
    const std::string text = invalid_argument_text([&] { s.load_state(state); });
    CHECK(s.state() == before);
    return text;
  };
  const auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json state = before;
    state[key] = value;
    return state;
  };
  const auto without = [&](const char* key) {
    nlohmann::json state = before;
    state.erase(key);
    return state;
  };
  CHECK(error(nlohmann::json::array()) == "lr schedule state: expected an object, got []");
  CHECK(error(without("kind")) == "lr schedule state: kind is missing or not a string");
  CHECK(error(with("kind", "cosine")) == "lr schedule state: the state is for the cosine schedule, not plateau");
  CHECK(error(with("epoch", 3)) == "lr schedule state: unknown key 'epoch' for the plateau schedule");
  CHECK(error(without("best")) == "lr schedule state: best is missing");
  CHECK(error(without("observations")) == "lr schedule state: observations is missing");
  CHECK(error(with("factor", 1.5)) == "lr schedule state: factor must be a number in [0, 1], got 1.5");
  CHECK(error(with("factor", "0.5")) == "lr schedule state: factor must be a number in [0, 1], got \"0.5\"");
  CHECK(error(with("best", "nan")) == "lr schedule state: best must be a number, \"inf\" or \"-inf\", got \"nan\"");
  CHECK(error(with("best", nullptr)) == "lr schedule state: best must be a number, \"inf\" or \"-inf\", got null");
  CHECK(error(with("num_bad_epochs", -1)) == "lr schedule state: num_bad_epochs must be an integer >= 0, got -1");
  CHECK(error(with("cooldown_counter", 1.5)) == "lr schedule state: cooldown_counter must be an integer >= 0, got 1.5");
  CHECK(error(with("observations", std::uint64_t(1) << 63)) ==
        "lr schedule state: observations must be an integer >= 0, got 9223372036854775808");

  LrSchedule step(make("step", [](auto& o) { o.step_size = 3; }));
  CHECK_NOTHROW(step.load_state({{"kind", "step"}}));
  CHECK(invalid_argument_text([&] { step.load_state(before); }) ==
        "lr schedule state: the state is for the plateau schedule, not step");
  CHECK(invalid_argument_text([&] {
          step.load_state({{"kind", "step"}, {"factor", 1.0}});
        }) == "lr schedule state: unknown key 'factor' for the step schedule");
}

TEST_CASE("describe() states the schedule in one line", "[lr_schedule]") {
  const auto describe = [](const std::string& kind, const std::function<void(LrScheduleOptions&)>& change = {}) {
    return LrSchedule(make(kind, change)).describe();
  };
  CHECK(describe("constant") == "constant");
  CHECK(describe("cosine", [](auto& o) {
          o.total_steps = 10000;
          o.min_lr_factor = 0.1;
          o.warmup_steps = 500;
        }) == "cosine over 10000 steps to 0.1x after 500 warmup steps");
  CHECK(describe("linear", [](auto& o) { o.total_steps = 1; }) == "linear over 1 step to 0x");
  CHECK(describe("constant", [](auto& o) {
          o.warmup_steps = 1;
          o.warmup_start_factor = 0.01;
        }) == "constant after 1 warmup step from 0.01x");
  CHECK(describe("step", [](auto& o) { o.step_size = 1000; }) == "step x0.1 every 1000 steps");
  CHECK(describe("step", [](auto& o) {
          o.step_size = 1;
          o.gamma = 0.5;
        }) == "step x0.5 every step");
  CHECK(describe("multistep", [](auto& o) {
          o.milestones = {30000, 40000};
        }) == "multistep x0.1 at steps 30000, 40000");
  CHECK(describe("multistep", [](auto& o) {
          o.milestones = {7};
          o.gamma = 0.25;
        }) == "multistep x0.25 at step 7");
  CHECK(describe("exponential", [](auto& o) { o.gamma = 0.999; }) == "exponential x0.999 per step");
  CHECK(describe("plateau") ==
        "reduce on plateau x0.1 (min metric, patience 10, threshold 0.0001 rel, cooldown 0, floor 0x)");
  CHECK(describe("plateau",
                 [](auto& o) {
                   o.mode = "max";
                   o.factor = 0.5;
                   o.patience = 2;
                   o.threshold = 0.01;
                   o.threshold_mode = "abs";
                   o.cooldown = 4;
                   o.min_lr_factor = 0.001;
                   o.warmup_steps = 100;
                   o.warmup_start_factor = 0.1;
                 }) ==
        "reduce on plateau x0.5 (max metric, patience 2, threshold 0.01 abs, cooldown 4, floor 0.001x) after 100 "
        "warmup steps from 0.1x");
}
