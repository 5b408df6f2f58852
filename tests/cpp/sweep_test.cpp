// Tests of runtime/sweep: definitions and their errors, the grid, random and TPE samplers, ASHA's rungs and
// promotion rule, and transactional trial claims in the index (two workers racing on their own connections).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "runtime/core/launch_context.h"
#include "runtime/index/index_database.h"
#include "runtime/index/metric_writer.h"
#include "runtime/index/run_store.h"
#include "runtime/sweep/asha.h"
#include "runtime/sweep/samplers.h"
#include "runtime/sweep/slurm_job.h"
#include "runtime/sweep/sweep_spec.h"
#include "runtime/sweep/sweep_worker.h"
#include "runtime/sweep/trial_store.h"
#include "tests/cpp/postgres_index.h"
#include "tests/cpp/temp_directory.h"
#include "tests/cpp/test_index_location.h"

using namespace runner::sweep;
using Catch::Contains;
using nlohmann::json;

namespace {

json definition(json fields) {
  fields["script"] = "/experiments/sh.lua";
  return {{"sweep_file", "sweeps/s.lua"},
          {"where", "sweeps/s.lua:2"},
          {"lines", {{"lr", "sweeps/s.lua:3"}}},
          {"fields", fields},
          {"resolved", true}};
}

SweepSpec spec_of(json fields) { return parse_sweep(definition(std::move(fields))); }

// A synthetic objective with its optimum at lr = 1e-3, x = 0.3 and a categorical part best at "b".
double objective(const json& params) {
  const double a = std::log10(params["lr"].get<double>()) + 3;
  const double b = params["x"].get<double>() - 0.3;
  return a * a + 4 * b * b + (params["kind"] == "b" ? 0.0 : 0.5);
}

double best_after(Method method, std::int64_t seed, int trials) {
  SweepSpec spec = spec_of({{"parameters",
                             {{"lr", {{"kind", "log_uniform"}, {"low", 1e-6}, {"high", 1.0}}},
                              {"x", {{"kind", "uniform"}, {"low", -2.0}, {"high", 2.0}}},
                              {"kind", json::array({"a", "b", "c", "d"})}}},
                            {"method", method_name(method)},
                            {"trials", trials},
                            {"metric", "f"},
                            {"seed", seed}});
  std::vector<Observation> history;
  double best = INFINITY;
  for (int t = 0; t < trials; ++t) {
    const json params = suggest(spec, t, history);
    const double value = objective(params);
    history.push_back({params, value});
    best = std::min(best, value);
  }
  return best;
}

}  // namespace

TEST_CASE("sweep definitions are read with their defaults and refused with the field's line") {
  const SweepSpec spec =
      spec_of({{"parameters",
                {{"lr", {{"kind", "log_uniform"}, {"low", 1e-4}, {"high", 1e-2}}}, {"batch", json::array({32, 64})}}},
               {"trials", 5},
               {"metric", "loss"}});
  CHECK(spec.name == "s");
  CHECK(spec.method == Method::random);
  CHECK(spec.minimize);
  CHECK(spec.max_failures == 3);
  REQUIRE(spec.parameters.size() == 2);
  CHECK(spec.parameters[0].name == "batch");  // sorted by name
  CHECK(spec.parameters[1].where == "sweeps/s.lua:3");
  CHECK(parse_sweep(sweep_json(spec)).parameters[1].low == 1e-4);  // the stored form reads back

  CHECK_THROWS_WITH(
      spec_of(
          {{"parameters", {{"lr", {{"kind", "uniform"}, {"low", 2}, {"high", 1}}}}}, {"trials", 2}, {"metric", "m"}}),
      "sweeps/s.lua:3: parameter 'lr': uniform needs low < high, got 2 and 1");
  CHECK_THROWS_WITH(spec_of({{"parameters", {{"lr", json::array({1, 2})}}}, {"metric", "m"}}),
                    "sweeps/s.lua:2: method 'random' needs trials = N (how many to run)");
  CHECK_THROWS_WITH(spec_of({{"parameters", {{"lr", json::array({1, 1})}}}, {"trials", 2}, {"metric", "m"}}),
                    "sweeps/s.lua:3: parameter 'lr' lists the value 1 twice");
  CHECK_THROWS_WITH(
      spec_of({{"parameters", {{"lr", {{"kind", "uniform"}, {"low", 0}, {"high", 1}}}}},
               {"method", "grid"},
               {"metric", "m"}}),
      Contains("method 'grid' needs lists of values (or runner.sweep.int ranges); parameter 'lr' is uniform"));
  CHECK_THROWS_WITH(
      spec_of({{"parameters", {{"lr", json::array({1, 2})}}}, {"method", "grid"}, {"trials", 3}, {"metric", "m"}}),
      "sweeps/s.lua:2: trials = 3 is more than the grid's 2 points");
  CHECK_THROWS_WITH(
      spec_of({{"parameters", {{"lr", json::array({1, 2})}}},
               {"trials", 2},
               {"metric", "m"},
               {"prune", {{"method", "asha"}, {"min_step", 3}}}}),
      Contains("unknown prune option 'min_step' (known: min_steps, reduction, max_steps); did you mean 'min_steps'?"));
}

