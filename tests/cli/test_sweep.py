"""Sweeps end to end: sweep files, grid / random / TPE trials run as child processes, ASHA pauses and promotions
that resume from checkpoints, stops and kills that lose nothing, two workers, the result commands."""
import json
import math
import os
import pathlib
import re
import resource
import signal
import sqlite3
import subprocess
import threading
import time
import unittest

from runner_process import RUNNER, RunnerHomeTest

# A synthetic experiment whose metric is a known function of its config and step; a trainer so that it
# checkpoints and resumes like a real one. Each attempt appends the step it starts from and every step it runs
# to steps.txt in the run's directory (metric rows are replaced, so they cannot show a step run twice).
SYNTHETIC = """
local cfg = config { lr = 0.01, width = 4, steps = 9, fail_at = 0, sleep = 0.0, mode = "plain" }
local run = runner.start(cfg)
local model = nn.Linear(2, 1)
local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.001 }, progress = false }
run:restore { trainer = train }
local trace = io.open(run.dir .. "/steps.txt", "a")
trace:setvbuf("line")
trace:write("from ", run.step, "\\n")
for step = run.step + 1, cfg.steps do
  train:step(function() return model(torch.ones(2, 2)):pow(2):mean() end)
  trace:write(step, "\\n")
  if step == cfg.fail_at then error("trial failed on purpose at step " .. step) end
  run:log { score = (math.log10(cfg.lr) + 2) ^ 2 + cfg.width / 100 + 1 / step }
  if cfg.sleep > 0 then
    local t = runner.clock()
    while runner.clock() - t < cfg.sleep do end
  end
end
"""


# SYNTHETIC with a checkpoint every `checkpoint_every` steps, so that a trial killed outright goes on from one.
CHECKPOINTING = SYNTHETIC.replace('mode = "plain" }', 'mode = "plain", checkpoint_every = 5 }').replace(
    '  if cfg.sleep > 0 then', '  if step % cfg.checkpoint_every == 0 then run:checkpoint() end\n  if cfg.sleep > 0 then')


def holding(script):
    """SYNTHETIC or CHECKPOINTING that, once step `hold_at` has run, been logged (and checkpointed where due), waits
    until RUNNER_HOME/release exists: a test can act while a trial is at a known step, then let the trial go on."""
    return script.replace('mode = "plain"', 'mode = "plain", hold_at = 0').replace(
        '  if cfg.sleep > 0 then',
        '  if step == cfg.hold_at then\n'
        '    local since = runner.clock()\n'
        '    while not io.open(os.getenv("RUNNER_HOME") .. "/release") do\n'
        '      if runner.clock() - since > 300 then error("not released within 300 s") end\n'
        '    end\n'
        '  end\n'
        '  if cfg.sleep > 0 then')


HOLDING = holding(SYNTHETIC)

# SYNTHETIC whose trials meet when `meet` names a directory: each one, once its run has started, leaves a file named
# after its run there and waits (up to 60 s) until another trial's file is there too, then writes the names it saw to
# met.txt in its run's directory. Two trials that each saw the other ran at the same time.
MEETING = SYNTHETIC.replace('mode = "plain" }', 'mode = "plain", meet = "" }').replace(
    'run:restore { trainer = train }\n',
    'run:restore { trainer = train }\n'
    'if cfg.meet ~= "" then\n'
    '  io.open(cfg.meet .. "/" .. run.name, "w"):close()\n'
    '  local others, since = {}, runner.clock()\n'
    '  while #others == 0 and runner.clock() - since < 60 do\n'
    '    os.execute("sleep 0.05")\n'
    '    local ls = io.popen("ls " .. cfg.meet)\n'
    '    for name in ls:lines() do if name ~= run.name then others[#others + 1] = name end end\n'
    '    ls:close()\n'
    '  end\n'
    '  local met = io.open(run.dir .. "/met.txt", "w")\n'
    '  met:write(table.concat(others, " "))\n'
    '  met:close()\n'
    'end\n')


def score(lr, width, step):
    return (math.log10(lr) + 2) ** 2 + width / 100 + 1 / step


