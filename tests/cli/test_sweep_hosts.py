"""One sweep on two hosts against one PostgreSQL index (issue 39): two workers in separate UTS namespaces (host
names alpha and beta) and process groups share RUNNER_HOME; kill -9 of a worker and of the server lose and repeat
nothing, the other worker takes over the dead one's trial from its checkpoint (after the sweep's takeover_after), a
trial whose run folder a host cannot see fails with an error that says so, and `runner sweep --dry-run` checks a
sweep file against the sweep of that name on the server."""
import json
import os
import re
import shutil
import signal
import subprocess
import time
import unittest

import postgres_server
from lossy_proxy import LossyProxy
from runner_process import RUNNER, RunnerHomeTest
from test_sweep import CHECKPOINTING, SweepTest, holding, score


def can_name_hosts():
    """unshare --uts needs root (or a user namespace); without it the test cannot act as two hosts."""
    return subprocess.run(["unshare", "--uts", "hostname", "probe"], capture_output=True).returncode == 0


@unittest.skipUnless(postgres_server.available() and can_name_hosts(),
                     "needs PostgreSQL's server programs and unshare --uts (root)")
class SweepOnTwoHosts(RunnerHomeTest):
    def setUp(self):
        super().setUp()
        self.server = postgres_server.PostgresServer()
        self.addCleanup(self.server.stop)  # its folder too, where it does not start
        self.server.start()
        self.database = self.server.new_database().rsplit("/", 1)[1]
        self.env = {**self.env, "OMP_NUM_THREADS": "1", "RUNNER_INDEX": self.server.url(self.database)}
        # Trials of hold_at = 7 hold after step 7 (past the checkpoint of step 5) until RUNNER_HOME/release exists:
        # a host dies while its trial is there, not at a step that a timer happened to reach.
        self.script("synthetic.lua", holding(CHECKPOINTING))
        self.workers = []

    def release_held_trials(self):
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "release").touch()

    def tearDown(self):
        self.release_held_trials()  # a held trial whose worker is killed below stops, after its step
        for worker in self.workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        super().tearDown()

    def on_host(self, host, *args, log, env=None):
        """`runner ARGS` as host `host`: its own UTS namespace and process group."""
        worker = subprocess.Popen(["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"', RUNNER, *args],
                                  cwd=self.dir, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True)
        self.workers.append(worker)
        return worker

    def sql(self, query):
        return [line.split("|") for line in self.server.sql(query, self.database).splitlines() if line]

    def wait_until(self, query, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                rows = self.sql(query)
                if rows:
                    return rows
            except subprocess.CalledProcessError:
                pass  # the server restarting, or the tables not there yet
            time.sleep(0.2)
        self.fail(f"timed out waiting for {what}")

    def attempts(self, run_dir):
        """(the step it started from, the steps it ran) of each attempt of a run, from the steps.txt that SYNTHETIC
        appends to."""
        attempts = []
        for line in (self.home / run_dir / "steps.txt").read_text().splitlines():
            if line.startswith("from "):
                attempts.append((int(line[5:]), []))
            else:
                attempts[-1][1].append(int(line))
        return attempts

    def test_two_hosts_finish_every_trial_once_through_a_dead_worker_and_a_server_restart(self):
        self.script("hosts.lua", """return runner.sweep {
          script = "synthetic.lua", parameters = { width = { 1, 2, 3, 4, 5 } },
          fixed = { steps = 20, sleep = 0.15, checkpoint_every = 5, hold_at = 7 }, method = "grid", metric = "score",
        }
        """)
        alpha_log = open(self.dir / "alpha.log", "w+")
        beta_log = open(self.dir / "beta.log", "w+")
        self.addCleanup(alpha_log.close)
        self.addCleanup(beta_log.close)
        alpha = self.on_host("alpha", "sweep", "hosts.lua", log=alpha_log)
        self.wait_until("SELECT trial FROM trials WHERE worker LIKE 'alpha:%'", "alpha's first trial")
        beta = self.on_host("beta", "sweep", "--join", "hosts", log=beta_log)
        # beta's trial past its first checkpoint (step 5): then beta dies as a host would, trial and all.
        taken = self.wait_until("SELECT t.trial, r.dir FROM trials t JOIN runs r ON r.sweep = t.sweep AND r.trial = t.trial "
                                "WHERE t.worker LIKE 'beta:%' AND r.step >= 7", "beta's trial past a checkpoint")[0]
        os.killpg(beta.pid, signal.SIGKILL)
        beta.wait()
        for pid in [int(p) for (p,) in self.sql(f"SELECT pid FROM runs WHERE dir = '{taken[1]}'")]:
            try:
                os.killpg(pid, signal.SIGKILL)  # the trial's own process group, as the host's death takes it
            except ProcessLookupError:
                pass
        # The server crashes and comes back while alpha's trial logs and checkpoints: released from its hold with the
        # server down.
        self.wait_until("SELECT t.trial FROM trials t JOIN runs r ON r.sweep = t.sweep AND r.trial = t.trial "
                        "WHERE t.worker LIKE 'alpha:%' AND t.status = 'running' AND r.step >= 7", "alpha's trial held")
        self.server.kill()
        self.release_held_trials()
        time.sleep(2)
        self.server.start()
        alpha.wait(timeout=240)
        alpha_log.seek(0)
        output = alpha_log.read()
        self.assertEqual(alpha.returncode, 0, output)
        trial_logs = "".join(p.read_text() for p in (self.home / "sweeps" / "hosts").glob("trial-*.log"))
        self.assertIn("the index server does not answer", trial_logs)  # a trial met the restart, and went on
        trials = self.sql("SELECT t.trial, t.status, t.step, r.dir, r.attempts FROM trials t JOIN runs r ON r.run = t.run "
                          "ORDER BY t.trial")
        self.assertEqual([(t[0], t[1], t[2]) for t in trials], [(str(n), "finished", "20") for n in range(1, 6)])
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [["5"]])
        for trial in trials:  # alpha's trials ran every step once
            if trial[3] != taken[1]:
                self.assertEqual(self.attempts(trial[3]), [(0, list(range(1, 21)))], trial)
        # beta's trial went on on alpha from beta's latest checkpoint (the steps after it, which the dead host ran
        # without a checkpoint, ran again).
        hosts = self.sql(f"SELECT a.host, a.start_step FROM attempts a JOIN runs r USING (run) WHERE r.dir = '{taken[1]}' "
                         "ORDER BY a.attempt")
        self.assertEqual([h[0] for h in hosts], ["beta", "alpha"])
        (start, before), (resumed, after) = self.attempts(taken[1])
        self.assertEqual((start, before[0]), (0, 1))
        self.assertEqual((resumed, after), (int(hosts[1][1]), list(range(resumed + 1, 21))))
        self.assertGreaterEqual(resumed, 5)
        self.assertLessEqual(resumed, before[-1])
        # sweep show equals a query over the trials.
        shown = json.loads(self.runner("sweep", "show", "hosts", "--json", check=0).stdout)
        queried = self.sql("SELECT t.trial, t.status, t.metric, t.step, r.id, (t.params::jsonb->>'width')::int "
                           "FROM trials t JOIN runs r ON r.run = t.run ORDER BY t.metric, t.trial")
        self.assertEqual([(str(s["trial"]), s["status"], s["score"], str(s["step"]), s["run"], str(s["width"]))
                          for s in shown], [(q[0], q[1], float(q[2]), q[3], q[4], q[5]) for q in queried])
        self.assertAlmostEqual(shown[0]["score"], score(0.01, 1, 20))

    def test_a_trial_whose_run_folder_this_host_cannot_see_fails_with_the_reason(self):
        self.script("unseen.lua", """return runner.sweep {
          script = "synthetic.lua", parameters = { width = { 1 } },
          fixed = { steps = 40, sleep = 0.1, checkpoint_every = 5, hold_at = 7 }, method = "grid", metric = "score",
        }
        """)
        log = open(self.dir / "gamma.log", "w+")
        self.addCleanup(log.close)
        gamma = self.on_host("gamma", "sweep", "unseen.lua", log=log)
        run_dir, pid = self.wait_until("SELECT dir, pid FROM runs WHERE step >= 7", "the trial past a checkpoint")[0]
        os.killpg(gamma.pid, signal.SIGKILL)
        gamma.wait()
        os.killpg(int(pid), signal.SIGKILL)
        shutil.move(self.home / run_dir, self.dir / "elsewhere")  # as on a host without the shared filesystem
        joined = self.on_host("gamma", "sweep", "--join", "unseen", log=log)
        joined.wait(timeout=60)
        log.seek(0)
        self.assertEqual(self.sql("SELECT status FROM trials"), [["failed"]])
        error = self.sql("SELECT error FROM trials")[0][0]
        self.assertEqual(error, f"trial 1 cannot continue on host gamma: its run folder {self.home}/{run_dir} (with its "
                                "checkpoints, written on gamma) is not visible here; the hosts of a sweep need "
                                "RUNNER_HOME on a filesystem they share, at the same path")

    def test_takeover_after_is_how_long_a_silent_host_keeps_its_trials(self):
        self.script("take.lua", """return runner.sweep {
          script = "synthetic.lua", parameters = { width = { 1 } },
          fixed = { steps = 40, sleep = 0.15, checkpoint_every = 5, hold_at = 7 }, method = "grid", metric = "score",
          takeover_after = 10,
        }
        """)
        beta_log = open(self.dir / "beta.log", "w+")
        alpha_log = open(self.dir / "alpha.log", "w+")
        self.addCleanup(beta_log.close)
        self.addCleanup(alpha_log.close)
        beta = self.on_host("beta", "sweep", "take.lua", log=beta_log)
        run_dir, pid = self.wait_until("SELECT dir, pid FROM runs WHERE step >= 7", "beta's trial past a checkpoint")[0]
        os.killpg(beta.pid, signal.SIGKILL)  # beta goes silent as a dead host does: its worker and its trial
        beta.wait()
        os.killpg(int(pid), signal.SIGKILL)
        killed = time.time()
        self.release_held_trials()  # alpha's continuation goes past step 7
        alpha = self.on_host("alpha", "sweep", "--join", "take", log=alpha_log)
        self.wait_until("SELECT attempt FROM attempts WHERE host = 'alpha'", "alpha continuing beta's trial")
        taken = time.time()
        (heartbeat, ended, error), = self.sql("SELECT r.heartbeat_at, a.ended_at, a.error FROM attempts a JOIN runs r "
                                              "USING (run) WHERE a.attempt = 1")
        (resumed_at,), = self.sql("SELECT started_at FROM attempts WHERE attempt = 2")
        # Taken over once the host had been silent for takeover_after (10 s), not the default 60 s.
        # The order, not the speed: at least takeover_after of silence, and before the default 60 s had passed.
        self.assertGreaterEqual(float(resumed_at) - float(ended), 10)
        self.assertLess(taken - killed, 60)
        match = re.fullmatch(r"no heartbeat from host beta for (\d+) s \(the sweep's takeover_after is 10 s\): trial 1 "
                             r"was taken over by another worker", error)
        self.assertIsNotNone(match, error)
        self.assertGreaterEqual(int(match.group(1)), 10)
        alpha.wait(timeout=120)
        alpha_log.seek(0)
        output = alpha_log.read()
        self.assertEqual(alpha.returncode, 0, output)
        self.assertIn("trial 1 started (continued from step ", output)
        self.assertEqual(self.sql("SELECT status, step FROM trials"), [["finished", "40"]])
        self.assertEqual(self.sql("SELECT host, status FROM attempts ORDER BY attempt"),
                         [["beta", "interrupted"], ["alpha", "finished"]])
        (start, before), (resumed, after) = self.attempts(run_dir)
        self.assertEqual((start, before[0], after[-1]), (0, 1, 40))
        self.assertGreaterEqual(resumed, 5)
        self.assertEqual(after, list(range(resumed + 1, 41)))

    def test_a_host_that_resumes_after_its_trial_was_taken_over_writes_nothing_more(self):
        """Issue 50, item 5: alpha (its worker and its trial) is stopped past takeover_after, beta takes the trial over
        and finishes it, then alpha resumes: its trial's process stops at its first write, with the reason, and its
        worker reports the trial lost, not finished. The trial's metric `writer` says which host logged each step.
        Alpha checkpoints step 7 as it resumes (beta saves none of that step): whichever of its writes comes first
        (that checkpoint, a heartbeat), the run folder never has a checkpoint of step 7."""
        script = holding(CHECKPOINTING).replace(
            "run:log { score =", 'run:log { writer = tonumber(os.getenv("TEST_WRITER")), score =')
        released = '      if runner.clock() - since > 300 then error("not released within 300 s") end\n    end\n'
        self.assertIn(released, script)
        self.script("synthetic.lua", script.replace(
            released, released + '    if os.getenv("TEST_WRITER") == "1" then run:checkpoint() end\n'))
        self.script("fence.lua", """return runner.sweep {
          script = "synthetic.lua", parameters = { width = { 1 } },
          fixed = { steps = 30, sleep = 0.1, checkpoint_every = 5, hold_at = 7 }, method = "grid", metric = "score",
          takeover_after = 10,
        }
        """)
        alpha_log = open(self.dir / "alpha.log", "w+")
        beta_log = open(self.dir / "beta.log", "w+")
        self.addCleanup(alpha_log.close)
        self.addCleanup(beta_log.close)
        alpha = self.on_host("alpha", "sweep", "fence.lua", log=alpha_log, env={"TEST_WRITER": "1"})
        (pid,), = self.wait_until("SELECT r.pid FROM runs r JOIN metrics m USING (run) WHERE m.key = 'writer' "
                                  "AND m.step = 7", "alpha's trial held at step 7")
        groups = (alpha.pid, int(pid))  # alpha's worker and its trial, each in its own process group
        for group in groups:
            os.killpg(group, signal.SIGSTOP)  # alpha stops as a paused host does

        def end_alpha():  # a failure below leaves no stopped process behind: resumed, killed and reaped
            for group in groups:
                for sent in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.killpg(group, sent)
                    except ProcessLookupError:
                        pass  # ended (and, for alpha's worker, reaped below or already)
            if alpha.poll() is None:
                alpha.wait(timeout=60)
        self.addCleanup(end_alpha)
        stopped = time.time()
        beta = self.on_host("beta", "sweep", "--join", "fence", log=beta_log, env={"TEST_WRITER": "2"})
        self.wait_until("SELECT attempt FROM attempts WHERE host = 'beta'", "beta taking the trial over", timeout=120)
        self.release_held_trials()
        beta.wait(timeout=180)
        beta_log.seek(0)
        self.assertEqual(beta.returncode, 0, beta_log.read())
        # Claimed by alpha (generation 1), stopped as alpha's (2), claimed by beta (3).
        self.assertEqual(self.sql("SELECT status, step, generation FROM trials"), [["finished", "30", "3"]])
        for group in groups:
            os.killpg(group, signal.SIGCONT)
        alpha.wait(timeout=120)
        alpha_log.seek(0)
        output = alpha_log.read()
        self.assertEqual(alpha.returncode, 0, output)
        self.assertIn("trial 1 was taken over by host beta (generation 3) while this worker was silent: its process "
                      "here exited with status 76 and its end is not recorded here", output)
        self.assertNotIn("trial 1 finished", output)
        trial_log = (self.home / "sweeps" / "fence" / "trial-0001.log").read_text()
        self.assertIn("runner: trial 1 of sweep fence was taken over by host beta (generation 3, this process has 1); "
                      "this process stops without writing\n", trial_log)
        run_dir = self.home / self.sql("SELECT dir FROM runs")[0][0]
        self.assertEqual(sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")),
                         ["step-0000020", "step-0000025", "step-0000030"])  # beta's last three; no step 7
        # Nothing alpha's process did after the takeover reached the index: beta logged every step after its
        # checkpoint of step 5; alpha's rows are the steps before, logged before alpha stopped.
        writers = self.sql("SELECT step, value, time FROM metrics WHERE key = 'writer' ORDER BY step")
        self.assertEqual([(int(s), float(v)) for s, v, _ in writers],
                         [(s, 1.0) for s in range(1, 6)] + [(s, 2.0) for s in range(6, 31)])
        self.assertTrue(all(float(t) < stopped for s, v, t in writers if float(v) == 1.0))
        self.assertEqual(self.sql("SELECT host, status, start_step, end_step FROM attempts ORDER BY attempt"),
                         [["alpha", "interrupted", "0", "7"], ["beta", "finished", "5", "30"]])
        self.assertEqual(self.sql("SELECT r.host, r.status, r.step, r.attempts FROM runs r"),
                         [["beta", "finished", "30", "2"]])
        shown = json.loads(self.runner("sweep", "show", "fence", "--json", check=0).stdout)
        self.assertEqual([(s["trial"], s["status"], s["step"]) for s in shown], [(1, "finished", 30)])


@unittest.skipUnless(postgres_server.available(), "needs PostgreSQL's server programs")
class DryRunOnPostgres(SweepTest):
    def setUp(self):
        super().setUp()
        self.server = postgres_server.shared_server()
        self.database = self.server.new_database().rsplit("/", 1)[1]
        self.env = {**self.env, "RUNNER_INDEX": self.server.url(self.database)}

    def test_the_dry_run_compares_the_file_with_the_sweep_stored_on_the_server(self):
        self.sweep_file("first.lua", 'name = "same", script = "synthetic.lua", parameters = { width = { 1 } },\n'
                                     '  fixed = { steps = 1 }, method = "grid", metric = "score",')
        self.sweep_file("second.lua", 'name = "same", script = "synthetic.lua", parameters = { width = { 1, 2 } },\n'
                                      '  fixed = { steps = 1 }, method = "grid", metric = "score",')
        tables = "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
        # A database without the runner schema holds no sweep: both pass, and the dry run creates nothing.
        for name in ("first.lua", "second.lua"):
            result = self.runner("sweep", "--dry-run", name, check=0)
            self.assertIn("sweep same: ", result.stdout)
        self.assertEqual(self.server.sql(tables, self.database).strip(), "0")
        self.assertFalse((self.home / "index.db").exists())
        self.runner("sweep", "first.lua", check=0)
        self.assertEqual(self.server.sql("SELECT name, status FROM sweeps", self.database).strip(), "same|finished")
        # Now the server holds "same": the dry run of another definition under that name is refused as the run is.
        refusal = ("runner sweep: second.lua:1: a sweep named 'same' exists with another definition (max_failures, "
                   "parameters, trials differ): give this one another name = \"...\", or continue that one with "
                   "runner sweep --join same\n")
        for dry in (["--dry-run"], []):
            result = self.runner("sweep", *dry, "second.lua", check=2)
            self.assertEqual(result.stderr, refusal)
        self.assertIn("sweep same: 1 trials (grid)", self.runner("sweep", "--dry-run", "first.lua", check=0).stdout)
        self.assertEqual(self.server.sql("SELECT count(*) FROM trials", self.database).strip(), "1")
        # A database with other tables is not taken for an index, by the dry run either.
        other = self.server.new_database().rsplit("/", 1)[1]
        self.server.sql("CREATE TABLE notes (text TEXT)", other)
        self.env = {**self.env, "RUNNER_INDEX": self.server.url(other)}
        result = self.runner("sweep", "--dry-run", "first.lua", check=1)
        self.assertEqual(result.stderr, f"runner sweep: {self.server.url(other)}: not a runner index (a PostgreSQL "
                                        "database without the runner schema)\n")


@unittest.skipUnless(postgres_server.available(), "needs PostgreSQL's server programs")
class LostCommitsOnPostgres(SweepTest):
    """Issue 50, item 8: a transaction whose commit went through but whose answer was lost is retried without being
    done twice: the schema's creation, a trial's claim and a run's creation each meet it once, through a proxy that
    cuts the connection between the commit and its answer."""

    def setUp(self):
        super().setUp()
        self.server = postgres_server.shared_server()
        self.database = self.server.new_database().rsplit("/", 1)[1]
        self.proxy = LossyProxy(self.server.port, ["CREATE TABLE sweeps", "INSERT INTO trials", "INSERT INTO runs ("])
        self.addCleanup(self.proxy.close)
        self.env = {**self.env, "RUNNER_INDEX": f"postgresql://runner@127.0.0.1:{self.proxy.port}/{self.database}"}

    def sql(self, query):
        return [line.split("|") for line in self.server.sql(query, self.database).splitlines() if line]

    def test_a_lost_answer_to_a_commit_does_not_repeat_the_schema_a_claim_or_a_run(self):
        self.sweep_file("lost.lua", 'name = "lost", script = "synthetic.lua", parameters = { width = { 1, 2 } },\n'
                                    '  fixed = { steps = 3 }, method = "grid", metric = "score",')
        result = self.runner("sweep", "lost.lua", check=0, timeout=240)
        self.assertIn("sweep lost finished: running 0, queued 0, done 2", result.stdout)
        self.assertEqual(self.proxy.cuts, ["CREATE TABLE sweeps", "INSERT INTO trials", "INSERT INTO runs ("])
        # No phantom trial (claimed twice), no ghost run (created twice): one finished run per finished trial.
        self.assertEqual(self.sql("SELECT t.trial, t.status, t.generation, r.status, r.attempts FROM trials t "
                                  "JOIN runs r ON r.run = t.run ORDER BY t.trial"),
                         [["1", "finished", "1", "finished", "1"], ["2", "finished", "1", "finished", "1"]])
        self.assertEqual(self.sql("SELECT count(*), count(DISTINCT trial) FROM runs"), [["2", "2"]])
        shown = json.loads(self.runner("sweep", "show", "lost", "--json", check=0).stdout)
        self.assertEqual(sorted((s["trial"], s["status"]) for s in shown), [(1, "finished"), (2, "finished")])


# Every kind of write a sweep's trial makes: its run's start, tags, note, metrics with a histogram, checkpoints of which
# one is kept, an image, a summary and its end, beside the sweep's and the trials' own rows.
EVERY_WRITE = """
local cfg = config { width = 1, steps = 6 }
local run = runner.start(cfg, { system_metrics = false, heartbeat = 0.2 })
local model = nn.Linear(2, 1)
local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.001 }, progress = false }
run:restore { trainer = train, keep_last = 1 }
run:tag("lossy")
run:note("every write once")
for step in run:steps(cfg.steps) do
  train:step(function() return model(torch.ones(2, 2)):pow(2):mean() end)
  run:log { score = cfg.width + 1 / step, weight = model.weight }
  if step % 2 == 0 then run:checkpoint { wait = true } end
  local t = runner.clock()
  while runner.clock() - t < 0.1 do end
end
run:images("grid", torch.rand(2, 3, 8, 8))
run:set_summary { best = cfg.width }
"""

# The statements of those writes: each marks the first transaction that holds it, whose commit's answer is lost. (A
# run's name number is counted only outside a sweep: the test runs the script twice alone for those.)
EVERY_WRITE_MARKERS = [
    "CREATE TABLE sweeps", "INSERT INTO sweeps", "INSERT INTO sweep_workers", "INSERT INTO trials",
    "UPDATE trials SET status", "UPDATE sweeps SET status", "INSERT INTO runs (", "INSERT INTO attempts",
    "INSERT INTO run_tags", "UPDATE runs SET note",
    "UPDATE runs SET heartbeat_at", "INSERT INTO metrics", "INSERT INTO histograms", "INSERT INTO checkpoints",
    "UPDATE checkpoints SET kept", "DELETE FROM checkpoints", "INSERT INTO artifacts", "UPDATE runs SET summary", "UPDATE attempts SET end_step",
    "UPDATE runs SET status"]


@unittest.skipUnless(postgres_server.available(), "needs PostgreSQL's server programs")
class EveryLostCommitOnPostgres(SweepTest):
    """Issue 63, item 4: every write the index retries meets a lost answer to its commit once, and is neither done
    twice nor lost."""

    def setUp(self):
        super().setUp()
        self.server = postgres_server.shared_server()
        self.database = self.server.new_database().rsplit("/", 1)[1]
        self.proxy = LossyProxy(self.server.port, EVERY_WRITE_MARKERS)
        self.addCleanup(self.proxy.close)
        self.env = {**self.env, "RUNNER_INDEX": f"postgresql://runner@127.0.0.1:{self.proxy.port}/{self.database}"}

    def sql(self, query):
        return [line.split("|") for line in self.server.sql(query, self.database).splitlines() if line]

    def test_a_lost_answer_to_any_commit_repeats_nothing_and_loses_nothing(self):
        self.script("every.lua", EVERY_WRITE)
        self.sweep_file("every_sweep.lua", 'name = "every", script = "every.lua", parameters = { width = { 1, 2 } },\n'
                                           '  method = "grid", metric = "score",')
        result = self.runner("sweep", "every_sweep.lua", check=0, timeout=300)
        self.assertIn("sweep every finished: running 0, queued 0, done 2", result.stdout)
        self.assertEqual(sorted(self.proxy.cuts), sorted(EVERY_WRITE_MARKERS))
        self.assertEqual(self.sql("SELECT t.trial, t.status, t.generation, r.status, r.attempts, r.note FROM trials t "
                                  "JOIN runs r ON r.run = t.run ORDER BY t.trial"),
                         [[str(n), "finished", "1", "finished", "1", "every write once"] for n in (1, 2)])
        self.assertEqual(self.sql("SELECT count(*), count(DISTINCT name) FROM runs"), [["2", "2"]])
        self.assertEqual(self.sql("SELECT count(*) FROM attempts"), [["2"]])
        self.assertEqual(self.sql("SELECT r.name, a.status, a.start_step, a.end_step FROM attempts a JOIN runs r "
                                  "USING (run) ORDER BY r.name"),
                         [["every-1", "finished", "0", "6"], ["every-2", "finished", "0", "6"]])
        for run in ("every-1", "every-2"):
            width = int(run[-1])
            where = f"FROM runs r JOIN {{}} USING (run) WHERE r.name = '{run}'"
            scores = self.sql("SELECT m.step, m.value " + where.format("metrics m") + " AND m.key = 'score' ORDER BY "
                              "m.step")
            self.assertEqual([(int(step), float(value)) for step, value in scores],
                             [(step, width + 1 / step) for step in range(1, 7)], run)
            self.assertEqual(self.sql("SELECT count(*), count(DISTINCT h.step) " + where.format("histograms h") +
                                      " AND h.key = 'weight'"), [["6", "6"]], run)
            self.assertEqual(self.sql("SELECT t.tag " + where.format("run_tags t")), [["lossy"]], run)
            self.assertEqual(self.sql("SELECT count(*) " + where.format("artifacts a")), [["1"]], run)
            self.assertEqual(self.sql("SELECT c.step, c.kept, c.path " + where.format("checkpoints c")),
                             [["6", "1", "checkpoints/step-0000006"]], run)  # keep_last = 1
            run_dir = self.home / self.sql(f"SELECT dir FROM runs WHERE name = '{run}'")[0][0]
            self.assertEqual([p.name for p in (run_dir / "checkpoints").iterdir()], ["step-0000006"], run)
            self.assertEqual(self.sql("SELECT r.summary::json->>'best' FROM runs r WHERE r.name = '" + run + "'"),
                             [[str(width)]], run)
        # Alone, a run takes the next number of its script's name (one upsert, which both markers find): the first
        # run's commit and the second's each lose their answer.
        numbers = LossyProxy(self.server.port, ["INSERT INTO run_name_numbers", "ON CONFLICT (stem) DO UPDATE"])
        self.addCleanup(numbers.close)
        self.env = {**self.env, "RUNNER_INDEX": f"postgresql://runner@127.0.0.1:{numbers.port}/{self.database}"}
        for _ in range(2):
            self.runner("every.lua", "steps=2", check=0, timeout=120)
        self.assertEqual(numbers.cuts, ["INSERT INTO run_name_numbers", "ON CONFLICT (stem) DO UPDATE"])
        self.assertEqual(self.sql("SELECT r.name, r.status, r.attempts FROM runs r WHERE r.trial IS NULL ORDER BY "
                                  "r.name"), [["every-3", "finished", "1"], ["every-4", "finished", "1"]])


if __name__ == "__main__":
    unittest.main()