TEST_CASE("a sweep is checked against the script's config keys") {
  SweepSpec spec = spec_of({{"parameters", {{"lr", {{"kind", "log_uniform"}, {"low", 1e-4}, {"high", 1e-2}}}}},
                            {"fixed", {{"steps", 60}}},
                            {"trials", 2},
                            {"metric", "loss"},
                            {"prune", {{"method", "asha"}, {"min_steps", 10}}}});
  ScriptConfig config = parse_script_config(json::parse(
      R"({"keys": {"lr": {"default": 0.001, "integer": false}, "steps": {"default": 600, "integer": true}}})"));
  check_against_config(spec, config);
  CHECK(spec.asha->max_steps == 60);  // from fixed.steps
  CHECK(rung_steps(*spec.asha) == std::vector<std::int64_t>{10, 30});
  config.erase("lr");
  config["lr_max"] = ConfigKey{0.1, false};
  CHECK_THROWS_WITH(check_against_config(spec, config),
                    "sweeps/s.lua:3: parameter 'lr' is not a config key of sh.lua (its keys: lr_max, steps)");
  CHECK(trial_overrides(spec, {{"lr", 0.00031}}) == std::vector<std::string>{"lr=0.00031", "steps=60"});
  CHECK(override_text(json::array({1, 2, 4})) == "1,2,4");
  CHECK(override_text(true) == "true");
}

TEST_CASE("the grid visits every point once, the last parameter fastest") {
  const SweepSpec spec = spec_of(
      {{"parameters", {{"a", json::array({"x", "y"})}, {"b", {{"kind", "int"}, {"low", 1}, {"high", 5}, {"step", 2}}}}},
       {"method", "grid"},
       {"metric", "m"}});
  REQUIRE(grid_size(spec) == 6);
  std::vector<json> points;
  for (int t = 0; t < 6; ++t) points.push_back(suggest(spec, t, {}));
  CHECK(points[0] == json{{"a", "x"}, {"b", 1}});
  CHECK(points[1] == json{{"a", "x"}, {"b", 3}});
  CHECK(points[5] == json{{"a", "y"}, {"b", 5}});
  CHECK(std::set<std::string>{points[0].dump(), points[1].dump(), points[2].dump(), points[3].dump(), points[4].dump(),
                              points[5].dump()}
            .size() == 6);
}

TEST_CASE("random draws stay in their ranges and repeat for the same seed and trial") {
  const SweepSpec spec = spec_of({{"parameters",
                                   {{"lr", {{"kind", "log_uniform"}, {"low", 1e-5}, {"high", 1e-1}}},
                                    {"n", {{"kind", "int"}, {"low", 16}, {"high", 64}, {"step", 16}}}}},
                                  {"trials", 200},
                                  {"metric", "m"},
                                  {"seed", 3}});
  int below_1e3 = 0;
  std::set<std::int64_t> ns;
  for (int t = 0; t < 200; ++t) {
    const json params = suggest(spec, t, {});
    const double lr = params["lr"].get<double>();
    CHECK((lr >= 1e-5 && lr <= 1e-1));
    below_1e3 += lr < 1e-3 ? 1 : 0;
    ns.insert(params["n"].get<std::int64_t>());
    CHECK(params == suggest(spec, t, {}));
  }
  CHECK(ns == std::set<std::int64_t>{16, 32, 48, 64});
  CHECK(below_1e3 > 70);  // log-uniform: half of the draws below 1e-3 (uniform would give 1%)
  CHECK(below_1e3 < 130);
}

TEST_CASE("TPE finds a better optimum than random search with the same budget") {
  double tpe = 0, random = 0;
  const int seeds = 8;
  for (int seed = 0; seed < seeds; ++seed) {
    tpe += best_after(Method::tpe, seed, 60) / seeds;
    random += best_after(Method::random, seed, 60) / seeds;
  }
  INFO("mean best: TPE " << tpe << ", random " << random);
  CHECK(tpe < 0.7 * random);
}

TEST_CASE("ASHA promotes the best floor(n / reduction) of a rung, NaN last") {
  const std::vector<RungResult> results = {{1, 0.5}, {2, 0.1}, {3, NAN}, {4, 0.3}, {5, 0.2}, {6, 0.9}};
  CHECK(promotable(results, 2, 3, true));
  CHECK(promotable(results, 5, 3, true));
  CHECK_FALSE(promotable(results, 4, 3, true));
  CHECK_FALSE(promotable(results, 3, 3, true));
  CHECK(promotable(results, 6, 3, false));
  CHECK_FALSE(promotable(results, 3, 3, false));
  CHECK_FALSE(promotable({{1, 0.1}, {2, 0.2}}, 1, 3, true));  // fewer than `reduction` results: none yet
  CHECK(rung_steps(AshaOptions{100, 3, 900}) == std::vector<std::int64_t>{100, 300});
  CHECK(rung_steps(AshaOptions{100, 3, 901}) == std::vector<std::int64_t>{100, 300, 900});
}

TEST_CASE("claims hand out trials in order, and a dead worker's trials are taken over") {
  runner::testing::TempDir home("sweep-claims");
  runner::index::Database db = runner::index::open_index_for_writing(runner::testing::index_at(home.path));
  const SweepSpec spec =
      spec_of({{"parameters", {{"lr", json::array({1, 2, 3})}}}, {"method", "grid"}, {"metric", "m"}});
  const SweepRecord sweep = open_sweep(db, spec);
  CHECK(open_sweep(db, spec).sweep == sweep.sweep);  // the same definition: the same sweep
  const auto a = claim_trial(db, sweep, "host-a:1");
  const auto b = claim_trial(db, sweep, "host-b:1");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->trial.trial == 1);
  CHECK(b->trial.trial == 2);
  CHECK(a->reason == "new");
  // host-a:1 stops beating: after the stale limit its trial is stopped and taken over before a new one.
  db.execute("UPDATE trials SET heartbeat_at = heartbeat_at - 3600 WHERE trial = 1");
  const auto c = claim_trial(db, sweep, "host-b:1");
  REQUIRE(c);
  CHECK(c->trial.trial == 1);
  CHECK(c->reason == "continued");
  const auto d = claim_trial(db, sweep, "host-c:1");
  REQUIRE(d);
  CHECK(d->trial.trial == 3);
  CHECK_FALSE(claim_trial(db, sweep, "host-c:1"));
  SweepSpec other = spec;
  other.trials = 2;
  CHECK_THROWS_WITH(open_sweep(db, other),
                    Contains("a sweep named 's' exists with another definition (trials differ)"));
}