class SweepTest(RunnerHomeTest):
    def setUp(self):
        super().setUp()
        self.script("synthetic.lua", SYNTHETIC)
        self.env = {**self.env, "OMP_NUM_THREADS": "1"}

    def sweep_file(self, name, body):
        return self.script(name, "return runner.sweep {\n" + body + "\n}\n")

    def sql(self, query, *args):
        with sqlite3.connect(self.home / "index.db") as db:
            return db.execute(query, args).fetchall()

    def attempts(self, run_id):
        """The steps that each attempt of the run ran, from its steps.txt, after asserting that every attempt
        started where the one before it stopped and that together they ran each step once."""
        run_dir = self.home / self.sql("SELECT dir FROM runs WHERE id = ?", run_id)[0][0]
        attempts, ran = [], []
        for line in (run_dir / "steps.txt").read_text().splitlines():
            if line.startswith("from "):
                self.assertEqual(int(line[5:]), len(ran), f"run {run_id}: an attempt started at the wrong step")
                attempts.append([])
            else:
                attempts[-1].append(int(line))
                ran.append(int(line))
        self.assertEqual(ran, list(range(1, len(ran) + 1)), f"run {run_id}: steps run twice or skipped")
        return attempts

    def wait_for_steps(self, trials, steps, timeout=120):
        """Waits until `trials` trials each have a run past `steps`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if (self.home / "index.db").exists():
                try:
                    rows = self.sql("SELECT count(*) FROM runs WHERE trial IS NOT NULL AND step >= ?", steps)
                    if rows[0][0] >= trials:
                        return
                except sqlite3.OperationalError:
                    pass
            time.sleep(0.2)
        self.fail("the trials did not get going")

    def wait_for_trial_step(self, trial, step, timeout=120):
        """Waits until trial `trial` has run step `step`: its run's steps.txt has the step as soon as it ran (the
        index's step lags by ~1 s)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                rows = self.sql("SELECT dir FROM runs WHERE trial = ?", trial) if (self.home / "index.db").exists() else []
            except sqlite3.OperationalError:
                rows = []
            trace = self.home / rows[0][0] / "steps.txt" if rows else None
            if trace and trace.exists() and str(step) in trace.read_text().splitlines():
                return
            time.sleep(0.1)
        self.fail(f"trial {trial} did not reach step {step}")

    def wait_for_checkpoint(self, trial, step, timeout=120):
        """Waits until trial `trial`'s checkpoint of step `step` is recorded in the index: its files were written
        and read back (checkpoints are saved in the background, so a run past the step may still be saving it)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                rows = self.sql("SELECT count(*) FROM checkpoints c JOIN runs r ON r.run = c.run "
                                "WHERE r.trial = ? AND c.step = ?", trial, step)
            except sqlite3.OperationalError:
                rows = [(0,)]
            if rows[0][0] > 0:
                return
            time.sleep(0.1)
        self.fail(f"trial {trial}'s checkpoint of step {step} was not recorded")

    def trials(self, sweep):
        return self.sql("SELECT t.trial, t.status, t.metric, t.step, t.rung, t.params, r.id FROM trials t "
                        "JOIN sweeps s USING (sweep) LEFT JOIN runs r ON r.run = t.run WHERE s.name = ? ORDER BY t.trial",
                        sweep)


class Definitions(SweepTest):
    def test_grid_runs_every_point_and_the_best_trial_is_the_best_run(self):
        self.sweep_file("grid.lua", """
          script = "synthetic.lua",
          parameters = { lr = { 0.001, 0.01, 0.1 }, width = runner.sweep.int(2, 4, { step = 2 }) },
          method = "grid", metric = "score",
        """)
        result = self.runner("sweep", "grid.lua", check=0, timeout=300)
        trials = self.trials("grid")
        self.assertEqual(len(trials), 6, result.stdout)
        points = sorted((json.loads(t[5])["lr"], json.loads(t[5])["width"]) for t in trials)
        self.assertEqual(points, sorted((lr, w) for lr in (0.001, 0.01, 0.1) for w in (2, 4)))
        for trial, status, metric, step, _, params, run_id in trials:
            p = json.loads(params)
            self.assertEqual((status, step), ("finished", 9))
            self.assertAlmostEqual(metric, score(p["lr"], p["width"], 9), places=9)
        # the best trial is the run a query over the runs finds best
        best = self.sql("SELECT r.id FROM runs r JOIN metric_latest m ON m.run = r.run AND m.key = 'score' "
                        "ORDER BY m.value LIMIT 1")[0][0]
        shown = json.loads(self.runner("sweep", "show", "grid", "--json", check=0).stdout)
        self.assertEqual([row["run"] for row in shown if row["best"] == 1], [best])
        self.assertEqual(shown[0]["lr"], 0.01)
        self.assertEqual(shown[0]["width"], 2)
        self.assertIn("best: trial", result.stdout)
        self.assertIn("synthetic.lua lr=0.01 width=2", result.stdout)
        text = self.runner("sweep", "show", "grid", check=0).stdout
        self.assertIn("sweep grid (1): finished, grid, 6 of 6 trials done (6 finished, 0 pruned, 0 failed) over lr, width; "
                      "score (min)", text)
        self.assertRegex(text, r"best \(trial \d+, score 0\.13111\d*\): runner \S*synthetic\.lua lr=0\.01 width=2")
        runs = json.loads(self.runner("runs", "--sweep", "grid", "--json", check=0).stdout)
        self.assertEqual(sorted(r["trial"] for r in runs), [1, 2, 3, 4, 5, 6])
        # The swept parameters are columns of their own.
        self.assertEqual(sorted((r["lr"], r["width"]) for r in runs),
                         [(lr, width) for lr in (0.001, 0.01, 0.1) for width in (2, 4)])
        sweeps = json.loads(self.runner("sweeps", "--json", check=0).stdout)
        self.assertEqual([(s["name"], s["status"], s["trials"], s["done"]) for s in sweeps], [("grid", "finished", 6, 6)])
        report = self.runner("report", "grid", "-o", "sweep.html", check=0)
        self.assertEqual(report.stdout, "wrote sweep.html (sweep grid, 6 trials)\n")
        html = (self.dir / "sweep.html").read_text()
        self.assertIn("<h1>runner sweep report: grid</h1>", html)
        self.assertIn("score by lr", html)
        self.assertIn("score by width", html)
        self.assertIn("synthetic.lua lr=0.01 width=2</pre>", html)
        # One point per trial in each of the two scatter charts (the curves' few values have markers of their own).
        self.assertEqual(html.count("<circle") - html.count('<circle class="marker"'), 12)
        self.assertGreater(html.count('<circle class="marker"'), 0)
        self.assertNotIn("nan", html.lower().replace("nanoseconds", ""))
        self.assertIn(">step</text>", html)
        self.runner("report", "grid", "--x", "relative", "-o", "relative.html", check=0)
        self.assertIn(">time since the start</text>", (self.dir / "relative.html").read_text())
        # running the finished sweep again starts nothing
        again = self.runner("sweep", "grid.lua", check=0)
        self.assertNotIn("started", again.stdout)
        self.assertEqual(len(self.trials("grid")), 6)

    def assert_two_trials_ran_at_once(self, sweep):
        """Trials 1 and 2 of the sweep (MEETING) each saw the other's file while it ran: their runs overlapped."""
        (one, one_dir), (two, two_dir) = self.sql(
            "SELECT r.name, r.dir FROM trials t JOIN sweeps s USING (sweep) JOIN runs r ON r.run = t.run "
            "WHERE s.name = ? AND t.trial IN (1, 2) ORDER BY t.trial", sweep)
        met = [(self.home / d / "met.txt").read_text().split() for d in (one_dir, two_dir)]
        self.assertEqual(met, [[two], [one]], f"sweep {sweep}: trials 1 and 2 ({one}, {two}) did not run at the same "
                                             "time in the two slots (each lists the other trials it saw running)")

    def test_random_is_reproducible_from_the_seed_and_fills_two_slots(self):
        self.script("meeting.lua", MEETING)
        for sweep in ("r1", "r2"):
            (self.dir / f"meet-{sweep}").mkdir()
        self.sweep_file("random.lua", f"""
          script = "meeting.lua", name = "r1",
          parameters = {{ lr = runner.sweep.log_uniform(1e-4, 1), width = {{ 1, 2, 3 }} }},
          fixed = {{ steps = 3, meet = "{self.dir / 'meet-r1'}" }}, trials = 4, seed = 7, metric = "score", slots = 2,
        """)
        self.runner("sweep", "random.lua", check=0, timeout=300)
        first = [(t[1], t[5]) for t in self.trials("r1")]
        self.assertEqual([status for status, _ in first], ["finished"] * 4)
        for _, params in first:
            p = json.loads(params)
            self.assertTrue(1e-4 <= p["lr"] <= 1 and p["width"] in (1, 2, 3), p)
        self.assertEqual(len({params for _, params in first}), 4)
        self.assert_two_trials_ran_at_once("r1")
        (self.dir / "random.lua").write_text((self.dir / "random.lua").read_text().replace('"r1"', '"r2"')
                                             .replace("meet-r1", "meet-r2"))
        self.runner("sweep", "random.lua", check=0, timeout=300)
        self.assertEqual([t[5] for t in self.trials("r2")], [params for _, params in first])
        self.assert_two_trials_ran_at_once("r2")
        self.assertEqual(self.sql("SELECT count(*) FROM runs WHERE json_extract(config, '$.steps') = 3"), [(8,)])

    def test_bad_sweep_files_name_their_line(self):
        cases = {
            "unknown parameter": ("parameters = { lrr = { 1, 2 } },\n  metric = \"score\", trials = 2,",
                                  r"bad\.lua:3: parameter 'lrr' is not a config key of synthetic\.lua \(its keys: fail_at, "
                                  r"lr, mode, sleep, steps, width\); did you mean 'lr'\?"),
            "empty space": ("parameters = {},\n  metric = \"score\", trials = 2,",
                            r"bad\.lua:3: the sweep has an empty search space"),
            "bad range": ("parameters = {\n    lr = runner.sweep.log_uniform(0, 1) },\n  metric = \"score\", trials = 2,",
                          r"bad\.lua:4: parameter 'lr': log_uniform needs 0 < low < high, got 0 and 1"),
            "unknown method": ("parameters = { lr = { 1, 2 } },\n  method = \"bayes\", metric = \"score\", trials = 2,",
                               r"bad\.lua:4: unknown method 'bayes' \(known: grid, random, tpe\)"),
            "wrong type": ("parameters = { mode = { 1, 2 } },\n  metric = \"score\", trials = 2,",
                           r"bad\.lua:3: 'mode' takes a string \(its default is \"plain\"\), got 1"),
            "fractional steps": ("parameters = { steps = runner.sweep.uniform(1, 5) },\n  metric = \"score\", trials = 2,",
                                 r"bad\.lua:3: 'steps' takes whole numbers: use runner\.sweep\.int\(1, 5\) instead of uniform"),
            "misspelt field": ("parameters = { lr = { 1, 2 } },\n  metric = \"score\", trails = 2,",
                               r"bad\.lua:4: unknown sweep field 'trails' .*did you mean 'trials'\?"),
            "wrong fixed type": ("parameters = { lr = { 1, 2 } },\n  fixed = {\n    mode = 1 },\n  metric = \"score\", "
                                 "trials = 2,",
                                 r"bad\.lua:5: 'mode' takes a string \(its default is \"plain\"\), got 1"),
        }
        for case, (body, pattern) in cases.items():
            with self.subTest(case):
                self.script("bad.lua", "-- a sweep\nreturn runner.sweep {\n  " + body + "\n  script = \"synthetic.lua\",\n}\n")
                result = self.runner("sweep", "bad.lua", check=2)
                self.assertRegex(result.stderr, "runner sweep: " + pattern)
                self.assertFalse((self.home / "index.db").exists() and self.sql("SELECT count(*) FROM trials")[0][0] > 0)

    def test_print_config_reports_the_keys_and_checks_overrides(self):
        result = self.runner("--print-config", "synthetic.lua", check=0)
        keys = json.loads(result.stdout)["keys"]
        self.assertEqual(keys["steps"], {"default": 9, "integer": True})
        self.assertEqual(keys["sleep"], {"default": 0, "integer": False})
        self.assertEqual(keys["mode"], {"default": "plain", "integer": False})
        self.assertFalse((self.home / "index.db").exists())  # nothing after config {} ran
        bad = self.runner("--print-config", "synthetic.lua", "steps=2.5", check=2)
        self.assertIn("bad value '2.5' for config key 'steps': expected a whole number", bad.stderr)