TEST_CASE("a trial taken over is no longer its old worker's: its heartbeat and its end record nothing") {
  runner::testing::TempDir home("sweep-fence");
  runner::index::Database db = runner::index::open_index_for_writing(runner::testing::index_at(home.path));
  const SweepSpec spec = spec_of({{"parameters", {{"lr", json::array({1})}}}, {"method", "grid"}, {"metric", "m"}});
  const SweepRecord sweep = open_sweep(db, spec);
  const auto first = claim_trial(db, sweep, "host-a:1");
  REQUIRE(first);
  CHECK(first->trial.generation == 1);
  CHECK(heartbeat_trials(db, sweep, "host-a:1", {{1, 1}}).empty());
  // host-a:1 falls silent past takeover_after: host-b:1 stops its trial (generation 2) and continues it (3).
  db.execute("UPDATE trials SET heartbeat_at = heartbeat_at - 3600 WHERE trial = 1");
  const auto taken = claim_trial(db, sweep, "host-b:1");
  REQUIRE(taken);
  CHECK(taken->trial.generation == 3);
  // host-a:1 comes back: its heartbeat finds the trial lost, and its end of the trial records nothing.
  CHECK(heartbeat_trials(db, sweep, "host-a:1", {{1, 1}}) == std::vector<std::int64_t>{1});
  TrialEnd failed;
  failed.failure = "exited with status 1";
  CHECK_FALSE(end_trial(db, sweep, 1, failed, 1));
  const std::vector<TrialRecord> trials = list_trials(db, sweep.sweep);
  CHECK(trials[0].status == "running");
  CHECK(trials[0].worker == "host-b:1");
  // The new owner's end is recorded once: the same end again (a retry after a lost answer) changes nothing.
  const auto ended = end_trial(db, sweep, 1, failed, 3);
  REQUIRE(ended);
  CHECK(ended->status == "failed");
  const auto again = end_trial(db, sweep, 1, failed, 3);
  REQUIRE(again);
  CHECK(again->status == "failed");
  CHECK(again->ended_at == ended->ended_at);
}

INDEX_TEST_CASE("two workers claiming at once through their own connections never get the same trial", "[sweep]") {
  runner::testing::TempDir home("sweep-race");
  constexpr int kTrials = 100;
  json points = json::array();
  for (int i = 1; i <= kTrials; ++i) points.push_back(i);
  const SweepSpec spec = spec_of({{"parameters", {{"lr", points}}}, {"method", "grid"}, {"metric", "m"}});
  runner::index::Database db = runner::index::open_index_for_writing(runner::testing::index_at(home.path));
  const SweepRecord sweep = open_sweep(db, spec);

  struct Claimed {
    std::int64_t trial;
    std::string reason;
  };
  // Both workers claim until nothing is left, each through its own connection on its own thread, released
  // together so that their claims overlap.
  auto race = [&] {
    const std::string names[2] = {"worker-a:1", "worker-b:1"};
    std::vector<Claimed> claimed[2];
    std::string errors[2];
    runner::index::Database connections[2] = {
        runner::index::open_index_for_writing(runner::testing::index_at(home.path)),
        runner::index::open_index_for_writing(runner::testing::index_at(home.path))};
    std::latch start(2);
    auto work = [&](int w) {
      start.arrive_and_wait();
      try {
        while (const auto claim = claim_trial(connections[w], sweep, names[w]))
          claimed[w].push_back({claim->trial.trial, claim->reason});
      } catch (const std::exception& error) {
        errors[w] = error.what();
      }
    };
    std::thread a(work, 0), b(work, 1);
    a.join();
    b.join();
    CHECK(errors[0] == "");
    CHECK(errors[1] == "");
    INFO("claims: worker-a " << claimed[0].size() << ", worker-b " << claimed[1].size());
    // Every trial once, and the index records the worker that got it.
    std::map<std::int64_t, std::vector<std::string>> claimants;
    for (int w = 0; w < 2; ++w)
      for (const Claimed& c : claimed[w]) claimants[c.trial].push_back(names[w]);
    std::string twice;
    for (const auto& [trial, workers] : claimants)
      if (workers.size() > 1) twice += fmt::format(" {} ({})", trial, fmt::join(workers, ", "));
    CHECK(twice == "");
    CHECK(claimants.size() == kTrials);
    std::map<std::int64_t, std::string> recorded;
    for (const TrialRecord& trial : list_trials(db, sweep.sweep)) recorded[trial.trial] = trial.worker.value_or("");
    CHECK(recorded.size() == kTrials);
    for (const auto& [trial, workers] : claimants) CHECK(recorded[trial] == workers.front());
    std::vector<std::string> reasons;
    for (int w = 0; w < 2; ++w)
      for (const Claimed& c : claimed[w]) reasons.push_back(c.reason);
    return reasons;
  };

  // New trials: each claim picks the next trial number and inserts it.
  for (const std::string& reason : race()) CHECK(reason == "new");
  // Stopped trials: each claim picks one of the stopped trials and marks it running.
  db.execute("UPDATE trials SET status = 'stopped', worker = NULL");
  for (const std::string& reason : race()) CHECK(reason == "continued");
  for (const TrialRecord& trial : list_trials(db, sweep.sweep)) CHECK(trial.segments == 2);
}

TEST_CASE("whole numbers are range-checked as 64-bit values, names like run names, text as UTF-8") {
  const json lr = json::array({1, 2});
  CHECK_THROWS_WITH(spec_of({{"parameters", {{"lr", lr}}}, {"metric", "m"}, {"trials", 5000000000LL}}),
                    "sweeps/s.lua:2: 'trials' must be a whole number from 1 to 2147483647, got 5000000000");
  CHECK_THROWS_WITH(
      spec_of({{"parameters", {{"lr", lr}}}, {"metric", "m"}, {"trials", 2}, {"slots", 3e9}}),
      "sweeps/s.lua:2: 'slots' (a number or \"auto\") must be a whole number from 1 to 2147483647, got 3000000000.0");
  CHECK_THROWS_WITH(spec_of({{"parameters", {{"lr", lr}}}, {"metric", "m"}, {"trials", 2}, {"retries", -1}}),
                    "sweeps/s.lua:2: 'retries' must be a whole number from 0 to 2147483647, got -1");
  const SweepSpec many = spec_of({{"parameters", {{"lr", lr}}}, {"metric", "m"}, {"trials", 2147483647}});
  CHECK(many.max_failures == 1073741824);  // trials / 2 + 1, not wrapped to a negative int
  CHECK(many.retries == 1);
  CHECK(rung_steps(AshaOptions{std::int64_t{1} << 40, 2147483647, (std::int64_t{1} << 53) - 1}) ==
        std::vector<std::int64_t>{std::int64_t{1} << 40});  // the next rung would overflow
  // Fresh definitions (not read back from the index) have their names checked.
  json fresh = definition({{"parameters", {{"lr", lr}}}, {"metric", "m"}, {"trials", 2}, {"name", "../../x"}});
  fresh["resolved"] = false;
  fresh["fields"]["script"] = "/";
  CHECK_THROWS_WITH(parse_sweep(fresh), Contains("sweep name '../../x' is not allowed"));
  CHECK_THROWS_WITH(
      spec_of({{"parameters", {{"lr", json::array({"a", "\xff"})}}}, {"metric", "m"}, {"trials", 2}}),
      "sweeps/s.lua:3: parameter \"lr\" holds text that is not UTF-8: \"\\xff\" (the index keeps text as UTF-8)");
}

TEST_CASE("a rung that fewer than `reduction` trials reach is reported by the definition check") {
  SweepSpec spec = spec_of({{"parameters", {{"lr", json::array({1, 2, 3})}}},
                            {"method", "grid"},
                            {"metric", "m"},
                            {"prune", {{"method", "asha"}, {"min_steps", 6}, {"max_steps", 54}}}});
  spec.lines["prune"] = "sweeps/s.lua:7";
  CHECK(
      rung_warning(spec) ==
      "sweeps/s.lua:7: warning: ASHA's rung 2 (step 18) is reached by at most 1 trial, fewer than reduction = 3, so it "
      "never promotes: its best trial runs to the end once nothing else is left (more trials, a smaller reduction or a "
      "larger min_steps let every rung choose)");
  spec.trials = 9;
  CHECK(rung_warning(spec) == "");
}