class Scheduling(SweepTest):
    def test_asha_keeps_the_best_third_and_resumes_promoted_trials(self):
        lrs = [1e-4, 0.3, 0.01, 3e-4, 0.03, 1e-3, 3e-3, 1.0, 0.1]
        self.sweep_file("asha.lua", f"""
          script = "synthetic.lua",
          parameters = {{ lr = {{ {", ".join(repr(v) for v in lrs)} }} }},
          fixed = {{ steps = 27 }}, method = "grid", metric = "score",
          prune = {{ "asha", min_steps = 3, reduction = 3 }},
        """)
        result = self.runner("sweep", "asha.lua", check=0, timeout=600)
        trials = {json.loads(t[5])["lr"]: t for t in self.trials("asha")}
        self.assertEqual(len(trials), 9, result.stdout)
        # The best point runs to the end; each trial ends at a rung (3 or 9 steps) or at 27.
        best = trials[0.01]
        self.assertEqual((best[1], best[3]), ("finished", 27), result.stdout)
        self.assertAlmostEqual(best[2], score(0.01, 4, 27), places=9)
        for lr, (_, status, metric, step, rung, _, _) in trials.items():
            self.assertIn((status, step), [("pruned", 3), ("pruned", 9), ("finished", 27)], (lr, result.stdout))
        rungs = self.sql("SELECT trial, rung, step, value FROM trial_rungs ORDER BY rung, trial")
        # Rungs count from 1 in the table as in the output ("reached rung 1 at step 3").
        at1 = [r for r in rungs if r[1] == 1]
        self.assertEqual(len(at1), 9)
        self.assertTrue(all(r[2] == 3 for r in at1))
        self.assertEqual({r[1] for r in rungs} - {1}, {2})
        self.assertTrue(all(r[2] == 9 for r in rungs if r[1] == 2))
        # Everything that went past rung 1 was in the best third of rung 1's results when it was promoted; at
        # the end, the best third of all 9 is among those that went on.
        went_on = {t for t, rung, _, _ in rungs if rung == 2}
        by_value = sorted(at1, key=lambda r: r[3])
        self.assertTrue({r[0] for r in by_value[:3]} <= went_on | {trials[0.01][0]})
        self.assertLessEqual(len(went_on), 5)
        # Far fewer steps than the grid: every trial's run reached its last step once (resumed, not restarted).
        spent = sum(t[3] for t in trials.values())
        self.assertLessEqual(spent, 9 * 27 / 2)
        run = self.sql("SELECT r.run, r.attempts FROM runs r JOIN trials t ON t.run = r.run WHERE t.trial = ?",
                       best[0])[0]
        self.assertEqual(run[1], 3)  # started, continued past rung 0, then past rung 1
        steps = [s for (s,) in self.sql("SELECT step FROM metrics WHERE run = ? AND key = 'score' ORDER BY step", run[0])]
        self.assertEqual(steps, list(range(1, 28)))
        self.assertEqual([len(a) for a in self.attempts(best[6])], [3, 6, 18])
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [(9,)])
        # A trial's run is `paused` at its rung, and `pruned` with it when the sweep ends it there.
        self.assertEqual(sorted(self.sql("SELECT t.status, r.status, count(*) FROM trials t JOIN runs r ON r.run = t.run "
                                         "GROUP BY 1, 2")),
                         [("finished", "finished", 1), ("pruned", "pruned", 8)])
        self.assertEqual(self.sql("SELECT DISTINCT a.status FROM attempts a JOIN trials t ON t.run = a.run "
                                  "WHERE t.status = 'pruned' AND a.attempt < (SELECT attempts FROM runs WHERE run = a.run)"),
                         [("paused",)] if any(t[3] == 9 for t in trials.values()) else [])
        self.assertIn("reached rung 1 at step 3", result.stdout)
        self.assertIn("promoted past rung", result.stdout)
        # Disk: a trial paused again dropped its earlier pause's checkpoint; the pruned ones keep none at the end.
        self.assertRegex(result.stdout, r"deleted 1 checkpoint trial \d+ no longer needs \(.+ freed\)")
        self.assertRegex(result.stdout, r"deleted 8 checkpoints the pruned trials no longer need \(.+ freed\)")
        self.assertEqual(self.sql("SELECT count(*) FROM checkpoints WHERE run IN "
                                  "(SELECT run FROM trials WHERE status = 'pruned')"), [(0,)])
        for (folder,) in self.sql("SELECT r.dir FROM runs r JOIN trials t ON t.run = r.run WHERE t.status = 'pruned'"):
            self.assertEqual(list((self.home / folder).glob("checkpoints/step-*")), [], folder)
            self.assertTrue((self.home / folder / "steps.txt").exists())
        self.assertEqual(self.sql("SELECT count(*) FROM checkpoints c JOIN trials t ON t.run = c.run "
                                  "WHERE t.status = 'finished' AND c.kept"), [(1,)])

    def test_a_failing_trial_is_recorded_and_the_limit_stops_the_sweep(self):
        self.sweep_file("fails.lua", """
          script = "synthetic.lua",
          parameters = { width = { 1, 2, 3, 4 } }, fixed = { fail_at = 2 },
          method = "grid", metric = "score", max_failures = 2,
        """)
        result = self.runner("sweep", "fails.lua", check=1, timeout=300)
        self.assertIn("runner: sweep fails failed: 2 trials failed (max_failures = 2)", result.stderr)
        trials = self.trials("fails")
        self.assertEqual([t[1] for t in trials], ["failed", "failed"])
        self.assertIn("trial failed on purpose at step 2", result.stdout)
        error = self.sql("SELECT error FROM trials WHERE trial = 1")[0][0]
        self.assertIn("exited with status 1", error)

    def test_ctrl_c_stops_trials_with_a_checkpoint_and_the_same_command_continues(self):
        self.sweep_file("stop.lua", """
          script = "synthetic.lua",
          parameters = { width = { 1, 2, 3 } }, fixed = { steps = 40, sleep = 0.05 },
          method = "grid", metric = "score", slots = 2,
        """)
        process = subprocess.Popen([RUNNER, "sweep", "stop.lua"], cwd=self.dir, env=self.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.wait_for_steps(2, 5)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
        self.assertEqual(process.returncode, 130, out + err)
        self.assertIn("the same command (or runner sweep --join stop) continues it", out)
        stopped = self.trials("stop")
        self.assertEqual([t[1] for t in stopped], ["stopped", "stopped"])
        self.assertEqual(self.sql("SELECT status FROM sweeps"), [("stopped",)])
        checkpoints = self.sql("SELECT count(*) FROM checkpoints")[0][0]
        self.assertEqual(checkpoints, 2)
        self.runner("sweep", "stop.lua", check=0, timeout=300)
        done = self.trials("stop")
        self.assertEqual([t[1] for t in done], ["finished"] * 3)
        self.assertEqual([t[6] for t in done[:2]], [t[6] for t in stopped])  # the same runs, continued
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [(3,)])
        for run_id in [t[6] for t in done]:
            steps = self.sql("SELECT count(DISTINCT m.step), max(m.step) FROM metrics m JOIN runs r USING (run) "
                             "WHERE r.id = ? AND m.key = 'score'", run_id)
            self.assertEqual(steps, [(40, 40)])
            self.assertEqual(sum(len(a) for a in self.attempts(run_id)), 40)

    def kill_9_at(self, step):
        """Runs the sweep killed.lua (4 trials of 30 steps of HOLDING, held at `step`), kills it with SIGKILL while
        trial 1 holds after `step`, lets the trial go on (it got SIGTERM from PR_SET_PDEATHSIG), and runs the sweep
        again; returns that run's result."""
        self.script("synthetic.lua", HOLDING)
        self.sweep_file("killed.lua", f"""
          script = "synthetic.lua",
          parameters = {{ width = {{ 1, 2, 3, 4 }} }}, fixed = {{ steps = 30, sleep = 0.05, hold_at = {step} }},
          method = "grid", metric = "score",
        """)
        process = subprocess.Popen([RUNNER, "sweep", "killed.lua"], cwd=self.dir, env=self.env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_for_trial_step(1, step)
        process.kill()
        process.wait()
        (self.home / "release").touch()
        time.sleep(1)
        return self.runner("sweep", "killed.lua", check=0, timeout=300)

    def test_kill_9_of_the_sweep_loses_and_repeats_nothing(self):
        result = self.kill_9_at(20)
        trials = self.trials("killed")
        self.assertEqual([(t[0], t[1], t[3]) for t in trials], [(n, "finished", 30) for n in (1, 2, 3, 4)], result.stdout)
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [(4,)])
        attempts = self.sql("SELECT attempts FROM runs WHERE trial = 1")[0][0]
        self.assertEqual(attempts, 2)  # trial 1 continued from the checkpoint its SIGTERM saved
        self.assertIn("trial 1 started (continued from step 20)", result.stdout)
        for trial in trials:
            self.assertEqual(sum(len(a) for a in self.attempts(trial[6])), 30)
        self.assertEqual([len(a) for a in self.attempts(trials[0][6])], [20, 10])

    def test_a_trial_that_finished_after_kill_9_of_the_sweep_is_recorded_not_run_again(self):
        # The sweep is killed while trial 1 runs its last step: its SIGTERM finds no step left to stop before, so
        # the run finishes, with nobody to record the trial's end. The next worker records it from the run.
        result = self.kill_9_at(30)
        trials = self.trials("killed")
        self.assertEqual([(t[0], t[1], t[3]) for t in trials], [(n, "finished", 30) for n in (1, 2, 3, 4)], result.stdout)
        self.assertAlmostEqual(trials[0][2], score(0.01, 1, 30), places=9)
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [(4,)])
        self.assertEqual(self.sql("SELECT attempts FROM runs WHERE trial = 1"), [(1,)])
        self.assertEqual(self.sql("SELECT segments FROM trials WHERE trial = 1"), [(1,)])
        self.assertRegex(result.stdout, r"trial 1 ended while no worker watched it: finished at step 30, score \S+ "
                                        r"\(recorded from its run, not run again\)")
        self.assertNotIn("trial 1 started", result.stdout)
        for trial in trials:
            self.assertEqual([len(a) for a in self.attempts(trial[6])], [30])

    def test_two_workers_run_every_trial_exactly_once(self):
        self.sweep_file("shared.lua", """
          script = "synthetic.lua",
          parameters = { width = { 1, 2, 3, 4, 5, 6 } }, fixed = { steps = 4, sleep = 0.05 },
          method = "grid", metric = "score",
        """)
        first = subprocess.Popen([RUNNER, "sweep", "shared.lua"], cwd=self.dir, env=self.env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.wait_for_steps(1, 1)
        second = self.runner("sweep", "--join", "shared", check=0, timeout=300)
        out, err = first.communicate(timeout=300)
        self.assertEqual(first.returncode, 0, out + err)
        trials = self.trials("shared")
        self.assertEqual([(t[0], t[1]) for t in trials], [(n, "finished") for n in range(1, 7)])
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [(6,)])
        started = out.count(" started (new)") + second.stdout.count(" started (new)")
        self.assertEqual(started, 6)
        self.assertGreater(second.stdout.count(" started (new)"), 0, second.stdout)

    def test_workers_on_one_host_share_its_cores(self):
        """Each trial gets the cores divided by the slots of every worker on the host, pinned to cores of its own: a
        worker that joins while a trial holds every core waits for them, then two trials run with a core each."""
        self.script("held.lua", SYNTHETIC.replace('mode = "plain" }', 'mode = "plain", hold_at = 1 }').replace(
            '  if cfg.sleep > 0 then',
            '  if step == cfg.hold_at then\n'
            '    local since = runner.clock()\n'
            '    while not io.open(os.getenv("RUNNER_HOME") .. "/release-" .. cfg.width) do\n'
            '      if runner.clock() - since > 300 then error("not released within 300 s") end\n'
            '      os.execute("sleep 0.05")\n'
            '    end\n'
            '  end\n'
            '  if cfg.sleep > 0 then'))
        self.sweep_file("shared.lua", """
          script = "held.lua", parameters = { width = { 1, 2, 3 } }, fixed = { steps = 2 }, method = "grid",
          metric = "score",
        """)
        env = {**self.env, "RUNNER_CORES": "2", "CUDA_VISIBLE_DEVICES": ""}
        del env["OMP_NUM_THREADS"]
        self.home.mkdir(exist_ok=True)
        outputs = [open(self.dir / f"worker-{n}.out", "w+") for n in (1, 2)]
        self.addCleanup(lambda: [output.close() for output in outputs])
        first = subprocess.Popen([RUNNER, "sweep", "shared.lua"], cwd=self.dir, env=env, text=True,
                                 stdout=outputs[0], stderr=subprocess.STDOUT)
        second = None
        try:
            self.wait_for_trial_step(1, 1)
            second = subprocess.Popen([RUNNER, "sweep", "--join", "shared"], cwd=self.dir, env=env, text=True,
                                      stdout=outputs[1], stderr=subprocess.STDOUT)
            deadline = time.time() + 120
            while "waiting for free cores on this host" not in (self.dir / "worker-2.out").read_text():
                self.assertLess(time.time(), deadline, "the second worker did not wait for the cores trial 1 holds")
                self.assertIsNone(second.poll(), (self.dir / "worker-2.out").read_text())
                time.sleep(0.1)
            (self.home / "release-1").touch()
            self.wait_for_trial_step(2, 1)
            self.wait_for_trial_step(3, 1)
            (self.home / "release-2").touch()
            (self.home / "release-3").touch()
            self.assertEqual(first.wait(timeout=300), 0, (self.dir / "worker-1.out").read_text())
            self.assertEqual(second.wait(timeout=300), 0, (self.dir / "worker-2.out").read_text())
        finally:
            for process in (first, second):
                if process and process.poll() is None:
                    process.kill()
                    process.wait()
        texts = [(self.dir / f"worker-{n}.out").read_text() for n in (1, 2)]
        started = {int(m[0]): (n, m[1]) for n, text in enumerate(texts, 1)
                   for m in re.findall(r"trial (\d) started \(new\): width=\d \[(.*)\]", text)}
        cpus = sorted(os.sched_getaffinity(0))[:2]
        self.assertEqual(started[1], (1, f"2 threads on CPUs {cpus[0]},{cpus[1]}"), texts)
        # trials 2 and 3 ran at once (each held at step 1 until both had got there), one per worker, a core each
        self.assertEqual({started[2][0], started[3][0]}, {1, 2}, texts)
        self.assertEqual({started[2][1], started[3][1]}, {f"1 thread on CPU {cpu}" for cpu in cpus}, texts)
        self.assertEqual([(t[0], t[1]) for t in self.trials("shared")], [(n, "finished") for n in (1, 2, 3)])