TEST_CASE("a trial killed by a signal is retried while it has retries, and ASHA's last rung runs its best to the end") {
  runner::testing::TempDir home("sweep-last-rung");
  runner::index::Database db = runner::index::open_index_for_writing(runner::testing::index_at(home.path));
  json points = json::array();
  for (int i = 1; i <= 9; ++i) points.push_back(i);
  // The issue's case: 9 points, rungs at 6 and 18 of 54 steps.
  const SweepSpec spec = spec_of({{"parameters", {{"lr", points}}},
                                  {"method", "grid"},
                                  {"metric", "m"},
                                  {"prune", {{"method", "asha"}, {"min_steps", 6}, {"max_steps", 54}}}});
  const SweepRecord sweep = open_sweep(db, spec);
  for (int t = 1; t <= 9; ++t) REQUIRE(claim_trial(db, sweep, "host:1"));
  // Every trial paused at rung 1; the best three there, 3, 5 and 7, went on to rung 2, where 7 is the best.
  for (int t = 1; t <= 9; ++t) {
    db.execute(
        fmt::format("INSERT INTO trial_rungs VALUES ({}, {}, 1, 6, {})", sweep.sweep, t, t % 2 && t > 1 ? t : 10 + t));
    db.execute(fmt::format("UPDATE trials SET status = 'paused', rung = 1, worker = NULL WHERE trial = {}", t));
  }
  for (int t : {3, 5, 7}) {
    db.execute(fmt::format("INSERT INTO trial_rungs VALUES ({}, {}, 2, 18, {})", sweep.sweep, t, 10 - t));
    db.execute(fmt::format("UPDATE trials SET rung = 2 WHERE trial = {}", t));
  }
  // Trial 7 (the best at rung 2) is killed outright: retried once, from its checkpoint, before anything else.
  db.execute("UPDATE trials SET status = 'running', worker = 'host:1' WHERE trial = 7");
  TrialEnd killed;
  killed.killed_by = 9;
  killed.failure = "was killed by signal 9 (SIGKILL)";
  TrialRecord ended = *end_trial(db, sweep, 7, killed, list_trials(db, sweep.sweep)[6].generation);
  CHECK(ended.status == "stopped");
  CHECK(ended.retries == 1);
  CHECK(ended.error == "killed by signal 9 (SIGKILL) at step 0");
  auto retry = claim_trial(db, sweep, "host:1");
  REQUIRE(retry);
  CHECK(retry->trial.trial == 7);
  CHECK(retry->reason == "retry 1 of 1: killed by signal 9 (SIGKILL) at step 0");
  // Killed again: no retries left, it fails.
  ended = *end_trial(db, sweep, 7, killed, retry->trial.generation);
  CHECK(ended.status == "failed");
  CHECK(ended.error == "was killed by signal 9 (SIGKILL) (after 1 retry)");
  // Rung 2's best failed, and nothing has finished: the best of rung 2 that waits, trial 5, runs to the end.
  CHECK_FALSE(finish_if_done(db, sweep));
  auto last = claim_trial(db, sweep, "host:1");
  REQUIRE(last);
  CHECK(last->trial.trial == 5);
  CHECK(last->reason == "the best left at rung 2, as none finished: runs to the end");
  CHECK_FALSE(last->pause_step);
  CHECK_FALSE(claim_trial(db, sweep, "host:1"));
  // It finished: the sweep ends, the paused trials pruned.
  db.execute("UPDATE trials SET status = 'finished', metric = 0.5, worker = NULL WHERE trial = 5");
  CHECK_FALSE(claim_trial(db, sweep, "host:1"));
  CHECK(finish_if_done(db, sweep));
  const SweepCounts counts = count_trials(sweep, list_trials(db, sweep.sweep));
  CHECK(counts.finished == 1);
  CHECK(counts.pruned == 7);
  CHECK(counts.failed == 1);
  CHECK(counts.best_trial == 5);
}

TEST_CASE("a trial failed for want of disk space is continued by the next worker while the other failures allow it") {
  runner::testing::TempDir home("sweep-out-of-space");
  runner::index::Database db = runner::index::open_index_for_writing(runner::testing::index_at(home.path));
  const SweepRecord sweep = open_sweep(db, spec_of({{"parameters", {{"lr", json::array({1, 2, 3})}}},
                                                    {"method", "grid"},
                                                    {"metric", "m"},
                                                    {"max_failures", 2}}));
  for (int t = 1; t <= 3; ++t) REQUIRE(claim_trial(db, sweep, "host:1"));
  auto generation_of = [&](std::int64_t trial) { return list_trials(db, sweep.sweep)[trial - 1].generation; };
  TrialEnd failed;
  failed.failure = "exited with status 1";
  CHECK(end_trial(db, sweep, 2, failed, generation_of(2))->status == "failed");
  TrialEnd full;
  full.storage_full = true;
  full.failure = "exited with status 75";
  TrialRecord ended = *end_trial(db, sweep, 1, full, generation_of(1));
  CHECK(ended.status == "stopped");
  CHECK(ended.out_of_space);
  REQUIRE(claim_trial(db, sweep, "host:1").value().reason ==
          "retry 1 of 1: stopped by a full disk at step 0 (a write failed for want of space)");
  ended = *end_trial(db, sweep, 1, full, generation_of(1));
  CHECK(ended.status == "failed");
  CHECK(ended.out_of_space);
  CHECK(ended.error == "a write failed for want of disk space at step 0 (after 1 retry)");
  // The failure limit is reached (trials 1 and 2), but without trial 1's full disk it is not: the next worker to
  // start continues trial 1 with a fresh round of retries.
  CHECK_FALSE(claim_trial(db, sweep, "host:1"));
  const std::vector<TrialRecord> continued = continue_out_of_space_trials(db, sweep);
  REQUIRE(continued.size() == 1);
  CHECK((continued[0].trial == 1 && continued[0].status == "stopped" && continued[0].retries == 0));
  CHECK(continue_out_of_space_trials(db, sweep).empty());
  const auto again = claim_trial(db, sweep, "host:1");
  REQUIRE(again);
  CHECK(again->trial.trial == 1);
  CHECK(again->reason == "continued: a write failed for want of disk space at step 0 (after 1 retry)");
  CHECK(end_trial(db, sweep, 1, full, again->trial.generation)->retries == 1);
  REQUIRE(claim_trial(db, sweep, "host:1"));
  CHECK(end_trial(db, sweep, 1, full, generation_of(1))->status == "failed");
  // Trial 3 fails too: trials 2 and 3 alone reach max_failures, so trial 1 stays failed.
  CHECK(end_trial(db, sweep, 3, failed, generation_of(3))->status == "failed");
  CHECK(continuable_out_of_space(sweep.spec, list_trials(db, sweep.sweep)).empty());
  CHECK(continue_out_of_space_trials(db, sweep).empty());
  CHECK(list_trials(db, sweep.sweep)[0].status == "failed");
  CHECK_FALSE(list_trials(db, sweep.sweep)[1].out_of_space);
}

TEST_CASE("a running sweep shows whether a worker holds it") {
  runner::testing::TempDir home("sweep-workers");
  runner::index::Database db = runner::index::open_index_for_writing(runner::testing::index_at(home.path));
  const SweepRecord sweep =
      open_sweep(db, spec_of({{"parameters", {{"lr", json::array({1, 2})}}}, {"method", "grid"}, {"metric", "m"}}));
  CHECK_FALSE(worker_presence(db, sweep).alive);
  add_worker(db, sweep, worker_name(), "");  // this process: alive
  CHECK(worker_presence(db, sweep).alive);
  remove_worker(db, sweep.sweep, worker_name());
  // A worker on another host is alive while its heartbeat is fresh.
  add_worker(db, sweep, "elsewhere:1", "4242_3");
  CHECK(worker_presence(db, sweep).alive);
  add_worker(db, sweep, "another:77", "");
  const std::vector<WorkerRecord> workers = list_workers(db, sweep);  // by host
  REQUIRE(workers.size() == 2);
  CHECK((workers[0].host == "another" && workers[0].pid == 77 && !workers[0].slurm_job && workers[0].alive));
  CHECK((workers[1].host == "elsewhere" && workers[1].pid == 1 && workers[1].slurm_job == "4242_3"));
  remove_worker(db, sweep.sweep, "another:77");
  db.execute("UPDATE sweep_workers SET heartbeat_at = heartbeat_at - 3600");
  CHECK_FALSE(list_workers(db, sweep).front().alive);
  SweepRecord older = sweep;
  older.created_at -= 7200;
  const WorkerPresence gone = worker_presence(db, older);
  CHECK_FALSE(gone.alive);
  CHECK(gone.last_seen < runner::index::now_seconds() - 3500);
}

TEST_CASE("a trial whose run finished after its worker died is recorded as finished, not run again") {
  // `runner sweep` killed with SIGKILL while its trial ran its last step: the trial's run (sent SIGTERM by
  // PR_SET_PDEATHSIG after the step it was in, and which had no step left to stop before) finished, and nobody
  // recorded the trial's end. The next worker takes the trial over: it must record it finished from its run, not
  // continue it (a resume of a finished run without a checkpoint ran all of its steps again, from step 0).
  runner::testing::TempDir home("sweep-unwatched");
  runner::index::Database db = runner::index::open_index_for_writing(runner::testing::index_at(home.path));
  const SweepRecord sweep =
      open_sweep(db, spec_of({{"parameters", {{"lr", json::array({1, 2})}}}, {"method", "grid"}, {"metric", "m"}}));
  REQUIRE(claim_trial(db, sweep, "gone-host:1"));
  REQUIRE(claim_trial(db, sweep, "gone-host:1"));
  auto run_of = [&](std::int64_t trial) {
    runner::index::NewRun spec;
    spec.script = "/experiments/sh.lua";
    spec.sweep = sweep.sweep;
    spec.trial = trial;
    const runner::index::RunRecord run = runner::index::create_run(db, spec, home.path);
    runner::index::MetricWriter writer(runner::testing::index_at(home.path), run.run);
    writer.log("m", 30, 0.25 * static_cast<double>(trial), runner::index::now_seconds());
    writer.close();
    runner::index::record_heartbeat(db, run.run, 30, runner::index::now_seconds());
    return run.run;
  };
  // Trial 1's run finished; trial 2's is still ending (its process, here this one, lives).
  runner::index::finish_run(db, run_of(1), "finished", std::nullopt);
  const std::int64_t second = run_of(2);
  db.execute("UPDATE trials SET heartbeat_at = heartbeat_at - 3600");  // their worker is gone

  std::vector<TrialRecord> unwatched;
  CHECK_FALSE(claim_trial(db, sweep, "host-b:1", &unwatched));  // trial 2 waits for its run to end
  REQUIRE(unwatched.size() == 1);
  CHECK(unwatched[0].trial == 1);
  CHECK(unwatched[0].status == "finished");
  CHECK(unwatched[0].step == 30);
  CHECK(unwatched[0].metric == 0.25);
  CHECK_FALSE(finish_if_done(db, sweep));
  // Trial 2's run finishes once it was already stopped: recorded at the next claim.
  runner::index::finish_run(db, second, "finished", std::nullopt);
  CHECK_FALSE(claim_trial(db, sweep, "host-b:1", &unwatched));
  REQUIRE(unwatched.size() == 1);
  CHECK(unwatched[0].trial == 2);
  CHECK(unwatched[0].status == "finished");
  CHECK(finish_if_done(db, sweep));
  const std::vector<TrialRecord> trials = list_trials(db, sweep.sweep);
  REQUIRE(trials.size() == 2);
  for (const TrialRecord& trial : trials) {
    CHECK(trial.status == "finished");
    CHECK(trial.segments == 1);  // never started again
    CHECK(trial.step == 30);
  }
  CHECK(count_trials(sweep, trials).best_trial == 1);
}