class Failures(SweepTest):
    """Issue 36: killed trials, a rung too small to promote, a full disk under the worker, dead workers."""

    def test_asha_runs_the_best_of_the_last_rung_with_results_to_the_end(self):
        # 3 points, rungs at 3 and 9 of 27 steps: rung 1 promotes its best 1 of 3, rung 2 gets that one result and
        # can never promote; its best runs to the end, so the sweep has a best trial and command.
        self.sweep_file("three.lua", """
          script = "synthetic.lua",
          parameters = { lr = { 0.001, 0.01, 0.1 } },
          fixed = { steps = 27 }, method = "grid", metric = "score",
          prune = { "asha", min_steps = 3, reduction = 3 },
        """)
        result = self.runner("sweep", "three.lua", check=0, timeout=300)
        trials = {json.loads(t[5])["lr"]: t for t in self.trials("three")}
        self.assertEqual({lr: (t[1], t[3]) for lr, t in trials.items()},
                         {0.001: ("pruned", 3), 0.01: ("finished", 27), 0.1: ("pruned", 3)}, result.stdout)
        warning = ("runner sweep: three.lua:6: warning: ASHA's rung 2 (step 9) is reached by at most 1 trial, fewer than "
                   "reduction = 3, so it never promotes: its best trial runs to the end once nothing else is left")
        self.assertIn(warning, result.stderr)
        self.assertIn(warning, self.runner("sweep", "--dry-run", "three.lua", check=0).stderr)
        best = trials[0.01]
        self.assertAlmostEqual(best[2], score(0.01, 4, 27), places=9)
        self.assertEqual([len(a) for a in self.attempts(best[6])], [3, 6, 18])  # resumed at each rung, never repeated
        self.assertIn(f"trial {best[0]} started (the best at rung 2, the last rung with results: runs to the end from "
                      "step 9)", result.stdout)
        self.assertRegex(result.stdout, rf"best: trial {best[0]} with score \S+: runner \S*synthetic\.lua lr=0\.01 steps=27")
        shown = self.runner("sweep", "show", "three", check=0).stdout
        self.assertRegex(shown, rf"best \(trial {best[0]}, score \S+\): runner \S*synthetic\.lua lr=0\.01 steps=27")

    def test_a_trial_killed_by_a_signal_is_retried_from_its_checkpoint(self):
        # The OOM killer's way: SIGKILL from outside, no checkpoint at the kill. retries = 1 (the default) continues
        # the trial's run from its last checkpoint (every 5 steps), before anything else.
        self.script("synthetic.lua", CHECKPOINTING)
        self.sweep_file("killed.lua", """
          script = "synthetic.lua",
          parameters = { width = { 1, 2 } }, fixed = { steps = 40, sleep = 0.1 },
          method = "grid", metric = "score",
        """)
        process = subprocess.Popen([RUNNER, "sweep", "killed.lua"], cwd=self.dir, env=self.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.wait_for_steps(1, 12)
        (pid, step), = self.sql("SELECT pid, step FROM runs WHERE trial = 1")
        os.kill(pid, signal.SIGKILL)
        out, err = process.communicate(timeout=300)
        self.assertEqual(process.returncode, 0, out + err)
        trials = self.trials("killed")
        self.assertEqual([(t[0], t[1], t[3]) for t in trials], [(1, "finished", 40), (2, "finished", 40)], out)
        self.assertEqual(self.sql("SELECT trial, retries FROM trials ORDER BY trial"), [(1, 1), (2, 0)])
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [(2,)])
        self.assertRegex(out, r"trial 1 was killed by signal 9 \(SIGKILL\) at step \d+: it goes on from its last "
                              r"checkpoint \(retry 1 of 1\)")
        self.assertRegex(out, r"trial 1 started \(retry 1 of 1: killed by signal 9 \(SIGKILL\) at step \d+")
        self.assertLess(out.index("trial 1 started (retry"), out.index("trial 2 started"))
        # Two attempts: the second starts at the last checkpoint before the kill, and from there every step runs
        # once; the steps after that checkpoint that the killed attempt ran are run again.
        run_dir = self.home / self.sql("SELECT dir FROM runs WHERE trial = 1")[0][0]
        lines = (run_dir / "steps.txt").read_text().splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("from ")]
        self.assertEqual(len(starts), 2)
        first = [int(x) for x in lines[starts[0] + 1:starts[1]]]
        second = [int(x) for x in lines[starts[1] + 1:]]
        resumed_from = int(lines[starts[1]][5:])
        self.assertEqual(resumed_from % 5, 0)
        self.assertGreaterEqual(resumed_from, 5)
        self.assertEqual(first, list(range(1, len(first) + 1)))
        self.assertLessEqual(resumed_from, first[-1])
        self.assertEqual(second, list(range(resumed_from + 1, 41)))
        steps = self.sql("SELECT count(DISTINCT m.step), max(m.step) FROM metrics m JOIN runs r USING (run) "
                         "WHERE r.trial = 1 AND m.key = 'score'")
        self.assertEqual(steps, [(40, 40)])

    def test_a_full_disk_under_the_worker_pauses_its_index_writes_and_the_sweep_goes_on(self):
        # The worker's writes to the index fail for real, as on a full disk: its file size limit (RLIMIT_FSIZE) is
        # set to 0 while it runs, so every write(2) to a file fails with EFBIG (SIGXFSZ is ignored, so it is not
        # killed). The trial processes were started before, with no limit, and go on writing. Trial 1 ends while the
        # limit holds, so its end cannot be recorded; then the limit goes back.
        self.sweep_file("disk.lua", """
          script = "synthetic.lua",
          parameters = { width = { 1, 2 } }, fixed = { steps = 60, sleep = 0.1 },
          method = "grid", metric = "score",
        """)

        def ignore_sigxfsz():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

        process = subprocess.Popen([RUNNER, "sweep", "disk.lua"], cwd=self.dir, env=self.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ignore_sigxfsz)
        self.wait_for_steps(1, 30)
        limits = resource.prlimit(process.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (0, limits[1]))
        deadline = time.time() + 60
        while self.sql("SELECT status FROM runs WHERE trial = 1") != [("finished",)] and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(6)  # the worker's heartbeat and its record of trial 1's end fail meanwhile
        self.assertEqual(self.sql("SELECT status FROM trials WHERE trial = 1"), [("running",)])
        self.assertIsNone(process.poll(), "the worker died")
        resource.prlimit(process.pid, resource.RLIMIT_FSIZE, limits)
        out, err = process.communicate(timeout=300)
        self.assertEqual(process.returncode, 0, out + err)
        self.assertRegex(out, r"cannot write to the index \([a-z' ]+\): .*; trying again while the trials go on")
        self.assertRegex(out, r"the index takes writes again \([a-z' ]+, after \d+ failed tr(y|ies)\)")
        self.assertEqual([(t[0], t[1], t[3]) for t in self.trials("disk")], [(1, "finished", 60), (2, "finished", 60)])
        self.assertEqual(self.sql("SELECT status FROM sweeps"), [("finished",)])
        self.assertIn("best: trial 1 with score", out)

    def test_a_trial_stopped_by_a_full_disk_is_retried_from_its_checkpoint(self):
        # The trial's writes fail for real, as on a full disk: held at step 7, its file size limit is set to 0 (it
        # ignores SIGXFSZ, as the worker it inherits that from does, so a write fails with EFBIG). Its checkpoint at
        # step 10 then fails, and it ends with status 75; the worker continues it from the checkpoint of step 5.
        self.script("held.lua", holding(CHECKPOINTING))
        self.sweep_file("full.lua", """
          script = "held.lua", parameters = { width = { 1 } }, fixed = { steps = 20, hold_at = 7 },
          method = "grid", metric = "score",
        """)
        process = subprocess.Popen([RUNNER, "sweep", "full.lua"], cwd=self.dir, env=self.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
        try:
            self.wait_for_trial_step(1, 7)
            self.wait_for_checkpoint(1, 5)  # saved in the background: under load it may still be writing at step 7
            (pid,), = self.sql("SELECT pid FROM runs WHERE trial = 1")
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]))
            (self.home / "release").touch()
            out, err = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        self.assertEqual(process.returncode, 0, out + err)
        self.assertEqual([(t[0], t[1], t[3]) for t in self.trials("full")], [(1, "finished", 20)], out)
        self.assertEqual(self.sql("SELECT retries FROM trials"), [(1,)])
        self.assertRegex(out, r"trial 1 was stopped by a full disk at step \d+ \(a write failed for want of space\): it "
                              r"goes on from its last checkpoint \(retry 1 of 1\)")
        self.assertIn("no trial starts for 10 s: the disk was full", out)
        self.assertRegex(out, r"trial 1 started \(retry 1 of 1: stopped by a full disk at step \d+ \(a write failed for want "
                              r"of space\)( from step \d+)?\)")  # the index's step may lag the run's
        # the second attempt started from the checkpoint of step 5 (the first could not write its steps after 7)
        run_dir = self.home / self.sql("SELECT dir FROM runs WHERE trial = 1")[0][0]
        self.assertEqual([line for line in (run_dir / "steps.txt").read_text().splitlines() if line.startswith("from")],
                         ["from 0", "from 5"])

    def test_a_trial_failed_by_a_full_disk_goes_on_when_the_same_command_runs_again(self):
        # As above with retries = 0: the full disk fails trial 1 at its checkpoint of step 10, and with it the sweep
        # (max_failures = 1). The same command afterwards, the space freed (its new trial process has no file size
        # limit), continues the trial from its checkpoint of step 5, as a second attempt of its run, and finishes.
        self.script("held.lua", holding(CHECKPOINTING))
        self.sweep_file("spent.lua", """
          script = "held.lua", parameters = { width = { 1 } }, fixed = { steps = 20, hold_at = 7 },
          method = "grid", metric = "score", retries = 0,
        """)
        process = subprocess.Popen([RUNNER, "sweep", "spent.lua"], cwd=self.dir, env=self.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
        try:
            self.wait_for_trial_step(1, 7)
            self.wait_for_checkpoint(1, 5)
            (pid,), = self.sql("SELECT pid FROM runs WHERE trial = 1")
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]))
            (self.home / "release").touch()
            out, err = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        self.assertEqual(process.returncode, 1, out + err)
        self.assertRegex(out, r"trial 1 failed \(exited with status 75\): a write failed for want of disk space at step "
                              r"\d+\n")
        self.assertIn("runner: sweep spent failed: 1 trials failed (max_failures = 1)\n"
                      "runner: trial 1 failed for want of disk space: once space is freed, the same command (or runner "
                      "sweep --join spent) continues it from its last checkpoint\n", err)
        self.assertEqual(self.sql("SELECT status, retries, out_of_space FROM trials"), [("failed", 0, 1)])

        again = self.runner("sweep", "spent.lua", check=0, timeout=300)
        self.assertRegex(again.stdout, r"trial 1 failed for want of disk space at step \d+: it goes on from its last "
                                       r"checkpoint \(space may have been freed\)\n")
        self.assertRegex(again.stdout, r"trial 1 started \(continued: a write failed for want of disk space at step \d+"
                                       r"( from step \d+)?\)")
        self.assertEqual(self.sql("SELECT t.status, t.retries, t.out_of_space, t.step, r.status, r.attempts "
                                  "FROM trials t JOIN runs r USING (run)"), [("finished", 0, 0, 20, "finished", 2)])
        self.assertEqual(self.sql("SELECT status, error FROM sweeps"), [("finished", None)])
        run_dir = self.home / self.sql("SELECT dir FROM runs WHERE trial = 1")[0][0]
        self.assertEqual([line for line in (run_dir / "steps.txt").read_text().splitlines() if line.startswith("from")],
                         ["from 0", "from 5"])

    def test_a_stop_signal_ends_a_worker_whose_index_is_full_once_its_trials_have_exited(self):
        # As in test_a_full_disk_under_the_worker_... the worker's writes fail (RLIMIT_FSIZE 0) from step 20 of its
        # two trials; trial 1 finishes at step 60 and its end cannot be recorded. A first SIGTERM then stops trial
        # 2, which checkpoints and exits, and the worker ends with an error that says the ends were not recorded.
        # The same command afterwards records trial 1's end from its run, continues trial 2 and finishes the sweep.
        self.script("synthetic.lua", CHECKPOINTING)
        self.sweep_file("stuck.lua", """
          script = "synthetic.lua", parameters = { steps = { 60, 400 } }, fixed = { sleep = 0.1 },
          method = "grid", metric = "score", slots = 2,
        """)
        # The worker's output goes to a pipe: its file size limit would keep it from a file.
        process = subprocess.Popen([RUNNER, "sweep", "stuck.lua"], cwd=self.dir, env=self.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        try:
            self.wait_for_steps(2, 20)
            resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (0, resource.prlimit(process.pid,
                                                                                       resource.RLIMIT_FSIZE)[1]))
            deadline = time.time() + 120
            while not any("cannot write to the index" in line for line in lines):
                self.assertLess(time.time(), deadline, "the worker did not try to write to the index:\n" + "".join(lines))
                time.sleep(0.1)
            process.send_signal(signal.SIGTERM)
            self.assertEqual(process.wait(timeout=120), 1, "".join(lines))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        reader.join(timeout=10)
        process.stdout.close()
        out = "".join(lines)
        self.assertIn("(stopped while the index could not be written: the trials were sent the stop signal and have "
                      "exited; the same command records how they ended and continues the sweep)", out)
        self.assertRegex(self.runner("sweep", "show", "stuck", check=0).stdout,
                         r"sweep stuck \(1\): stopped \(no live worker since")
        again = self.runner("sweep", "stuck.lua", check=0, timeout=300)
        self.assertEqual([(t[0], t[1], t[3]) for t in self.trials("stuck")], [(1, "finished", 60), (2, "finished", 400)],
                         again.stdout)
        self.assertIn("trial 2 started (continued from step", again.stdout)

    def test_show_and_sweeps_say_when_no_live_worker_holds_a_running_sweep(self):
        self.sweep_file("orphan.lua", """
          script = "synthetic.lua",
          parameters = { width = { 1, 2 } }, fixed = { steps = 200, sleep = 0.05 },
          method = "grid", metric = "score",
        """)
        process = subprocess.Popen([RUNNER, "sweep", "orphan.lua"], cwd=self.dir, env=self.env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_for_steps(1, 3)
        running = self.runner("sweep", "show", "orphan", check=0).stdout
        self.assertIn("sweep orphan (1): running, grid", running)
        process.kill()
        process.wait()
        seen = time.strftime("%H:%M")
        self.assertEqual(self.sql("SELECT status FROM sweeps"), [("running",)])  # as the dead worker left it
        note = r"no live worker since (\d\d:\d\d); run the same command to continue"
        shown = self.runner("sweep", "show", "orphan", check=0).stdout
        match = re.search(r"sweep orphan \(1\): stopped \(" + note + r"\), grid", shown)
        self.assertTrue(match, shown)
        self.assertIn(match.group(1), (seen, time.strftime("%H:%M", time.localtime(time.time() - 60))))
        self.assertEqual([row["status"] for row in json.loads(self.runner("sweep", "show", "orphan", "--json",
                                                                          check=0).stdout)], ["stopped"])
        table = self.runner("sweeps", check=0).stdout
        self.assertRegex(table, r"\borphan\s+stopped\b")
        self.assertRegex(table, r"sweep orphan: " + note)
        self.assertEqual([s["status"] for s in json.loads(self.runner("sweeps", "--json", check=0).stdout)], ["stopped"])


class Cleanup(SweepTest):
    def test_last_means_the_newest_run_outside_sweeps_and_sweep_rm_deletes_a_sweep(self):
        self.sweep_file("small.lua", """
          script = "synthetic.lua", parameters = { width = { 1, 2 } }, fixed = { steps = 2 },
          method = "grid", metric = "score",
        """)
        self.runner("synthetic.lua", "steps=2", check=0)  # a run started here, then a sweep in the background
        self.runner("sweep", "small.lua", check=0, timeout=300)
        own_id, own_name = self.sql("SELECT id, name FROM runs WHERE sweep IS NULL")[0]
        # `runner runs` says which runs are sweep trials; --json has the sweep and trial apart.
        table = self.runner("runs", check=0).stdout.splitlines()
        self.assertEqual(table[0].split()[:8], ["id", "name", "status", "started", "duration", "step", "ranks", "sweep"])
        self.assertEqual([sum(f"small #{t}" in line for line in table) for t in (1, 2)], [1, 1])
        self.assertEqual([line for line in table if own_name in line][0].split()[-2:], ["1", "-"])  # ranks, sweep
        listed = json.loads(self.runner("runs", "--json", check=0).stdout)
        self.assertEqual(sorted((r["sweep"], r["trial"], r["ranks"]) for r in listed if r["sweep"]), [("small", 1, 1), ("small", 2, 1)])
        self.assertEqual([(r["sweep"], r["trial"]) for r in listed if r["id"] == own_id], [(None, None)])
        newest_trial = self.sql("SELECT id FROM runs WHERE sweep IS NOT NULL ORDER BY started_at DESC, run DESC")[0][0]
        self.assertEqual(json.loads(self.runner("show", "last", "--json", check=0).stdout)["id"], own_id)
        self.assertEqual(json.loads(self.runner("show", "last", "--sweep", "--json", check=0).stdout)["id"], newest_trial)
        names = {name for (name,) in self.sql("SELECT name FROM runs")}

        # `runner rm` given a sweep says what deletes it, and deletes nothing.
        result = self.runner("rm", "small", check=2)
        self.assertIn("runner rm: 'small' is a sweep, not a run: `runner sweep rm small` deletes it with its trials' "
                      "runs", result.stderr)
        folders = [folder for (folder,) in self.sql("SELECT dir FROM runs WHERE sweep IS NOT NULL")]
        self.assertEqual(len(folders), 2)
        self.assertTrue((self.home / "sweeps" / "small").is_dir())

        result = self.runner("sweep", "rm", "small", check=0)
        self.assertRegex(result.stdout, r"^deleted sweep small: 2 trials, 2 runs with \d+ checkpoints?, [\d.]+ [kM]?B freed\n$")
        self.assertEqual(self.sql("SELECT count(*) FROM sweeps"), [(0,)])
        self.assertEqual(self.sql("SELECT count(*) FROM trials"), [(0,)])
        self.assertEqual(self.sql("SELECT id FROM runs"), [(own_id,)])
        for folder in folders:
            self.assertFalse((self.home / folder).exists(), folder)
        self.assertFalse((self.home / "sweeps" / "small").exists())
        self.assertEqual(list((self.home / ".trash").iterdir()), [])
        self.assertIn("no sweep", self.runner("sweep", "rm", "small", check=1).stderr.lower())

        # Only sweep trials left: `last` says so and what picks them.
        self.runner("sweep", "small.lua", check=0, timeout=300)
        self.runner("rm", own_name, check=0)
        self.assertIn("every run was started by a sweep, so 'last' matches nothing ('last --sweep' is the newest "
                      "sweep trial)", self.runner("show", "last", check=1).stderr)
        # A removed run's name is not given to a later run.
        self.runner("synthetic.lua", "steps=2", check=0)
        (new_name,) = self.sql("SELECT name FROM runs WHERE sweep IS NULL")[0]
        self.assertNotIn(new_name, names | {own_name})


class Input(SweepTest):
    """Issue 36: what a sweep file may hold, checked the same by --dry-run and by the run, errors at its line."""

    def refused(self, body, pattern, raw=None):
        """Writes bad.lua (or raw bytes), and asserts that --dry-run and the run both refuse it alike."""
        if raw is None:
            self.script("bad.lua", "-- a sweep\nreturn runner.sweep {\n  script = \"synthetic.lua\",\n  " + body + "\n}\n")
        else:
            (self.dir / "bad.lua").write_bytes(raw)
        recorded = lambda: self.sql("SELECT count(*) FROM sweeps") if (self.home / "index.db").exists() else None
        before = recorded()
        dry = self.runner("sweep", "--dry-run", "bad.lua", check=2)
        real = self.runner("sweep", "bad.lua", check=2)
        self.assertRegex(dry.stderr, "^runner sweep: " + pattern)
        self.assertEqual(real.stderr, dry.stderr)
        self.assertNotIn("json.exception", dry.stderr)
        self.assertEqual(recorded(), before)

    def test_names_are_checked_like_run_names(self):
        self.refused('name = "../../x",\n  parameters = { lr = { 1, 2 } }, metric = "score", trials = 2,',
                     r"bad\.lua:4: sweep name '\.\./\.\./x' is not allowed")
        self.refused('name = "a/b",\n  parameters = { lr = { 1, 2 } }, metric = "score", trials = 2,',
                     r"bad\.lua:4: sweep name 'a/b' is not allowed: use letters, digits, '_', '-' and '\.'")
        self.assertFalse((self.dir.parent / "x").exists())
        self.script("my sweep.lua", 'return runner.sweep { script = "synthetic.lua", parameters = { lr = { 1, 2 } }, '
                                    'metric = "score", trials = 2 }\n')
        result = self.runner("sweep", "--dry-run", "my sweep.lua", check=2)
        self.assertIn("runner sweep: my sweep.lua:1: sweep name 'my sweep' is not allowed: use letters, digits, '_', '-' "
                      "and '.' (the sweep file's name): give the sweep a name = \"...\"", result.stderr)

    def test_text_that_is_not_utf8_is_refused_at_its_line(self):
        self.refused(None, r'bad\.lua:4: parameter "mode" holds text that is not UTF-8: "\\xff" ',
                     raw=b'return runner.sweep {\n  script = "synthetic.lua",\n  metric = "score", trials = 2,\n'
                         b'  parameters = { mode = { "a", "\xff" } },\n}\n')
        self.refused(None, r"bad\.lua:3: 'name' holds text that is not UTF-8: \"x\\xe9\"",
                     raw=b'return runner.sweep {\n  script = "synthetic.lua",\n  name = "x\xe9",\n'
                         b'  parameters = { lr = { 1, 2 } }, metric = "score", trials = 2,\n}\n')
        latin1 = "s\xe9.lua".encode("latin-1").decode("utf-8", "surrogateescape")  # the bytes s, 0xe9, .lua
        (self.dir / latin1).write_text(SYNTHETIC)
        self.refused(None, r"bad\.lua:2: 'script' holds text that is not UTF-8: \"s\\xe9\.lua\"",
                     raw=b'return runner.sweep {\n  script = "s\xe9.lua",\n'
                         b'  parameters = { lr = { 1, 2 } }, metric = "score", trials = 2,\n}\n')
        (self.dir / latin1).write_text('return runner.sweep { name = "s", script = "synthetic.lua", '
                                       'parameters = { lr = { 1, 2 } }, metric = "score", trials = 2 }\n')
        for args in (["--dry-run", latin1], [latin1]):
            result = self.runner("sweep", *args, check=2)
            self.assertEqual(result.stderr, "runner sweep: s\\xe9.lua:1: the sweep file's path is not UTF-8 text: rename "
                                            "the file (the index keeps text as UTF-8)\n")

    def test_whole_numbers_are_range_checked_as_64_bit_values(self):
        self.refused('parameters = { lr = { 1, 2 } }, metric = "score",\n  trials = 5e9,',
                     r"bad\.lua:5: 'trials' must be a whole number from 1 to 2147483647, got 5000000000$")
        self.refused('parameters = { lr = { 1, 2 } }, metric = "score", trials = 2,\n  slots = 3e9,',
                     r"bad\.lua:5: 'slots' \(a number or \"auto\"\) must be a whole number from 1 to 2147483647, "
                     r"got 3000000000$")
        self.refused('parameters = { lr = { 1, 2 } }, metric = "score", trials = 2,\n  max_failures = 2^40,',
                     r"bad\.lua:5: 'max_failures' must be a whole number from 0 to 2147483647, got 1099511627776$")
        self.refused('parameters = { lr = { 1, 2 } }, metric = "score", trials = 2,\n  prune = { "asha", min_steps = 2, '
                     'reduction = 2^33 },', r"bad\.lua:5: prune's 'reduction' must be a whole number from 2 to 2147483647")

    def test_dry_run_refuses_what_the_run_refuses(self):
        self.env = {**self.env, "CUDA_VISIBLE_DEVICES": ""}  # CPU slots, also on a GPU host
        cores = os.cpu_count()
        self.refused(f'parameters = {{ lr = {{ 1, 2 }} }}, metric = "score", trials = 2,\n  slots = {cores + 1},',
                     rf"bad\.lua:5: slots = {cores + 1} runs {cores + 1} processes at once on the CPU, more than this "
                     rf"host's {cores} cores$")
        # A sweep of the same name with another definition: refused by both (the dry run reads the index).
        self.script("first.lua", 'return runner.sweep { name = "same", script = "synthetic.lua", '
                                 'parameters = { width = { 1 } }, fixed = { steps = 1 }, method = "grid", metric = "score" }\n')
        self.runner("sweep", "first.lua", check=0, timeout=120)
        self.refused('name = "same", parameters = { width = { 2 } }, fixed = { steps = 1 },\n  method = "grid", metric = "score",',
                     r"bad\.lua:2: a sweep named 'same' exists with another definition \(parameters differ\)")


class Example(SweepTest):
    SOURCE = pathlib.Path(os.environ.get("RUNNER_SOURCE", pathlib.Path(__file__).resolve().parents[2]))

    def test_the_example_checks_against_the_quickstart(self):
        result = self.runner("sweep", "--dry-run", str(self.SOURCE / "experiments" / "sweep_quickstart.lua"), check=0)
        self.assertIn("sweep sweep_quickstart: 12 trials (tpe) of ", result.stdout)
        self.assertIn("ASHA: rungs at steps 100, 300 of 600, the best 1/3 of each goes on", result.stdout)
        lines = [line for line in result.stdout.splitlines() if line.startswith("  runner ")]
        self.assertEqual(len(lines), 5)
        for line in lines:
            self.assertRegex(line, r"quickstart\.lua batch=(32|64) ema=0\.99\d* lr=0\.00\d+ metric_samples=128 "
                                   r"sample_every=100 steps=600$")
        self.assertFalse(self.home.exists())  # a dry run records nothing

    def test_a_short_quickstart_sweep_with_asha(self):
        self.sweep_file("quick.lua", f"""
          script = "{self.SOURCE / 'experiments' / 'quickstart.lua'}",
          parameters = {{ lr = {{ 1e-3, 2e-3, 4e-3 }} }},
          fixed = {{ steps = 8, sample_every = 4, checkpoint_every = 4, metric_samples = 16, sample_steps = 4,
                    channels = 8, batch = 16 }},
          method = "grid", metric = "swd", prune = {{ "asha", min_steps = 4, reduction = 3 }},
        """)
        result = self.runner("sweep", "quick.lua", check=0, timeout=600)
        trials = self.trials("quick")
        self.assertEqual(sorted(t[1] for t in trials), ["finished", "pruned", "pruned"], result.stdout)
        finished = [t for t in trials if t[1] == "finished"][0]
        self.assertEqual(finished[3], 8)
        rung = self.sql("SELECT trial, value FROM trial_rungs ORDER BY value")
        self.assertEqual(rung[0][0], finished[0])  # the best at step 4 is the one that went on
        run = self.sql("SELECT attempts, step, status FROM runs WHERE trial = ?", finished[0])
        self.assertEqual(run, [(2, 8, "finished")])
        swd = self.sql("SELECT m.step FROM metrics m JOIN runs r USING (run) WHERE r.trial = ? AND m.key = 'swd' "
                       "ORDER BY m.step", finished[0])
        self.assertEqual(swd, [(4,), (8,)])

    def test_a_sweep_searches_the_flow_objectives_settings(self):
        self.sweep_file("flows.lua", f"""
          script = "{self.SOURCE / 'experiments' / 'quickstart.lua'}",
          parameters = {{ path = {{ "linear", "gvp" }}, flow_prediction = {{ "velocity", "noise" }} }},
          fixed = {{ objective = "flow", steps = 4, sample_every = 4, checkpoint_every = 4, metric_samples = 16,
                    sample_steps = 3, channels = 8, batch = 8 }},
          method = "grid", metric = "swd",
        """)
        result = self.runner("sweep", "flows.lua", check=0, timeout=900)
        trials = self.trials("flows")
        self.assertEqual([t[1] for t in trials], ["finished"] * 4, result.stdout)
        points = sorted((json.loads(t[5])["path"], json.loads(t[5])["flow_prediction"]) for t in trials)
        self.assertEqual(points, [("gvp", "noise"), ("gvp", "velocity"), ("linear", "noise"), ("linear", "velocity")])
        configs = [json.loads(row[0]) for row in self.sql("SELECT config FROM runs WHERE trial IS NOT NULL")]
        self.assertEqual(sorted((c["objective"], c["path"], c["flow_prediction"]) for c in configs),
                         [("flow", p, q) for p, q in points])
        for trial in trials:
            self.assertIsNotNone(trial[2], f"trial {trial[0]} logged swd")


if __name__ == "__main__":
    unittest.main()