TEST_CASE("takeover_after is how long a worker on another host and its trial's run may be silent before a takeover") {
  const json grid = {{"lr", json::array({1, 2, 3})}};
  CHECK(spec_of({{"parameters", grid}, {"method", "grid"}, {"metric", "m"}}).takeover_after == 60);
  CHECK_THROWS_WITH(spec_of({{"parameters", grid}, {"method", "grid"}, {"metric", "m"}, {"takeover_after", 5}}),
                    "sweeps/s.lua:2: 'takeover_after' must be a whole number from 10 to 604800, got 5");
  CHECK_THROWS_WITH(spec_of({{"parameters", grid}, {"method", "grid"}, {"metric", "m"}, {"takeover_after", 2.5}}),
                    "sweeps/s.lua:2: 'takeover_after' must be a whole number from 10 to 604800, got 2.5");

  runner::testing::TempDir home("sweep-takeover");
  runner::index::Database db = runner::index::open_index_for_writing(runner::testing::index_at(home.path));
  json fields = {{"parameters", grid}, {"method", "grid"}, {"metric", "m"}, {"takeover_after", 20}};
  const SweepRecord sweep = open_sweep(db, spec_of(fields));
  CHECK(sweep.spec.takeover_after == 20);
  CHECK(parse_sweep(sweep_json(sweep.spec)).takeover_after == 20);  // stored with the definition
  REQUIRE(claim_trial(db, sweep, "elsewhere:1"));
  // Trial 1's run, recorded by its process on host "elsewhere".
  runner::index::NewRun started;
  started.script = "/experiments/sh.lua";
  started.script_hash = "ab";
  started.device = "cpu";
  started.sweep = sweep.sweep;
  started.trial = 1;
  const runner::index::RunRecord run = runner::index::create_run(db, started, home.path);
  db.execute("UPDATE runs SET host = 'elsewhere'");
  auto silent_for = [&](int seconds) {
    const double then = runner::index::now_seconds() - seconds;
    db.execute(
        fmt::format("UPDATE trials SET heartbeat_at = {0} WHERE trial = 1; UPDATE runs SET heartbeat_at = {0}; "
                    "UPDATE sweep_workers SET heartbeat_at = {0}",
                    then));
  };
  add_worker(db, sweep, "elsewhere:1", "");

  // Silent for 15 s, under the sweep's 20: left alone (a new trial is handed out), the worker shown alive.
  silent_for(15);
  const auto second = claim_trial(db, sweep, "here:1");
  REQUIRE(second);
  CHECK(second->trial.trial == 2);
  CHECK(list_workers(db, sweep).front().alive);
  // Silent for 25 s: the worker is gone, its trial continued from its run, which is marked interrupted.
  silent_for(25);
  CHECK_FALSE(list_workers(db, sweep).front().alive);
  const auto taken = claim_trial(db, sweep, "here:1");
  REQUIRE(taken);
  CHECK(taken->trial.trial == 1);
  CHECK(taken->reason == "continued");
  CHECK(taken->resume_run == run.run);
  const runner::index::RunRecord interrupted = runner::index::load_run(db, run.run);
  CHECK(interrupted.status == "interrupted");
  CHECK(interrupted.error ==
        "no heartbeat from host elsewhere for 25 s (the sweep's takeover_after is 20 s): trial 1 "
        "was taken over by another worker");

  // Under the default 60 s the same 25 s of silence is not enough.
  fields["takeover_after"] = 60;
  SweepSpec patient_spec = spec_of(fields);
  patient_spec.name = "patient";
  const SweepRecord patient = open_sweep(db, patient_spec);
  REQUIRE(claim_trial(db, patient, "elsewhere:1"));
  db.execute(fmt::format("UPDATE trials SET heartbeat_at = {} WHERE sweep = {}", runner::index::now_seconds() - 25,
                         patient.sweep));
  const auto next = claim_trial(db, patient, "here:1");
  REQUIRE(next);
  CHECK(next->trial.trial == 2);
}

TEST_CASE("CPU slots count the cores the worker may use: RUNNER_CORES, its affinity, SLURM_CPUS_ON_NODE") {
  using runner::core::LaunchContext;
  CHECK(runner::core::launch_context_from_environment({{"SLURM_CPUS_ON_NODE", "3"}}).slurm_cpus == 3);
  CHECK_THROWS_WITH(runner::core::launch_context_from_environment({{"SLURM_CPUS_ON_NODE", "many"}}),
                    "environment variable SLURM_CPUS_ON_NODE='many' is not a whole number");
  LaunchContext given;
  given.cores = 5;
  given.slurm_cpus = 1;
  CHECK(runner::core::usable_cores(given).count == 5);  // RUNNER_CORES, as the sweep worker gives its trials
  CHECK(runner::core::usable_cores(given).source == "RUNNER_CORES");
  const runner::core::UsableCores all = runner::core::usable_cores(LaunchContext{});
  CHECK(all.count >= 1);
  CHECK(all.count <= static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

// ctest counts a case that prints SKIP as skipped whatever it checked before, so this one skips before any check.
TEST_CASE("CPU slots: more slots than the allocation's cores are refused, and the slots share the cores") {
  using runner::core::LaunchContext;
  const runner::core::UsableCores all = runner::core::usable_cores(LaunchContext{});
  if (all.count < 2) {
    WARN("SKIP: this process may use 1 core, so an allocation of fewer cannot be told apart");
    return;
  }
  LaunchContext slurm;
  slurm.slurm_cpus = 1;
  slurm.given_gpus = std::vector<std::string>{};  // no GPU: CPU slots
  CHECK(runner::core::usable_cores(slurm).count == 1);
  CHECK(runner::core::usable_cores(slurm).source == "SLURM_CPUS_ON_NODE");
  const LaunchContext saved = runner::core::launch_context();
  runner::core::set_launch_context(slurm);
  const SweepSpec two =
      spec_of({{"parameters", {{"lr", json::array({1, 2})}}}, {"method", "grid"}, {"metric", "m"}, {"slots", 2}});
  std::string refused;
  try {
    sweep_slots(two);
  } catch (const SweepError& error) {
    refused = error.what();
  }
  slurm.slurm_cpus = 0;
  runner::core::set_launch_context(slurm);
  const std::vector<Slot> slots = sweep_slots(two);
  runner::core::set_launch_context(saved);
  CHECK(refused ==
        "sweeps/s.lua:2: slots = 2 runs 2 processes at once on the CPU, more than the 1 core this worker may use "
        "(SLURM_CPUS_ON_NODE)");
  REQUIRE(slots.size() == 2);
  CHECK(slots[0].threads == all.count / 2);
}

namespace {

runner::sweep::SlurmJob hostile_job(const std::string& home) {
  runner::sweep::SlurmJob job;
  job.sweep = "lrs";
  job.sweep_file = home + "/sweep file's.lua";
  job.workers = 2;
  job.runner = "/opt/runner $(touch pwned)/runner";
  job.home = home;
  job.working_directory = home;
  job.sbatch_options = {"--partition", "gpu"};
  return job;
}

}  // namespace

TEST_CASE("the whole Slurm job script runs under bash with hostile values on every line, as they are", "[sweep]") {
  const runner::testing::TempDir folder;
  const std::string hostile = " with 'quotes' \"double\" $(touch pwned) `touch pwned` $HOME ; touch pwned";
  auto job = hostile_job(folder.path + "/home" + hostile);
  job.sweep = "lrs" + hostile;
  job.sweep_file = folder.path + "/sweep" + hostile + ".lua";
  job.index_url = "postgresql://me@db:5432/runs" + hostile;
  job.working_directory = folder.path + "/work" + hostile;
  job.runner = folder.path + "/bin" + hostile + "/runner";
  std::filesystem::create_directories(job.working_directory);
  std::filesystem::create_directories(job.home);
  std::filesystem::create_directories(folder.path + "/bin" + hostile);
  // A stand-in for runner: it writes what it was given, one item per line.
  const std::string record = folder.path + "/record.txt";
  {
    std::ofstream fake(job.runner);
    fake << "#!/bin/bash\n{ pwd; printf '%s\\n' \"$RUNNER_HOME\" \"$RUNNER_INDEX\" \"$@\"; } > '" << record << "'\n";
  }
  std::filesystem::permissions(job.runner, std::filesystem::perms::owner_all);
  const std::string script_path = folder.path + "/job.sh";
  {
    std::ofstream file(script_path);
    file << runner::sweep::slurm_job_script(job);
  }
  REQUIRE(std::system(("cd '" + folder.path + "' && SLURM_JOB_ID=7 bash '" + script_path + "'").c_str()) == 0);
  std::ifstream in(record);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  CHECK(lines ==
        std::vector<std::string>{job.working_directory, job.home, job.index_url, "sweep", "--join", job.sweep});
  for (const std::string& where : {folder.path, job.working_directory, job.home, folder.path + "/bin" + hostile})
    CHECK_FALSE(std::filesystem::exists(where + "/pwned"));
}

TEST_CASE("the Slurm job script quotes every value and refuses control characters", "[sweep]") {
  const runner::testing::TempDir folder;
  const std::string home = folder.path + "/home with 'quotes' $(touch pwned) `touch pwned`";
  const std::string script = runner::sweep::slurm_job_script(hostile_job(home));
  // Run the script's set-up lines (everything before the worker starts) in bash: the values arrive as they are
  // and nothing in them runs.
  const std::string setup = script.substr(0, script.find("# USR1"));
  const std::string script_path = folder.path + "/setup.sh", out_path = folder.path + "/out.txt";
  {
    std::ofstream file(script_path);
    file << "cd "
         << "'" << folder.path << "'\n"
         << setup.substr(0, setup.find("\ncd ") + 1) << "printf %s \"$RUNNER_HOME\"\n";
  }
  REQUIRE(std::system(("bash '" + script_path + "' > '" + out_path + "'").c_str()) == 0);
  std::ifstream out(out_path);
  const std::string printed((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  CHECK(printed == home);
  CHECK_FALSE(std::ifstream(folder.path + "/pwned").good());

  for (const auto& [what, change] : std::vector<std::pair<std::string, std::function<void(runner::sweep::SlurmJob&)>>>{
           {"RUNNER_HOME", [](auto& job) { job.home += "\ntouch pwned"; }},
           {"the sweep file's path", [](auto& job) { job.sweep_file = "/tmp/a\ntouch pwned\n.lua"; }},
           {"the sweep's name", [](auto& job) { job.sweep = "a\rb"; }},
           {"the working directory", [](auto& job) { job.working_directory += "\x1b[2J"; }},
           {"the sbatch option", [](auto& job) { job.sbatch_options = {"--comment=a\ntouch pwned"}; }},
           {"runner's path", [](auto& job) { job.runner += "\x7f"; }}}) {
    INFO(what);
    auto job = hostile_job(folder.path);
    change(job);
    CHECK_THROWS_WITH(runner::sweep::slurm_job_script(job),
                      Catch::Contains("--slurm: " + what) && Catch::Contains("holds a control character"));
  }
  auto too_many = hostile_job(folder.path);
  too_many.workers = 1000000000;
  CHECK_THROWS_WITH(runner::sweep::slurm_job_script(too_many),
                    "--slurm takes 1 to 10000 workers (array tasks), got 1000000000");
  too_many.workers = 10001;
  CHECK_THROWS_WITH(runner::sweep::slurm_job_script(too_many),
                    "--slurm takes 1 to 10000 workers (array tasks), got 10001");
  too_many.workers = 10000;
  CHECK(runner::sweep::slurm_job_script(too_many).find("#SBATCH --array=0-9999\n") != std::string::npos);
}
