"""End-to-end tests of the run index: runs recorded by scripts, the index commands, crashes, concurrency, bad input."""
import hashlib
import json
import math
import os
import pathlib
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import unittest

import torch

import postgres_server
import report_screenshot
from runner_process import RUNNER, RunnerHomeTest

TRAINING_SCRIPT = """
local cfg = config { steps = 30, lr = 0.01, label = "base", keys = 3 }
local run = runner.start(cfg)
print("training " .. run.name)
for step in run:steps(cfg.steps) do
  local values = { loss = 1 / step * cfg.lr * 100, lr = cfg.lr }
  for k = 3, cfg.keys do values["extra" .. k] = k * step end
  run:log(values)
  if run:every(10) then run:images("samples", torch.linspace(-1, 1, 2 * 3 * 4 * 4):reshape(2, 3, 4, 4)) end
end
run:set_summary { final_loss = 1 / cfg.steps * cfg.lr * 100 }
"""


# Runs of two learning rates and two seeds each: a loss, sparse metrics under prefixes, and a floor beside swd.
GROUPED_SCRIPT = """
local cfg = config { steps = 40, lr = 0.01, seed = 0 }
local run = runner.start(cfg, { system_metrics = false })
for step in run:steps(cfg.steps) do
  local values = { loss = (1 + cfg.seed) * cfg.lr * 100 / step, grad_norm = 1 + 1 / step }
  if step % 10 == 0 then
    values.swd = 0.5 / step + 0.1 * cfg.seed
    values["eval/fid"] = 100 / step
    values["late/x"] = step
  end
  run:log(values)
  if step % 10 == 0 and (cfg.seed == 0 or step < 40) then
    run:images("samples", torch.linspace(-1, 1, 2 * 3 * 4 * 4):reshape(2, 3, 4, 4) * step / 40)
  end
end
run:set_summary { swd = 0.5 / cfg.steps + 0.1 * cfg.seed, swd_floor = 0.02 }
"""


def file_digest(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


class IndexTest(RunnerHomeTest):
    """Runs on the SQLite index in RUNNER_HOME; PostgresIndex below runs the same tests on a PostgreSQL server."""
    postgresql = False

    def setUp(self):
        super().setUp()
        if self.postgresql:
            self.server = postgres_server.shared_server()
            self.env["RUNNER_INDEX"] = self.server.new_database()

    def train(self, *overrides):
        self.script("train.lua", TRAINING_SCRIPT)
        self.runner("train.lua", *overrides, check=0)
        return json.loads(self.runner("show", "last", "--json", check=0).stdout)

    def three_runs(self):
        """train-1 (lr 0.01), train-2 (lr 0.04), both of 30 steps with a samples grid every 10, and broken-1, failed."""
        self.train("lr=0.01", "label=a")
        self.train("lr=0.04", "label=b")
        self.script("broken.lua", "runner.start() error('boom')")
        self.runner("broken.lua", check=1)

    def sql(self, query, *parameters):
        if self.postgresql:
            return self.server_sql(query, parameters)
        with sqlite3.connect(self.home / "index.db") as db:
            return db.execute(query, parameters).fetchall()

    def json_number(self, column, key):
        """SQL for the number at `key` of a JSON column, in the index's dialect."""
        return f"({column}::jsonb->>'{key}')::float8" if self.postgresql else f"json_extract({column}, '$.{key}')"

    def server_sql(self, query, parameters):
        """The query (SQLite's dialect: `?`, json_extract of a number) through psql; rows of ints, floats, text."""
        query = re.sub(r"json_extract\(([\w.]+), '\$\.(\w+)'\)", r"((\1)::jsonb->>'\2')::numeric", query)
        for value in parameters:
            literal = str(value) if isinstance(value, (int, float)) else "'" + str(value).replace("'", "''") + "'"
            query = query.replace("?", literal, 1)
        database = self.env["RUNNER_INDEX"].rsplit("/", 1)[1]
        output = subprocess.run([str(postgres_server.BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.server.port),
                                 "-U", "runner", "-d", database, "-X", "-q", "-A", "-t", "-F", "\x1f", "-P",
                                 "null=\x1e", "-v", "ON_ERROR_STOP=1", "-c", query],
                                check=True, capture_output=True, text=True).stdout

        def value(text):
            if text == "\x1e":
                return None
            for kind in (int, float):
                try:
                    return kind(text)
                except ValueError:
                    pass
            return text
        return [tuple(value(v) for v in line.split("\x1f")) for line in output.split("\n") if line]

    def set_sql(self, query, *parameters):
        if self.postgresql:
            self.server_sql(query, parameters)
            return
        db = sqlite3.connect(self.home / "index.db")
        db.execute(query, parameters)
        db.commit()
        db.close()


class RunsRecordedByScripts(IndexTest):
    def test_a_finished_run_has_its_row_directory_metrics_and_images(self):
        shown = self.train("lr=0.02")
        self.assertEqual(shown["status"], "finished")
        self.assertEqual(shown["name"], "train-1")
        self.assertRegex(shown["id"], r"^[0-9a-z]{8}$")
        self.assertEqual(shown["config"], {"steps": 30, "lr": 0.02, "label": "base", "keys": 3})
        self.assertEqual(shown["step"], 30)
        self.assertEqual(shown["summary"], {"final_loss": 1 / 30 * 0.02 * 100})
        self.assertEqual(shown["script_hash"], hashlib.sha256(TRAINING_SCRIPT.lstrip("\n").encode()).hexdigest())
        self.assertEqual(shown["versions"]["libtorch"], "2.11.0")
        self.assertEqual(shown["device"], "cuda:0" if torch.cuda.is_available() else "cpu")  # "auto"
        self.assertIsNone(shown["error"])
        self.assertEqual(shown["metrics"]["loss"], {"step": 30, "value": 1 / 30 * 0.02 * 100})
        self.assertEqual([a["path"] for a in shown["artifacts"]],
                         ["images/samples-0000010.png", "images/samples-0000020.png", "images/samples-0000030.png"])
        rows = self.sql("SELECT key, count(*), min(m.step), max(m.step) FROM metrics m JOIN runs r ON r.run = m.run "
                        "WHERE r.id = ? GROUP BY key ORDER BY key", shown["id"])
        self.assertEqual(rows, [("extra3", 30, 1, 30), ("loss", 30, 1, 30), ("lr", 30, 1, 30)])
        run_dir = self.home / "train-1"
        self.assertEqual((run_dir / "script.lua").read_text(), TRAINING_SCRIPT.lstrip("\n"))
        self.assertEqual(json.loads((run_dir / "config.json").read_text())["lr"], 0.02)
        self.assertIn("training train-1", (run_dir / "log.txt").read_text())
        self.assertEqual((run_dir / "images" / "samples-0000030.png").read_bytes()[:8], b"\x89PNG\r\n\x1a\n")

    def test_a_script_error_marks_the_run_failed_with_the_error(self):
        self.script("broken.lua", """
            local run = runner.start()
            run:log({ loss = 1 }, 1)
            error("boom")
        """)
        result = self.runner("broken.lua", check=1)
        self.assertIn("broken.lua:3: boom", result.stderr)
        shown = json.loads(self.runner("show", "broken-1", "--json", check=0).stdout)
        self.assertEqual(shown["status"], "failed")
        self.assertTrue(shown["error"].startswith("broken.lua:3: boom"), shown["error"])
        self.assertEqual(shown["metrics"]["loss"]["value"], 1)

    def test_os_exit_sets_the_status(self):
        self.script("exit0.lua", "runner.start() os.exit(0)")
        self.script("exit3.lua", "runner.start() os.exit(3)")
        self.runner("exit0.lua", check=0)
        self.runner("exit3.lua", check=3)
        self.assertEqual(self.sql("SELECT name, status, error FROM runs ORDER BY name"),
                         [("exit0-1", "finished", None), ("exit3-1", "failed", "the script called os.exit(3)")])

    def test_lua_errors_name_the_script_line(self):
        self.script("bad_metric.lua", """
            local run = runner.start()
            run:log { loss = "high" }
        """)
        result = self.runner("bad_metric.lua", check=1)
        self.assertIn("bad_metric.lua:2: run:log: 'loss' must be a number or a tensor (one element: a metric; more: a "
                      "histogram), got a string",
                      result.stderr)
        self.script("twice.lua", "runner.start() runner.start()")
        result = self.runner("twice.lua", check=1)
        self.assertIn("twice.lua:1: run 'twice-1' is still active in this process", result.stderr)
        self.script("named.lua", "runner.start(nil, { name = 'exp' })")
        self.runner("named.lua", check=0)
        result = self.runner("named.lua", check=1)
        self.assertIn("a run named 'exp' already exists", result.stderr)

    def test_runner_query_from_lua(self):
        self.train()
        self.train("lr=0.5")
        lr = self.json_number("config", "lr")
        result = self.runner("-e", f"""
            local rows, columns = runner.query("SELECT name, {lr} AS lr FROM runs "
              .. "WHERE {lr} > ? ORDER BY name", 0.1)
            print(#rows, rows[1].name, rows[1].lr, table.concat(columns, ","))
        """, check=0)
        self.assertEqual(result.stdout.strip(), "1\ttrain-2\t0.5\tname,lr")


class Interruptions(IndexTest):
    LOOP = """
        local run = runner.start(nil, { flush_interval = 0.05 })
        for step in run:steps(1000000) do
          run:log { loss = step, other = -step }
          if step % 10 == 0 then run:flush() print("flushed " .. step) io.stdout:flush() end
        end
    """

    def start_loop(self):
        self.script("loop.lua", self.LOOP)
        process = subprocess.Popen([RUNNER, "loop.lua"], cwd=self.dir, env=self.env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        flushed = 0
        for line in process.stdout:
            if line.startswith("flushed "):
                flushed = int(line.split()[1])
                if flushed >= 200:
                    break
        return process, flushed

    def test_sigkill_leaves_a_consistent_index_with_every_flushed_metric(self):
        process, flushed = self.start_loop()
        process.kill()
        process.communicate(timeout=30)
        self.assertEqual(process.returncode, -signal.SIGKILL)
        self.assertEqual(self.sql("PRAGMA integrity_check"), [("ok",)])
        steps = [s for (s,) in self.sql("SELECT step FROM metrics WHERE key = 'loss' ORDER BY step")]
        self.assertGreaterEqual(len(steps), flushed)
        self.assertEqual(steps, list(range(1, len(steps) + 1)))
        shown = json.loads(self.runner("show", "last", "--json", check=0).stdout)
        self.assertEqual(shown["status"], "interrupted")
        listed = self.runner("runs", "--status", "interrupted", "--csv", check=0).stdout.splitlines()
        self.assertEqual(len(listed), 2)
        # A later run marks the dead one interrupted in the index itself.
        self.script("next.lua", "runner.start()")
        self.runner("next.lua", check=0)
        self.assertEqual(self.sql("SELECT status, error FROM runs WHERE name = 'loop-1'"),
                         [("interrupted", "the process stopped without finishing the run (killed or crashed)")])

    def test_sigterm_flushes_and_marks_the_run_interrupted(self):
        process, flushed = self.start_loop()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        self.assertEqual(process.returncode, 128 + signal.SIGTERM, stderr)
        self.assertIn("interrupted by signal 15 (Terminated)", stderr)
        status, error, step = self.sql("SELECT status, error, step FROM runs")[0]
        self.assertEqual((status, error), ("interrupted", "interrupted by signal 15 (Terminated)"))
        logged = self.sql("SELECT count(*), max(step) FROM metrics WHERE key = 'loss'")[0]
        # Everything logged before the signal was flushed at exit, not only what the script flushed.
        self.assertEqual(logged[0], logged[1])
        self.assertGreaterEqual(logged[1], flushed)
        self.assertGreaterEqual(step, flushed)


class Attempts(IndexTest):
    # A checkpoint after every step; fails once after the checkpoint of step 3 while a file fail_once is there
    # (removing it); a usage error found late.
    SCRIPT = """
        local cfg = config { steps = 6, bad_option = false }
        local run = runner.start(cfg)
        if cfg.bad_option then runner.usage_error("bad_option=true is not allowed") end
        local model = nn.Linear(2, 1)
        local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.1 }, amp = "fp32", progress = false }
        run:restore { trainer = train }
        print("start at " .. run.step)
        while run.step < cfg.steps do
          train:step({ data = torch.ones(4, 2) }, function(batch) return model(batch.data):pow(2):mean() end)
          run:log { loss = 1 }
          run:checkpoint { wait = true }
          if run.step == 3 and os.remove("fail_once") then error("failing at step " .. run.step) end
        end
        print("done at " .. run.step)
    """

    def setUp(self):
        super().setUp()
        self.script("attempts.lua", self.SCRIPT)
        self.script("fail_once", "")

    def test_the_same_command_continues_a_failed_run_and_starts_anew_after_a_finished_one(self):
        self.assertIn("failing at step 3", self.runner("attempts.lua", check=1).stderr)
        continued = self.runner("attempts.lua", check=0)
        self.assertIn("resuming run attempts-1", continued.stdout)
        self.assertIn("start at 3", continued.stdout)
        again = self.runner("attempts.lua", check=0)
        self.assertIn("start at 0\n", again.stdout)
        self.assertIn("done at 6", again.stdout)
        self.assertIn("run attempts-1 of this script with this config finished; starting a new run", again.stderr)
        self.assertEqual(self.sql("SELECT name, status, step, attempts FROM runs ORDER BY run"),
                         [("attempts-1", "finished", 6, 2), ("attempts-2", "finished", 6, 1)])
        # Continuing a finished run is asked for by name.
        explicit = self.runner("--resume", "attempts-1", "attempts.lua", "steps=8", check=0)
        self.assertIn("start at 6", explicit.stdout)
        self.assertEqual(self.sql("SELECT step, attempts FROM runs WHERE name = 'attempts-1'"), [(8, 3)])

    def test_each_attempt_keeps_its_config_world_size_steps_and_times(self):
        self.runner("attempts.lua", check=1)
        self.runner("attempts.lua", check=0)
        resumed = self.runner("--resume", "attempts-1", "attempts.lua", "steps=8", check=0)
        self.assertIn("attempt 3 of run attempts-1 changes the config: steps 6 -> 8", resumed.stderr)
        shown = json.loads(self.runner("show", "attempts-1", "--json", check=0).stdout)
        self.assertEqual(shown["config"]["steps"], 8)  # the run's row: as its latest attempt ran
        history = shown["attempt_history"]
        host = [socket.gethostname()]
        self.assertEqual([(a["attempt"], a["status"], a["config"]["steps"], a["world_size"], a["hosts"], a["start_step"],
                           a["end_step"]) for a in history],
                         [(1, "failed", 6, 1, host, 0, 3), (2, "finished", 6, 1, host, 3, 6),
                          (3, "finished", 8, 1, host, 6, 8)])
        self.assertRegex(history[0]["error"], r"^attempts\.lua:\d+: failing at step 3")
        times = [t for a in history for t in (a["started_at"], a["ended_at"])]
        self.assertEqual(times, sorted(times))
        self.assertEqual(self.sql("SELECT a.attempt, a.status, json_extract(a.config, '$.steps') FROM attempts a "
                                  "JOIN runs r USING (run) WHERE r.name = 'attempts-1' ORDER BY a.attempt"),
                         [(1, "failed", 6), (2, "finished", 6), (3, "finished", 8)])
        text = self.runner("show", "attempts-1", check=0).stdout
        self.assertRegex(text, r"\n +3 +finished .* 6-8 +1 +\S+ +steps=8 +-\n")
        # log.txt has each attempt's config as it ran.
        lines = [line for line in (self.home / "attempts-1" / "log.txt").read_text().splitlines() if "config {" in line]
        self.assertEqual([json.loads(line[line.index("config {") + 7:line.index("}, world size") + 1])["steps"]
                          for line in lines], [6, 6, 8])
        self.assertIn("attempt 3 of run attempts-1", lines[2])
        self.assertTrue(lines[2].endswith(f"world size 1, hosts {socket.gethostname()}"), lines[2])

    def test_a_usage_error_before_the_first_step_leaves_no_run_behind(self):
        failed = self.runner("attempts.lua", "bad_option=true", check=2)
        self.assertIn("attempts.lua:3: bad_option=true is not allowed", failed.stderr)
        self.assertRegex(failed.stderr, r"run attempts-1 \([0-9a-z]{8}\) is not kept: it stopped on a usage error "
                                        r"before its first step")
        self.assertEqual(self.sql("SELECT count(*) FROM runs"), [(0,)])
        self.assertFalse((self.home / "attempts-1").exists())
        # A resumed run whose attempt stops so is left as it was.
        self.runner("attempts.lua", check=1)
        self.runner("attempts.lua", check=0)
        before = json.loads(self.runner("show", "attempts-1", "--json", check=0).stdout)
        files = {name: (self.home / "attempts-1" / name).read_text() for name in ("config.json", "script.lua")}
        again = self.runner("--resume", "attempts-1", "attempts.lua", "bad_option=true", check=2)
        self.assertIn("run attempts-1 (" + before["id"] + ") is left as it was: the attempt stopped on a usage error "
                      "before its first step", again.stderr)
        self.script("typo.lua", "runner.start() runner.usage_error('a typo')")
        self.runner("--resume", "attempts-1", "typo.lua", check=2)
        after = json.loads(self.runner("show", "attempts-1", "--json", check=0).stdout)
        self.assertEqual(after, before)
        self.assertEqual({name: (self.home / "attempts-1" / name).read_text() for name in files}, files)


class ConcurrentWriters(IndexTest):
    def test_eight_processes_write_at_once_and_lose_nothing(self):
        self.script("writer.lua", """
            local cfg = config { steps = 4000, worker = 0 }
            local run = runner.start(cfg, { flush_interval = 0.002 })
            for step in run:steps(cfg.steps) do
              run:log { a = step, b = step * 2, c = cfg.worker }
              if step % 500 == 0 then run:set_summary { progress = step } end
            end
        """)
        self.runner("writer.lua", "steps=1", check=0)  # creates the index before the stampede
        processes = [subprocess.Popen([RUNNER, "writer.lua", f"worker={w}"], cwd=self.dir, env=self.env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(8)]
        readers_ok = 0
        while any(p.poll() is None for p in processes):
            result = self.runner("query", "SELECT count(*) FROM metrics", "--csv")
            self.assertEqual(result.returncode, 0, result.stderr)
            readers_ok += 1
        for p in processes:
            out, err = p.communicate()
            self.assertEqual(p.returncode, 0, err)
            self.assertNotIn("locked", err)
        self.assertGreater(readers_ok, 0)
        counts = self.sql("SELECT json_extract(r.config, '$.worker'), count(*), sum(m.value) FROM metrics m "
                          "JOIN runs r ON r.run = m.run WHERE r.name != 'writer-1' GROUP BY r.run ORDER BY 1")
        self.assertEqual([(w, n) for w, n, _ in counts], [(w, 3 * 4000) for w in range(8)])
        for worker, _, total in counts:
            self.assertEqual(total, 3 * 4000 * 4001 / 2 + 4000 * worker)
        self.assertEqual(self.sql("SELECT DISTINCT status FROM runs"), [("finished",)])
        self.assertEqual(self.sql("SELECT count(*) FROM runs WHERE json_extract(summary, '$.progress') = 4000"), [(8,)])


class ControlCharactersInData(IndexTest):
    HOSTILE = """
        local cfg = config { label = "plain" }
        local run = runner.start(cfg)
        run.step = 1
        run:log { ["k\\27[1mbold"] = 1.5 }
        run:set_summary { ["s\\27]0;title\\7"] = "v\\27[2J\\194\\155" }
        error("bad \\27[31mthing\\r\\n second line")
    """

    def test_every_text_output_escapes_them(self):
        self.script("hostile.lua", self.HOSTILE)
        result = self.runner("hostile.lua", "label=x\x1b[32mgreen", check=1)
        self.assertIn("config: label=x\\x1b[32mgreen*", result.stderr)
        self.assertIn("hostile.lua:6: bad \\x1b[31mthing\\r\n second line", result.stderr)
        log = (self.home / "hostile-1" / "log.txt").read_text()
        self.assertIn("hostile.lua:6: bad \\x1b[31mthing\\r\n second line", log)
        self.assertRegex(log, r"\[info\] run hostile-1 \([0-9a-z]{8}\) failed\n$")
        self.runner("hostile.lua", check=1)
        outputs = {"runs": self.runner("runs", "--metrics", "k\x1b[1mbold", check=0),
                   "show": self.runner("show", "hostile-1", check=0),
                   "compare": self.runner("compare", "hostile-1", "hostile-2", check=0),
                   "query": self.runner("query", "SELECT key, error FROM metrics, runs", check=0),
                   "missing": self.runner("\x1b[31m.lua", check=2)}
        for name, output in outputs.items():
            self.assertNotIn("\x1b", output.stdout + output.stderr, name)
            self.assertNotIn("\x07", output.stdout + output.stderr, name)
            self.assertNotIn("\u009b", output.stdout + output.stderr, name)
        shown = outputs["show"].stdout
        self.assertIn("error     hostile.lua:6: bad \\x1b[31mthing\\r\n", shown)
        self.assertIn("  label  x\\x1b[32mgreen\n", shown)
        self.assertIn("  s\\x1b]0;title\\x07  v\\x1b[2J\\u009b\n", shown)
        self.assertIn("  k\\x1b[1mbold     1    1.5\n", shown)
        self.assertIn("k\\x1b[1mbold", outputs["runs"].stdout)
        self.assertIn("runner: cannot open \\x1b[31m.lua", outputs["missing"].stderr)
        # The index keeps the data as it was given; JSON and CSV carry it exactly.
        self.assertEqual(json.loads(self.runner("show", "hostile-1", "--json", check=0).stdout)["config"]["label"],
                         "x\x1b[32mgreen")
        self.assertEqual(self.runner("query", "SELECT DISTINCT key FROM metrics", "--csv", check=0).stdout,
                         "key\nk\x1b[1mbold\n")


class BytesThatAreNotUTF8(IndexTest):
    """The index holds UTF-8 only: what a user types is refused, what comes from the world is escaped, and an index
    that already holds other bytes (written by an older runner) still gives valid JSON."""

    def test_a_failure_naming_a_latin1_file_is_recorded_failed_with_its_error(self):
        (self.dir / "images").mkdir()
        with open(os.path.join(os.fsencode(self.dir / "images"), b"caf\xe9.jpg"), "wb") as damaged:
            damaged.write(b"not a jpeg at all")
        self.script("load.lua", """
            local run = runner.start()
            local loader = runner.data.loader(runner.data.image_folder { path = "images" }, { batch = 1 })
            for batch in loader:iter { from = 0, to = 1 } do end
        """)
        result = self.runner("load.lua", check=1)
        self.assertIn("caf\\xe9.jpg", result.stderr)
        status, error = self.sql("SELECT status, error FROM runs")[0]
        self.assertEqual(status, "failed")
        self.assertIn("images/caf\\xe9.jpg", error)
        runs = json.loads(self.runner("runs", "--json", check=0).stdout)
        self.assertEqual([run["status"] for run in runs], ["failed"])
        shown = json.loads(self.runner("show", "last", "--json", check=0).stdout)
        self.assertIn("images/caf\\xe9.jpg", shown["error"])

    def test_a_note_or_a_key_that_is_not_utf8_is_refused_and_changes_nothing(self):
        self.script("keys.lua", """
            local run = runner.start()
            run.step = 1
            print(pcall(run.log, run, { ["loss\\255"] = 1 }))
            print(pcall(run.log, run, { ["w\\255"] = torch.randn(8) }))
            print(pcall(run.note, run, "caf\\233"))
            run:log { loss = 2 }
        """)
        result = self.runner("keys.lua", check=0)
        lines = result.stdout.splitlines()
        self.assertRegex(lines[0], r'^false\tkeys\.lua:3: metric key is not valid UTF-8 \(byte 0xff at offset 4 of "loss\\xff"\)$')
        self.assertRegex(lines[1], r'^false\tkeys\.lua:4: histogram key is not valid UTF-8 \(byte 0xff at offset 1 of "w\\xff"\)$')
        self.assertRegex(lines[2], r'^false\tkeys\.lua:5: the note is not valid UTF-8 \(byte 0xe9 at offset 3 of "caf\\xe9"\)$')
        self.assertEqual(self.sql("SELECT key FROM metrics"), [("loss",)])
        result = subprocess.run([RUNNER, "note", "last", b"caf\xe9"], cwd=self.dir, env=self.env, capture_output=True)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(b'the note is not valid UTF-8 (byte 0xe9 at offset 3 of "caf\\xe9")', result.stderr)
        self.assertEqual(self.sql("SELECT note FROM runs"), [(None,)])
        # A config value from the command line is checked as the run records it: no run starts.
        self.script("cfg.lua", "local cfg = config { label = 'x' }\nrunner.start(cfg)")
        result = subprocess.run([RUNNER, "cfg.lua", b"label=caf\xe9"], cwd=self.dir, env=self.env, capture_output=True)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(b'cfg.lua:2: config.label is not valid UTF-8 (byte 0xe9 at offset 3 of "caf\\xe9")', result.stderr)
        self.assertEqual(len(self.sql("SELECT run FROM runs")), 1)

    def test_an_index_already_holding_such_bytes_gives_valid_json(self):
        if self.postgresql:
            self.skipTest("a PostgreSQL index cannot hold text that is not UTF-8")
        self.train("lr=0.01")
        db = sqlite3.connect(self.home / "index.db")
        db.execute("UPDATE runs SET note = CAST(? AS TEXT), error = CAST(? AS TEXT)", (b"\xffnote", b"caf\xe9"))
        for table in ("metrics", "metric_latest"):
            db.execute(f"UPDATE {table} SET key = CAST(? AS TEXT) WHERE key = 'loss'", (b"lo\xffss",))
        db.commit()
        db.close()
        runs = json.loads(self.runner("runs", "--json", check=0).stdout)
        self.assertEqual(runs[0]["note"], "\ufffdnote")
        shown = json.loads(self.runner("show", "last", "--json", check=0).stdout)
        self.assertEqual(shown["error"], "caf\ufffd")
        self.assertIn("lo\ufffdss", shown["metrics"])
        self.assertIn("lo\ufffdss", self.runner("show", "last", check=0).stdout)
        rows = json.loads(self.runner("query", "SELECT note FROM runs", "--json", check=0).stdout)
        self.assertEqual(rows, [{"note": "\ufffdnote"}])


class ReadOnlyMedium(IndexTest):
    """The read commands on an index whose folder is a read-only mount (a private mount namespace per command)."""

    def read_only(self, *args, check=None):
        # unshare gives the command its own mount namespace (as root, or as a mapped root in a user namespace),
        # where the home folder is bind-mounted onto itself read-only; nothing outside sees the mount.
        user = [] if os.geteuid() == 0 else ["--map-root-user"]
        command = (f'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && touch "$1/probe" 2>/dev/null '
                   f'&& echo "the mount is writable" >&2 && exit 99; shift; exec "$@"')
        result = subprocess.run(["unshare", *user, "--mount", "--propagation", "private", "sh", "-c", command, "sh",
                                 str(self.home), RUNNER, *args], capture_output=True, text=True, cwd=self.dir,
                                env=self.env, timeout=120)
        if "mount:" in result.stderr or "unshare:" in result.stderr:
            self.skipTest(f"no read-only mount can be made here: {result.stderr.strip()}")
        if check is not None:
            self.assertEqual(result.returncode, check, f"runner {' '.join(args)}\n{result.stdout}\n{result.stderr}")
        return result

    def test_the_read_commands_work_on_a_read_only_mount(self):
        self.train("lr=0.02")
        self.train("lr=0.03")
        before = sorted(p.name for p in self.home.iterdir())
        self.check_read_commands()
        # As the last writer leaves it (no -wal, no -shm), and as the read commands leave it (both).
        for name in ("index.db-wal", "index.db-shm"):
            (self.home / name).unlink(missing_ok=True)
        self.check_read_commands()
        self.assertEqual(sorted(p.name for p in self.home.iterdir()), [p for p in before if not p.startswith("index.db-")])

    def check_read_commands(self):
        runs = self.read_only("runs", check=0)
        self.assertEqual(runs.stderr, "")
        self.assertEqual([line.split()[1] for line in runs.stdout.splitlines()[2:]], ["train-2", "train-1"])
        shown = json.loads(self.read_only("show", "train-1", "--json", check=0).stdout)
        self.assertEqual(shown["config"]["lr"], 0.02)
        self.assertEqual(self.read_only("query", "SELECT count(*) AS n FROM metrics", "--csv", check=0).stdout,
                         "n\n180\n")
        self.assertIn("lr", self.read_only("compare", "train-1", "train-2", check=0).stdout)
        self.script("count.lua", "print(#runner.query('SELECT * FROM runs'))")
        self.assertEqual(self.read_only("count.lua", check=0).stdout, "2\n")

    def test_a_write_ahead_log_that_cannot_be_read_there_is_named(self):
        self.train()
        writer = sqlite3.connect(self.home / "index.db")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("UPDATE runs SET name = 'renamed'")
        writer.commit()
        self.assertGreater((self.home / "index.db-wal").stat().st_size, 0)
        archive = self.dir / "archive"
        archive.mkdir()
        for name in ("index.db", "index.db-wal"):
            (archive / name).write_bytes((self.home / name).read_bytes())
        writer.close()
        self.home = archive
        self.env = {**self.env, "RUNNER_HOME": str(archive)}
        result = self.read_only("runs", check=1)
        self.assertEqual(result.stderr,
                         f"runner runs: {archive}/index.db: the index is on a read-only medium and its write-ahead "
                         f"log ({archive}/index.db-wal) holds changes that cannot be read without a "
                         f"{archive}/index.db-shm file; copy the folder to a writable place to read it\n")


class IndexCommands(IndexTest):
    def test_runs_table_filters_and_sorting(self):
        self.three_runs()
        table = self.runner("runs", check=0).stdout.splitlines()
        self.assertEqual(table[0].split(), ["id", "name", "status", "started", "duration", "step", "ranks", "final_loss"])
        self.assertEqual(table[2].split()[-2], "1")  # ranks
        self.assertEqual([line.split()[1] for line in table[2:]], ["broken-1", "train-2", "train-1"])
        self.assertEqual(table[2].split()[2], "failed")
        by_loss = self.runner("runs", "--sort", "final_loss", "--csv", check=0).stdout.splitlines()
        self.assertEqual([line.split(",")[1] for line in by_loss[1:]], ["train-1", "train-2", "broken-1"])
        descending = self.runner("runs", "--sort", "final_loss", "--desc", "--csv", check=0).stdout.splitlines()
        self.assertEqual([line.split(",")[1] for line in descending[1:]], ["train-2", "train-1", "broken-1"])
        unknown = self.runner("runs", "--sort", "final_los", check=2)
        self.assertIn("--sort 'final_los': no run shown has it (known: ", unknown.stderr)
        self.assertIn("final_loss", unknown.stderr)
        self.assertIn("; did you mean 'final_loss'?", unknown.stderr)
        self.assertEqual(unknown.stdout, "")
        failed = json.loads(self.runner("runs", "--status", "failed", "--json", check=0).stdout)
        self.assertEqual([r["name"] for r in failed], ["broken-1"])
        named = json.loads(self.runner("runs", "--name", "train-*", "--json", "--metrics", "loss,lr", check=0).stdout)
        self.assertEqual([(r["name"], r["lr"]) for r in named], [("train-2", 0.04), ("train-1", 0.01)])
        self.assertEqual(self.runner("runs", "--since", "2099-01-01", check=0).stdout, "no runs match\n")
        self.assertEqual(len(json.loads(self.runner("runs", "--since", "1h", "--json", check=0).stdout)), 3)
        limited = self.runner("runs", "--limit", "1", check=0).stdout.splitlines()
        self.assertEqual(limited[-1], "(1 of 3 runs shown; --limit 0 shows all)")
        result = self.runner("runs", "--status", "done", check=2)
        self.assertTrue(result.stderr.startswith(
            "runner runs: --status 'done': expected one of running, finished, failed, interrupted, paused, pruned\n"))

    def test_show_prints_config_metrics_and_artifacts(self):
        self.three_runs()
        text = self.runner("show", "train-2", check=0).stdout
        self.assertRegex(text, r"^run       train-2 \([0-9a-z]{8}\)\nstatus    finished\n")
        self.assertRegex(text, r"\n  loss +30 +0\.133333\n")
        self.assertIn("\nrerun     runner train.lua keys=3 label=b lr=0.04 steps=30   (runner 0.1.0)\n", text)
        for expected in ["\nconfig\n", "  lr     0.04", "\nmetrics (latest)\n", "\nartifacts\n",
                         "images/samples-0000030.png", "\nversions\n", "  libtorch  2.11.0"]:
            self.assertIn(expected, text)
        failed = self.runner("show", "broken-1", check=0).stdout
        self.assertIn("status    failed\nerror     broken.lua:1: boom\n", failed)

    def test_compare_lists_differences_and_metrics_side_by_side(self):
        self.three_runs()
        table = self.runner("compare", "train-1", "train-2", "--csv", check=0).stdout.splitlines()
        header = table[0].split(",")
        self.assertEqual(header[:2], ["section", "key"])
        self.assertRegex(header[2], r"^train-1 \([0-9a-z]{8}\)$")
        rows = {tuple(line.split(",")[:2]): line.split(",")[2:] for line in table[1:]}
        self.assertEqual(rows[("config", "lr")], ["0.01", "0.04"])
        self.assertEqual(rows[("config", "label")], ["a", "b"])
        self.assertNotIn(("config", "steps"), rows)
        self.assertEqual(rows[("metric", "lr")], ["0.01", "0.04"])
        self.assertEqual(rows[("run", "status")], ["finished", "finished"])
        with_all = self.runner("compare", "train-1", "train-2", "--all", "--csv", check=0).stdout
        self.assertIn("config,steps,30,30", with_all)
        result = self.runner("compare", "train-1", check=2)
        self.assertTrue(result.stderr.startswith("runner compare: expected two or more RUNs to compare\n"))
        self.assertNotIn("objectives differ", self.runner("compare", "train-1", "train-2", check=0).stdout)

    def test_runs_grouped_across_seeds_show_each_metric_s_mean_and_spread(self):
        self.script("seeded.lua", """
            local cfg = config { lr = 0.1, seed = 1, width = 8 }
            local run = runner.start(cfg)
            run:set_summary { score = cfg.lr * 10 + cfg.seed }
            run:log { loss = cfg.seed }
        """)
        for lr, seed in (("0.1", 1), ("0.1", 2), ("0.1", 3), ("0.2", 1), ("0.2", 2)):
            self.runner("seeded.lua", f"lr={lr}", f"seed={seed}", check=0)
        table = self.runner("runs", "--group", "--metrics", "score", "--sort", "score", "--desc", "--csv",
                            check=0).stdout.splitlines()
        # --group: every config key but seed, showing the keys that tell the groups apart (width is the same).
        self.assertEqual(table[0], "lr,runs,score,score std")
        rows = [line.split(",") for line in table[1:]]
        self.assertEqual([(r[0], r[1]) for r in rows], [("0.2", "2"), ("0.1", "3")])
        self.assertAlmostEqual(float(rows[0][2]), 3.5)
        self.assertAlmostEqual(float(rows[0][3]), 0.5 ** 0.5)
        self.assertAlmostEqual(float(rows[1][2]), 3.0)
        self.assertAlmostEqual(float(rows[1][3]), 1.0)
        aligned = self.runner("runs", "--group-by", "lr,width", "--metrics", "score,loss", check=0).stdout
        self.assertRegex(aligned, r"0\.1\s+8\s+3\s+3 \u00b1 1 \(3\)\s+2 \u00b1 1 \(3\)")
        self.assertRegex(aligned, r"0\.2\s+8\s+2\s+3\.5 \u00b1 0\.707107 \(2\)\s+1\.5 \u00b1 0\.707107 \(2\)")
        refused = self.runner("runs", "--group-by", "lrr", check=2).stderr
        self.assertIn("runner runs: --group-by 'lrr': no run shown has it (known: lr, seed, width); did you mean 'lr'?",
                      refused)

    def test_runs_shows_config_columns_and_says_which_of_two_alike_names_it_sorts_by(self):
        self.three_runs()  # train-1 (lr 0.01, label a), train-2 (lr 0.04, label b): lr is a config key and a metric
        table = self.runner("runs", "--name", "train*", "--columns", "label,config.lr,loss", "--sort", "label",
                            "--desc", "--csv", check=0).stdout.splitlines()
        header = table[0].split(",")
        self.assertEqual(header[header.index("label"):header.index("label") + 3], ["label", "config.lr", "loss"])
        rows = [dict(zip(header, line.split(","))) for line in table[1:]]
        self.assertEqual([(r["name"], r["label"], r["config.lr"]) for r in rows],
                         [("train-2", "b", "0.04"), ("train-1", "a", "0.01")])
        both = self.runner("runs", "--columns", "lr", check=2).stderr
        self.assertIn("runner runs: --columns 'lr': it is both a config key and a metric: write config.lr or metric.lr",
                      both)
        self.assertIn("runner runs: --columns 'labl': no run shown has it (known: ", self.runner(
            "runs", "--columns", "labl", check=2).stderr)
        self.assertIn("did you mean 'label'?", self.runner("runs", "--columns", "labl", check=2).stderr)
        self.assertIn("runner runs: --metrics 'los': no run shown has it (known: ",
                      self.runner("runs", "--metrics", "los", check=2).stderr)
        by_metric = self.runner("runs", "--name", "train*", "--sort", "lr", check=0).stdout
        self.assertTrue(by_metric.endswith("(sorted by the metric lr; --sort config.lr sorts by the config value)\n"))
        by_config = self.runner("runs", "--name", "train*", "--sort", "config.lr", "--desc", "--csv", check=0).stdout
        self.assertEqual([line.split(",")[1] for line in by_config.splitlines()[1:]], ["train-2", "train-1"])

    def test_compare_says_that_losses_of_different_objectives_do_not_compare(self):
        self.script("objective.lua", 'local cfg = config { objective = "ddpm" }\nlocal run = runner.start(cfg)\n'
                                     'run:log { loss = 0.5 }\n')
        self.runner("objective.lua", check=0)
        self.runner("objective.lua", "objective=flow", check=0)
        note = ("the runs' objectives differ (ddpm, flow): their losses measure different things and cannot be "
                "compared; compare what their samples score")
        self.assertIn(f"({note})\n", self.runner("compare", "objective-1", "objective-2", check=0).stdout)
        csv = self.runner("compare", "objective-1", "objective-2", "--csv", check=0)
        self.assertEqual(csv.stderr, f"runner compare: {note}\n")

    def test_query_output_formats(self):
        self.three_runs()
        sql = f"SELECT name, step, {self.json_number('config', 'lr')} AS lr FROM runs WHERE name LIKE 'train%' ORDER BY name"
        self.assertEqual(self.runner("query", sql, check=0).stdout,
                         "name     step    lr\n-------  ----  ----\ntrain-1    30  0.01\ntrain-2    30  0.04\n")
        self.assertEqual(self.runner("query", sql, "--csv", check=0).stdout,
                         "name,step,lr\ntrain-1,30,0.01\ntrain-2,30,0.04\n")
        self.assertEqual(json.loads(self.runner("query", sql, "--json", check=0).stdout),
                         [{"name": "train-1", "step": 30, "lr": 0.01}, {"name": "train-2", "step": 30, "lr": 0.04}])
        # Time columns read as local dates in the table; CSV and JSON keep the seconds.
        (created,) = self.sql("SELECT started_at FROM runs WHERE name = 'train-1'")[0]
        timed = "SELECT name, started_at FROM runs WHERE name = 'train-1'"
        table = self.runner("query", timed, check=0).stdout.splitlines()
        local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
        self.assertEqual(table[2].split(None, 1)[1].strip(), local)
        csv = self.runner("query", timed, "--csv", check=0).stdout.splitlines()[1].split(",")
        self.assertAlmostEqual(float(csv[1]), created, places=3)

    def test_run_references(self):
        self.three_runs()
        ids = dict(self.sql("SELECT name, id FROM runs"))
        for reference, name in [(ids["train-1"], "train-1"), (ids["train-2"][:5], "train-2"), ("train-1", "train-1"),
                                ("last", "broken-1")]:
            shown = json.loads(self.runner("show", reference, "--json", check=0).stdout)
            self.assertEqual(shown["name"], name, reference)
        self.set_sql("UPDATE runs SET id = 'abc11111' WHERE name = 'train-1'")
        self.set_sql("UPDATE runs SET id = 'abc22222' WHERE name = 'train-2'")
        result = self.runner("show", "abc", check=1)
        self.assertEqual(result.stderr,
                         "runner show: run prefix 'abc' is ambiguous: it matches 2 runs: abc22222 (train-2), "
                         "abc11111 (train-1)\n")
        result = self.runner("show", "nosuchrun", check=1)
        self.assertEqual(result.stderr, "runner show: no run matches 'nosuchrun' (give an id, a unique id prefix, "
                                        "a name or 'last'; `runner runs` lists them)\n")

    def test_report_is_self_contained_and_renders_curves_in_chromium(self):
        self.three_runs()
        result = self.runner("report", "train-1", "train-2", "-o", "report.html", check=0)
        self.assertEqual(result.stdout, "wrote report.html (2 runs)\n")
        html = (self.dir / "report.html").read_text()
        self.assertNotIn("http://", html.replace("http://www.w3.org/2000/svg", ""))
        self.assertNotIn("https://", html)
        self.assertNotIn("<script", html)
        # Every grid of both runs (steps 10, 20, 30), the latest first and the two earlier ones below it.
        self.assertEqual(html.count("data:image/png;base64,"), 6)
        self.assertEqual(html.count("<details><summary>2 earlier samples grids</summary>"), 2)
        self.assertLess(html.index("samples \u00b7 step 30</figcaption>"), html.index("samples \u00b7 step 20</figcaption>"))
        self.assertIn("train-1", html)
        if report_screenshot.chromium_binary() is None:
            if os.environ.get("RUNNER_NO_BROWSER"):  # scripts/gpu-check: the GPU host has no browser
                self.skipTest("RUNNER_NO_BROWSER is set: the report's rendering is not checked on this host")
            self.fail("chromium is not installed (scripts/setup installs it); the report cannot be checked")
        png = report_screenshot.screenshot(self.dir / "report.html", self.dir / "report.png")
        first_run = report_screenshot.count_colour(png, "#1f77b4", tolerance=40)
        second_run = report_screenshot.count_colour(png, "#ff7f0e", tolerance=40)
        self.assertGreater(first_run, 200, "the first run's curve is not visible")
        self.assertGreater(second_run, 200, "the second run's curve is not visible")
        blank = self.dir / "blank.html"
        blank.write_text("<!doctype html><html><body></body></html>")
        blank_png = report_screenshot.screenshot(blank, self.dir / "blank.png")
        self.assertLess(report_screenshot.count_colour(blank_png, "#1f77b4", tolerance=40), 10)

    def grouped_runs(self):
        """groups-1..4: lr 0.01 and 0.04, each with seeds 0 and 1; loss (1 + seed) * lr * 100 / step and grad_norm over
        40 steps, swd, eval/fid and late/x every 10 steps, and the summary's swd_floor 0.02."""
        self.script("groups.lua", GROUPED_SCRIPT)
        for overrides in (("lr=0.01", "seed=0"), ("lr=0.01", "seed=1"), ("lr=0.04", "seed=0"), ("lr=0.04", "seed=1")):
            self.runner("groups.lua", *overrides, check=0)

    @staticmethod
    def chart(html, key):
        """The SVG of the chart titled `key`."""
        start = html.index(f'aria-label="{key}"')
        return html[start:html.index("</svg>", start)]

    def test_report_groups_runs_of_several_seeds_as_a_mean_line_over_a_band(self):
        self.grouped_runs()
        self.runner("report", "groups-1", "groups-2", "groups-3", "groups-4", "--group", "-o", "grouped.html", check=0)
        html = (self.dir / "grouped.html").read_text()
        loss = self.chart(html, "loss")
        # A line and a band per group (the seeds vary within a group: every config key but seed tells them apart),
        # in the colour of the group's first run, and the legend says what the band is.
        self.assertEqual(re.findall(r'>(lr=[^<]*)<title>', loss), ["lr=0.01 (2 runs)", "lr=0.04 (2 runs)"])
        self.assertEqual(re.findall(r'<polygon class="band" fill="([^"]+)"', loss), ["#1f77b4", "#2ca02c"])
        self.assertEqual(re.findall(r'<polyline fill="none" stroke="([^"]+)"', loss), ["#1f77b4", "#2ca02c"])
        self.assertIn(">each group: the mean of its runs, over a band from their lowest to their highest value</text>",
                      loss)
        # The mean of 1/step and 2/step (lr 0.01) lies inside the band, between them.
        self.runner("report", "groups-1", "groups-2", "--group-by", "lr", "-o", "one.html", check=0)
        one = self.chart((self.dir / "one.html").read_text(), "loss")
        self.assertEqual(re.findall(r'>(lr=[^<]*)<title>', one), ["lr=0.01 (2 runs)"])
        band = [tuple(map(float, p.split(","))) for p in re.search(r'class="band"[^>]*points="([^"]+)"', one)
                .group(1).split()]
        line = [tuple(map(float, p.split(","))) for p in re.search(r'<polyline [^>]*points="([^"]+)"', one)
                .group(1).split()]
        self.assertEqual(len(band), 2 * len(line))
        high, low = band[:len(line)], band[len(line):][::-1]
        for (x, mean), (_, top), (_, bottom) in zip(line, high, low):
            self.assertLess(top, mean)  # pixels: y grows downwards
            self.assertLess(mean, bottom)
        # Without --group, a line per run.
        self.runner("report", "groups-1", "groups-2", "-o", "runs.html", check=0)
        self.assertNotIn('class="band"', (self.dir / "runs.html").read_text())
        wrong = self.runner("report", "groups-1", "--group-by", "lrr", check=2)
        self.assertEqual(wrong.stderr.splitlines()[0], "runner report: --group-by 'lrr': no run shown has it (known: lr, "
                                                       "seed, steps); did you mean 'lr'?")

    def test_compare_groups_the_runs_into_a_column_of_means_and_spreads_per_group(self):
        self.grouped_runs()
        runs = ("groups-1", "groups-2", "groups-3", "groups-4")
        table = self.runner("compare", *runs, "--group", check=0).stdout.splitlines()
        self.assertEqual(re.split(r"\s{2,}", table[0]), ["section", "key", "lr=0.01 (2 runs)", "lr=0.04 (2 runs)"])
        rows = {tuple(line.split()[:2]): re.split(r"\s{2,}", line)[2:] for line in table[2:]}
        self.assertEqual(rows[("run", "runs")], ["groups-1 groups-2", "groups-3 groups-4"])
        self.assertEqual(rows[("config", "lr")], ["0.01", "0.04"])
        self.assertEqual(rows[("metric", "loss")], ["0.0375 \u00b1 0.0176777 (2)", "0.15 \u00b1 0.0707107 (2)"])
        self.assertEqual(rows[("summary", "swd_floor")], ["0.02 \u00b1 0 (2)", "0.02 \u00b1 0 (2)"])
        csv = self.runner("compare", *runs, "--group-by", "lr", "--csv", check=0).stdout.splitlines()
        cells = {tuple(line.split(",")[:2]): line.split(",")[2:] for line in csv[1:]}
        self.assertEqual([round(float(v), 6) for v in cells[("metric", "loss")]], [0.0375, 0.15])
        self.assertEqual([round(float(v), 6) for v in cells[("metric", "loss std")]], [0.017678, 0.070711])
        wrong = self.runner("compare", *runs, "--group-by", "seeds", check=2)
        self.assertEqual(wrong.stderr.splitlines()[0], "runner compare: --group-by 'seeds': no run shown has it (known: "
                                                       "lr, seed, steps); did you mean 'seed'?")

    def test_report_draws_a_metrics_floor_and_heads_each_prefix_of_charts(self):
        self.grouped_runs()
        self.runner("report", "groups-2", "-o", "floor.html", check=0)
        html = (self.dir / "floor.html").read_text()
        # swd_floor in the summary beside swd: a dashed line across swd's chart, labelled with it.
        floor = re.findall(r'<g class="reference-line" data-value="([^"]+)"><line [^>]*stroke-dasharray="6 4"/>'
                           r'<text [^>]*>([^<]*)</text>', self.chart(html, "swd"))
        self.assertEqual(floor, [("0.02", "swd_floor 0.02")])
        self.assertNotIn("reference-line", self.chart(html, "loss"))
        # A heading per prefix, its charts under it; the metrics without one after them under "other metrics".
        order = re.findall(r'<h3 class="metric-prefix">([^<]*)</h3>|aria-label="([^"]+)"', html.split("<h2>Metrics</h2>")[1]
                           .split("<h2>Config</h2>")[0])
        self.assertEqual([heading or chart for heading, chart in order],
                         ["loss", "eval/", "eval/fid", "late/", "late/x", "other metrics", "grad_norm", "swd"])

    def test_a_run_has_the_same_colour_in_every_report(self):
        self.grouped_runs()
        self.runner("report", "groups-2", "groups-1", "-o", "two.html", check=0)
        self.runner("report", "groups-3", "groups-2", "-o", "other.html", check=0)
        for name, colours in (("two.html", ["#ff7f0e", "#1f77b4"]), ("other.html", ["#2ca02c", "#ff7f0e"])):
            loss = self.chart((self.dir / name).read_text(), "loss")
            self.assertEqual(re.findall(r'<polyline fill="none" stroke="([^"]+)"', loss), colours)

    def test_report_curves_over_the_time_since_the_start_or_the_clock(self):
        self.three_runs()
        # Step s of each run logged s minutes after its start, so the axes' ticks are known.
        self.set_sql("UPDATE metrics SET time = (SELECT r.started_at FROM runs r WHERE r.run = metrics.run) + step * 60")
        self.runner("report", "train-1", "--metrics", "loss", "--x", "relative", "-o", "relative.html", check=0)
        relative = (self.dir / "relative.html").read_text()
        self.assertIn(">time since the start</text>", relative)
        self.assertEqual(re.findall(r">(\d+m)</text>", relative), ["5m", "10m", "15m", "20m", "25m", "30m"])
        self.assertNotIn(">step</text>", relative)
        self.runner("report", "train-1", "--metrics", "loss", "--x", "time", "-o", "clock.html", check=0)
        clock = (self.dir / "clock.html").read_text()
        self.assertIn(">time</text>", clock)
        # Local clock times at every fifth minute from step 1's time to step 30's.
        started = self.sql("SELECT started_at FROM runs WHERE name = 'train-1'")[0][0]
        fifths = range(math.ceil((started + 60) / 300), math.floor((started + 1800) / 300) + 1)
        self.assertEqual(re.findall(r">(\d\d:\d\d)</text>", clock),
                         [time.strftime("%H:%M", time.localtime(k * 300)) for k in fifths])
        self.runner("report", "train-1", "-o", "steps.html", check=0)
        self.assertIn(">step</text>", (self.dir / "steps.html").read_text())
        wrong = self.runner("report", "train-1", "--x", "wall", check=2)
        self.assertEqual(wrong.stderr.splitlines()[0], "runner report: --x: expected step, time or relative, got 'wall'")
        self.assertFalse((self.dir / "report.html").exists())

    def test_rm_counts_in_the_singular(self):
        self.script("one.lua", """
            local run = runner.start()
            local train = runner.trainer { model = nn.Linear(2, 1), optimizer = { "sgd", lr = 0.1 }, progress = false }
            run:restore { trainer = train }
            run:checkpoint()  -- logs one value, time/checkpoint_stall_ms
        """)
        self.runner("one.lua", check=0)
        result = self.runner("rm", "one-1", check=0)
        self.assertRegex(result.stdout, r"^removed one-1 \([0-9a-z]{8}\): 1 metric value, 1 checkpoint, 0 artifacts, ")

    def test_rm_deletes_rows_and_files_and_refuses_running_runs(self):
        self.three_runs()
        result = self.runner("rm", "train-1", check=0)
        self.assertRegex(result.stdout, r"^removed train-1 \([0-9a-z]{8}\): 90 metric values, 0 checkpoints, "
                                        r"3 artifacts, [0-9.]+ kB\n$")
        self.assertFalse((self.home / "train-1").exists())
        self.assertEqual(self.sql("SELECT name FROM runs ORDER BY name"), [("broken-1",), ("train-2",)])
        self.assertEqual(self.sql("SELECT count(*) FROM metrics"), [(90,)])
        self.assertEqual(self.sql("SELECT count(*) FROM artifacts"), [(3,)])
        self.assertEqual(self.sql("SELECT count(*) FROM metric_latest"), [(3,)])
        self.assertFalse(any((self.home / ".trash").iterdir()))
        # A typo among the references deletes nothing.
        result = self.runner("rm", "train-2", "nosuch", check=1)
        self.assertTrue((self.home / "train-2").is_dir())
        self.script("waiting.lua", """
            runner.start()
            while not io.open("release") do os.execute("sleep 0.05") end
        """)
        waiting = subprocess.Popen([RUNNER, "waiting.lua"], cwd=self.dir, env=self.env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                if self.sql("SELECT count(*) FROM runs WHERE name = 'waiting-1'") == [(1,)]:
                    break
                time.sleep(0.05)
            result = self.runner("rm", "waiting-1", check=1)
            self.assertRegex(result.stderr, r"^runner rm: run waiting-1 \([0-9a-z]{8}\) is still running \(pid \d+ on "
                                            r".+\); stop it first or use --force\n$")
        finally:
            (self.dir / "release").write_text("")
            waiting.wait(timeout=60)
        self.runner("rm", "waiting-1", check=0)

    def test_gc_finishes_interrupted_deletions_and_reports_orphans(self):
        self.three_runs()
        run_id = self.sql("SELECT id FROM runs WHERE name = 'train-1'")[0][0]
        (self.home / ".trash").mkdir()
        (self.home / "train-1").rename(self.home / ".trash" / f"{run_id}-train-1")
        orphan = self.home / "lost-run"
        orphan.mkdir()
        (orphan / "config.json").write_text("{}")
        (orphan / "script.lua").write_text("")
        before = file_digest(self.home / "index.db")
        dry = self.runner("gc", "--dry-run", check=0).stdout
        self.assertIn(f"would finish deleting {self.home}/.trash/{run_id}-train-1\n", dry)
        self.assertIn("lost-run looks like a run directory but is not in the index", dry)
        self.assertEqual(file_digest(self.home / "index.db"), before)
        self.assertTrue((self.home / ".trash" / f"{run_id}-train-1").exists())
        self.runner("gc", check=0)
        self.assertEqual(self.sql("SELECT count(*) FROM runs WHERE name = 'train-1'"), [(0,)])
        self.assertFalse((self.home / ".trash" / f"{run_id}-train-1").exists())
        self.assertTrue(orphan.exists())
        self.runner("gc", "--orphans", check=0)
        self.assertFalse(orphan.exists())
        self.assertEqual(self.sql("SELECT name FROM runs ORDER BY name"), [("broken-1",), ("train-2",)])


class TagsAndNotes(IndexTest):
    def names(self, *args):
        return [row["name"] for row in json.loads(self.runner("runs", *args, "--json", check=0).stdout)]

    def test_tag_untag_and_note_a_run_and_runs_and_show_list_them(self):
        self.three_runs()
        first_id = self.sql("SELECT id FROM runs WHERE name = 'train-1'")[0][0]
        self.assertEqual(self.runner("tag", "train-1", "baseline", "cifar-10", check=0).stdout,
                         f"train-1 ({first_id}): tags baseline, cifar-10\n")
        self.assertEqual(self.runner("tag", "train-1", "baseline", "v1.2", check=0).stdout,
                         f"train-1 ({first_id}): tags baseline, cifar-10, v1.2\n")
        self.runner("tag", "train-2", "v1.2", check=0)
        self.assertEqual(self.runner("note", "train-1", "lr too low; rerun with 0.02", check=0).stdout,
                         f"train-1 ({first_id}): note set\n")
        self.assertEqual(self.sql("SELECT r.name, t.tag FROM run_tags t JOIN runs r ON r.run = t.run ORDER BY r.name, t.tag"),
                         [("train-1", "baseline"), ("train-1", "cifar-10"), ("train-1", "v1.2"), ("train-2", "v1.2")])
        self.assertEqual(self.sql("SELECT name, note FROM runs ORDER BY name"),
                         [("broken-1", None), ("train-1", "lr too low; rerun with 0.02"), ("train-2", None)])

        table = self.runner("runs", check=0).stdout.splitlines()
        self.assertEqual(table[0].split(), ["id", "name", "status", "started", "duration", "step", "ranks", "tags",
                                            "final_loss", "note"])
        self.assertRegex(table[4], r"^\S+ +train-1 .* 1  baseline cifar-10 v1\.2 +0\.0333333  lr too low; rerun with 0\.02$")
        self.assertRegex(table[3], r" 1  v1\.2 +0\.133333  -$")
        listed = json.loads(self.runner("runs", "--json", check=0).stdout)
        self.assertEqual([(r["name"], r["tags"], r["note"]) for r in listed],
                         [("broken-1", None, None), ("train-2", "v1.2", None),
                          ("train-1", "baseline cifar-10 v1.2", "lr too low; rerun with 0.02")])
        self.assertIn("tags      baseline, cifar-10, v1.2\nnote      lr too low; rerun with 0.02\n",
                      self.runner("show", "train-1", check=0).stdout)
        shown = json.loads(self.runner("show", "train-1", "--json", check=0).stdout)
        self.assertEqual((shown["tags"], shown["note"]), (["baseline", "cifar-10", "v1.2"], "lr too low; rerun with 0.02"))

        self.assertEqual(self.runner("tag", "train-1", "-d", "cifar-10", "v1.2", check=0).stdout,
                         f"train-1 ({first_id}): tags baseline\n")
        self.assertEqual(self.runner("tag", "train-2", "--remove", "v1.2", check=0).stdout.split(": ")[1], "no tags\n")
        self.assertEqual(self.runner("note", "train-1", "", check=0).stdout, f"train-1 ({first_id}): note removed\n")
        self.assertEqual(self.sql("SELECT r.name, t.tag, r.note FROM run_tags t JOIN runs r ON r.run = t.run"),
                         [("train-1", "baseline", None)])
        table = self.runner("runs", check=0).stdout.splitlines()
        self.assertEqual(table[0].split(), ["id", "name", "status", "started", "duration", "step", "ranks", "tags",
                                            "final_loss"])
        self.runner("rm", "train-1", check=0)
        self.assertEqual(self.sql("SELECT count(*) FROM run_tags"), [(0,)])

    def test_bad_tags_and_references_are_errors_that_change_nothing(self):
        self.three_runs()
        self.runner("tag", "train-1", "baseline", check=0)
        result = self.runner("tag", "train-1", "good", "not good", check=2)
        self.assertEqual(result.stderr, "runner tag: tag name 'not good' is not allowed: use letters, digits, '_', '-' "
                                        "and '.'\nsee 'runner tag --help'\n")
        result = self.runner("tag", "train-1", "-d", "baseline", "cifar", check=1)
        self.assertEqual(result.stderr, "runner tag: run train-1 has no tag 'cifar' (its tags: baseline)\n")
        result = self.runner("tag", "train-9", "x", check=1)
        self.assertTrue(result.stderr.startswith("runner tag: no run matches 'train-9'"), result.stderr)
        self.assertTrue(self.runner("tag", "train-1", check=2).stderr.startswith(
            "runner tag: expected a RUN and one or more TAGs\n"))
        self.assertTrue(self.runner("note", "train-1", check=2).stderr.startswith(
            "runner note: expected a RUN and the note's TEXT in quotes (\"\" removes the note)\n"))
        self.assertEqual(self.sql("SELECT tag FROM run_tags"), [("baseline",)])
        self.assertEqual(self.sql("SELECT count(*) FROM runs WHERE note IS NOT NULL"), [(0,)])

    def test_where_filters_by_config_metrics_tags_status_and_name(self):
        self.three_runs()
        self.runner("tag", "train-1", "baseline", check=0)
        self.runner("tag", "broken-1", "baseline", check=0)
        self.assertEqual(self.names("--where", "lr < 0.02 and tag = 'baseline'"), ["train-1"])
        self.assertEqual(self.names("--where", "tag = 'baseline'"), ["broken-1", "train-1"])
        self.assertEqual(self.names("--where", "not tag = 'baseline'"), ["train-2"])
        self.assertEqual(self.names("--where", "tag != 'baseline' or status = 'failed'"), ["broken-1", "train-2"])
        self.assertEqual(self.names("--where", "label = 'b'"), ["train-2"])
        self.assertEqual(self.names("--where", "final_loss > 0.1"), ["train-2"])  # the summary's value
        self.assertEqual(self.names("--where", "extra3 >= 90 and (loss < 0.05 or name = 'train-2')"),
                         ["train-2", "train-1"])  # latest logged values
        self.assertEqual(self.names("--where", "lr >= 0.01", "--status", "finished", "--sort", "lr", "--desc"),
                         ["train-2", "train-1"])
        self.assertEqual(self.runner("runs", "--where", "lr > 1", check=0).stdout, "no runs match\n")

        unknown = self.runner("runs", "--where", "lrr < 1e-3 and tag = 'baseline'", check=2)
        self.assertEqual(unknown.stderr,
                         "runner runs: --where 'lrr < 1e-3 and tag = 'baseline'': unknown key 'lrr' at column 1 (not a "
                         "config key or metric of any run, nor tag, status or name); did you mean 'lr'?\n"
                         "see 'runner runs --help'\n")
        self.assertEqual(unknown.stdout, "")
        syntax = self.runner("runs", "--where", "lr < 1e-3 and tag == 'x'", check=2)
        self.assertEqual(syntax.stderr.splitlines()[0],
                         "runner runs: --where 'lr < 1e-3 and tag == 'x'': expected a number or a quoted text after "
                         "'tag =', found = at column 20")
        tag_order = self.runner("runs", "--where", "tag > 'a'", check=2)
        self.assertEqual(tag_order.stderr.splitlines()[0],
                         "runner runs: --where 'tag > 'a'': tag is compared with = or != (a run has the tag or not), "
                         "not > at column 5")

    def test_a_script_tags_its_run_and_sets_its_note(self):
        self.script("tagged.lua", """
local run = runner.start()
run:tag("baseline", "small")
run:tag("baseline")
run:note("first try")
run:log { loss = 1 }
""")
        self.runner("tagged.lua", check=0)
        self.assertEqual(self.names("--where", "tag = 'small' and loss = 1"), ["tagged-1"])
        shown = json.loads(self.runner("show", "tagged-1", "--json", check=0).stdout)
        self.assertEqual((shown["tags"], shown["note"]), (["baseline", "small"], "first try"))
        self.script("bad_tag.lua", "local run = runner.start()\nrun:log { loss = 1 }\nrun:tag('a b')\n")
        result = self.runner("bad_tag.lua", check=1)
        self.assertIn("bad_tag.lua:3: tag name 'a b' is not allowed: use letters, digits, '_', '-' and '.'",
                      result.stderr)


class BadIndexFiles(IndexTest):
    def assert_one_line_error(self, args, status, message):
        result = self.runner(*args)
        self.assertEqual(result.returncode, status, result.stderr)
        self.assertEqual(result.stderr.count("\n"), 1, result.stderr)
        self.assertIn(message, result.stderr)
        return result

    def test_missing_index(self):
        self.assert_one_line_error(["runs"], 1, f"{self.home}/index.db: no runner index here")
        self.assertFalse(self.home.exists())

    def test_write_statements_and_malformed_sql_change_nothing(self):
        self.train()
        before = file_digest(self.home / "index.db")
        self.assert_one_line_error(["query", "DELETE FROM metrics"], 1,
                                   "runner query: the index is read-only here: this statement would modify it (DELETE)")
        self.assert_one_line_error(["query", "UPDATE runs SET name = 'x'"], 1, "would modify it (UPDATE)")
        self.assert_one_line_error(["query", "PRAGMA writable_schema = ON"], 1, "would modify it (PRAGMA)")
        self.assert_one_line_error(["query", f"ATTACH '{self.home / 'index.db'}' AS other"], 1, "would modify it (ATTACH)")
        self.assert_one_line_error(["query", "BEGIN"], 1, "would modify it (BEGIN)")
        self.assertEqual(self.runner("query", "PRAGMA table_info(runs)", "--csv", check=0).stdout.splitlines()[0],
                         "cid,name,type,notnull,dflt_value,pk")
        self.assert_one_line_error(["query", "SELEC 1"], 1, 'runner query: SQL error: near "SELEC": syntax error')
        self.assert_one_line_error(["query", "SELECT 1; DELETE FROM runs"], 1, "give one statement at a time")
        self.assert_one_line_error(["query", "SELECT nosuch FROM runs"], 1, "runner query: SQL error: no such column: nosuch")
        self.assertEqual(file_digest(self.home / "index.db"), before)
        self.assertEqual(self.sql("SELECT count(*) FROM metrics"), [(90,)])

    def test_a_corrupt_index_is_reported_and_left_alone(self):
        self.home.mkdir()
        (self.home / "index.db").write_bytes(os.urandom(8192))
        before = file_digest(self.home / "index.db")
        for args in (["runs"], ["query", "SELECT 1 FROM runs"], ["show", "last"], ["gc"]):
            self.assert_one_line_error(args, 1, f"{self.home}/index.db: ")
        self.script("start.lua", "runner.start()")
        result = self.runner("start.lua", check=1)
        self.assertIn(f"{self.home}/index.db: ", result.stderr)
        self.assertIn("not an SQLite database", result.stderr)
        self.assertEqual(file_digest(self.home / "index.db"), before)

    def test_a_damaged_last_page_is_reported_by_every_command_and_nothing_is_written(self):
        self.script("many.lua", "local run = runner.start()\n"
                    "for step = 1, 3000 do run:log({ loss = step * 0.5, lr = 1 / step }, step) end\n"
                    "run:finish()\n")
        self.runner("many.lua", check=0)
        self.sql("PRAGMA wal_checkpoint(TRUNCATE)")
        path = self.home / "index.db"
        data = bytearray(path.read_bytes())
        page_size = int.from_bytes(data[16:18], "big")
        # The last page that holds a b-tree (table or index, leaf or interior); its header is overwritten.
        last = next(p for p in range(len(data) // page_size - 1, 0, -1) if data[p * page_size] in (2, 5, 10, 13))
        data[last * page_size:last * page_size + 64] = b"\xa5" * 64
        path.write_bytes(bytes(data))
        before = file_digest(path)
        for args in (["runs"], ["query", "SELECT count(*) FROM runs"], ["show", "last"], ["gc"]):
            self.assert_one_line_error(args, 1, f"{path}: the index is damaged (")
        self.script("start.lua", "runner.start()")
        result = self.runner("start.lua", check=1)
        self.assertIn(f"{path}: the index is damaged (", result.stderr)
        self.assertIn(f"Recover with sqlite3 {path} .recover", result.stderr)
        self.assertEqual(file_digest(path), before)
        self.assertEqual(sorted(p.name for p in self.home.iterdir() if p.is_dir()), ["many-1"])

    def test_an_index_from_a_newer_runner_is_refused(self):
        self.train()
        self.set_sql("PRAGMA user_version = 99")
        before = file_digest(self.home / "index.db")
        message = "index has schema version 99, newer than this runner supports (15); use a newer runner"
        for args in (["runs"], ["query", "SELECT 1"], ["show", "last"], ["rm", "last"], ["gc"]):
            self.assert_one_line_error(args, 1, message)
        self.script("start.lua", "runner.start()")
        result = self.runner("start.lua", check=1)
        self.assertIn(message, result.stderr)
        self.assertEqual(file_digest(self.home / "index.db"), before)
        self.assertEqual(sorted(p.name for p in self.home.iterdir()), ["index.db", "train-1"])

    def test_a_foreign_sqlite_file_is_not_taken_for_an_index(self):
        self.home.mkdir()
        with sqlite3.connect(self.home / "index.db") as db:
            db.execute("CREATE TABLE notes (text TEXT)")
        before = file_digest(self.home / "index.db")
        self.assert_one_line_error(["runs"], 1, "not a runner index (an SQLite database without the runner schema)")
        self.script("start.lua", "runner.start()")
        self.assertIn("not a runner index", self.runner("start.lua", check=1).stderr)
        self.assertEqual(file_digest(self.home / "index.db"), before)


    def test_a_foreign_database_with_a_schema_version_is_not_taken_for_an_index(self):
        self.home.mkdir()
        with sqlite3.connect(self.home / "index.db") as db:
            db.execute("CREATE TABLE runs (text TEXT)")
            db.execute("PRAGMA user_version = 1")
        before = file_digest(self.home / "index.db")
        self.assert_one_line_error(["runs"], 1, "not a runner index (an SQLite database without the runner schema)")
        self.script("start.lua", "runner.start()")
        self.assertIn("not a runner index", self.runner("start.lua", check=1).stderr)
        self.assertEqual(file_digest(self.home / "index.db"), before)

    def test_an_index_of_schema_1_is_migrated_on_first_use(self):
        self.train()
        wall = json.loads(self.runner("show", "last", "--json", check=0).stdout)["wall_seconds"]
        db = sqlite3.connect(self.home / "index.db")
        db.execute("DROP TRIGGER attempt_ends_with_its_run")
        db.execute("DROP TABLE attempts")
        for column in ("attempts", "attempt_started_at", "active_seconds", "hosts"):
            db.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        db.execute("DROP INDEX runs_by_trial")
        db.execute("DROP INDEX trials_by_run")
        db.execute("DROP TABLE run_name_numbers")
        db.execute("DROP TABLE inputs")
        db.execute("DROP TABLE trial_rungs")
        db.execute("DROP TABLE sweep_workers")
        db.execute("DROP TABLE run_tags")
        db.execute("ALTER TABLE runs DROP COLUMN note")
        db.execute("DROP INDEX runs_by_start_key")
        db.execute("ALTER TABLE runs DROP COLUMN start_key")
        db.execute("DROP TABLE interventions")
        db.execute("DROP TABLE histograms")
        for column in ("ended_at", "error"):
            db.execute(f"ALTER TABLE sweeps DROP COLUMN {column}")
        for column in ("step", "worker", "heartbeat_at", "error", "segments", "created_at", "ended_at", "retries",
                       "generation", "claim", "out_of_space"):
            db.execute(f"ALTER TABLE trials DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 1")
        db.commit()
        db.close()
        shown = json.loads(self.runner("show", "last", "--json", check=0).stdout)
        self.assertEqual(self.sql("PRAGMA user_version"), [(15,)])
        self.assertEqual(shown["attempts"], 1)
        self.assertEqual([(a["attempt"], a["status"], a["start_step"], a["end_step"], a["config"])
                          for a in shown["attempt_history"]], [(1, "finished", 0, 30, shown["config"])])
        self.assertEqual(shown["hosts"], [socket.gethostname()])
        self.assertAlmostEqual(shown["duration"], wall, places=6)  # a finished run's whole span
        self.assertAlmostEqual(shown["wall_seconds"], wall, places=6)

    def test_an_index_of_schema_7_gets_paused_and_pruned_runs_and_rungs_from_1(self):
        first = self.train()
        second = self.train("steps=20")
        db = sqlite3.connect(self.home / "index.db")
        # Schema 7: ASHA's paused and pruned trials' runs were `interrupted`, rungs counted from 0.
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET sql = replace(sql, ', ''paused'', ''pruned'')', ')') WHERE name = 'runs'")
        db.execute("PRAGMA writable_schema = OFF")
        db.commit()
        db.close()
        db = sqlite3.connect(self.home / "index.db")
        self.assertIn("'failed', 'interrupted'))", db.execute("SELECT sql FROM sqlite_master WHERE name = 'runs'").fetchone()[0])
        db.execute("DROP INDEX trials_by_run")
        db.execute("DROP TABLE run_name_numbers")
        db.execute("DROP TABLE inputs")
        for column in ("host", "pid", "slurm_job"):  # schema 9's
            db.execute(f"ALTER TABLE sweep_workers DROP COLUMN {column}")
        db.execute("DROP TABLE run_tags")  # schema 10's
        db.execute("ALTER TABLE runs DROP COLUMN note")
        for column in ("generation", "claim", "out_of_space"):  # schema 11's, 12's and 15's
            db.execute(f"ALTER TABLE trials DROP COLUMN {column}")
        db.execute("DROP INDEX runs_by_start_key")
        db.execute("ALTER TABLE runs DROP COLUMN start_key")
        db.execute("DROP TABLE interventions")  # schema 13's
        db.execute("DROP TABLE histograms")  # schema 14's
        db.execute("INSERT INTO sweeps (sweep, name, script, spec, status, created_at) VALUES (1, 's', 'x.lua', '{}', "
                   "'running', 0)")
        for trial, name, status, rung in ((1, first["name"], "paused", 1), (2, second["name"], "pruned", 2)):
            run = db.execute("SELECT run FROM runs WHERE name = ?", (name,)).fetchone()[0]
            db.execute("UPDATE runs SET status = 'interrupted', sweep = 1, trial = ? WHERE run = ?", (trial, run))
            db.execute("INSERT INTO trials (sweep, trial, params, run, status, rung) VALUES (1, ?, '{}', ?, ?, ?)",
                       (trial, run, status, rung))
            for r in range(rung):
                db.execute("INSERT INTO trial_rungs VALUES (1, ?, ?, ?, ?)", (trial, r, 10 * (r + 1), 0.5))
        db.execute("PRAGMA user_version = 7")
        db.commit()
        db.close()
        self.runner("runs", check=0)
        self.assertEqual(self.sql("PRAGMA user_version"), [(15,)])
        self.assertEqual(self.sql("SELECT r.status, t.status FROM runs r JOIN trials t ON t.run = r.run ORDER BY t.trial"),
                         [("paused", "paused"), ("pruned", "pruned")])
        self.assertEqual(self.sql("SELECT trial, rung, step FROM trial_rungs ORDER BY trial, rung"),
                         [(1, 1, 10), (2, 1, 10), (2, 2, 20)])
        self.assertEqual(self.sql("PRAGMA integrity_check"), [("ok",)])
        self.assertIn("'paused', 'pruned'", self.sql("SELECT sql FROM sqlite_master WHERE name = 'runs'")[0][0])
        with self.assertRaises(sqlite3.IntegrityError):
            self.set_sql("UPDATE runs SET status = 'resting'")
        shown = self.runner("runs", "--status", "paused", check=0).stdout
        self.assertIn(first["name"], shown)
        self.assertNotIn(second["name"], shown)

    def test_an_index_carries_the_runner_application_id(self):
        self.train()
        self.assertEqual(self.sql("PRAGMA application_id"), [(0x726E6E72,)])
        # An index made before the id existed is recognised by its schema and gets the id.
        self.set_sql("PRAGMA application_id = 0")
        self.train()
        self.assertEqual(self.sql("PRAGMA application_id"), [(0x726E6E72,)])

    def test_query_has_a_time_limit_and_the_table_a_row_limit(self):
        self.train()
        endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
        self.assert_one_line_error(["query", endless, "--timeout", "1"], 1,
                                   "runner query: the query ran longer than 1 s and was stopped (--timeout SECONDS "
                                   "allows more)")
        many = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1500) SELECT i FROM n"
        table = self.runner("query", many, check=0)
        self.assertEqual(len(table.stdout.splitlines()), 2 + 1000)
        self.assertEqual(table.stderr, "runner query: showing the first 1000 rows (--limit N shows more, --limit 0 all)\n")
        self.assertEqual(len(self.runner("query", many, "--limit", "0", check=0).stdout.splitlines()), 2 + 1500)
        self.assertEqual(len(self.runner("query", many, "--csv", check=0).stdout.splitlines()), 1 + 1500)

    def test_show_json_is_json_when_a_stored_config_is_not(self):
        self.train()
        self.set_sql("UPDATE runs SET config = 'lr=0.1 (edited by hand'")
        shown = json.loads(self.runner("show", "last", "--json", check=0).stdout)
        self.assertEqual(shown["config"], "lr=0.1 (edited by hand")
        self.assertIn("(not JSON)  lr=0.1 (edited by hand", self.runner("show", "last", check=0).stdout)

    def test_a_pytorch_file_loads_and_a_misfit_names_the_script_line(self):
        import torch
        torch.save({"w": torch.zeros(2)}, self.dir / "model.pt")
        self.script("load.lua", "nn.Linear(2, 2):load('model.pt')")
        result = self.runner("load.lua", check=1)
        self.assertIn("load.lua:1: load_state_dict: missing keys: weight, bias; unexpected keys: w", result.stderr)

class SilentServer:
    """A TCP server on a local port that accepts every connection and never answers (a PostgreSQL server that hangs,
    or a wrong port where something else listens)."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.port = self.socket.getsockname()[1]
        self.accepted = []
        self.thread = threading.Thread(target=self.accept, daemon=True)
        self.thread.start()

    def accept(self):
        try:
            while True:
                self.accepted.append(self.socket.accept()[0])
        except OSError:  # closed
            pass

    def close(self):
        self.socket.shutdown(socket.SHUT_RDWR)
        self.socket.close()
        for connection in self.accepted:
            connection.close()


WAITING_LINE = re.compile(r"^\[[0-9:.]+\] \[warning\] (.*)$")


class UnansweringIndexServer(RunnerHomeTest):
    """An index server that does not answer ends commands and runs with a message naming it, never a hang."""

    def url(self, port):
        return f"postgresql://runner@127.0.0.1:{port}/runs"

    def waiting_lines(self, stderr):
        return [m.group(1) for m in map(WAITING_LINE.match, stderr.splitlines()) if m]

    def test_a_server_that_accepts_and_never_answers_ends_runs_and_query_after_the_connect_timeout(self):
        server = SilentServer()
        self.addCleanup(server.close)
        self.env.update(RUNNER_INDEX=self.url(server.port), RUNNER_INDEX_CONNECT_TIMEOUT="2")
        for command in (["runs"], ["query", "SELECT 1"]):
            result = self.runner(*command, timeout=120)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertEqual(result.stderr,
                             f"runner {command[0]}: {self.url(server.port)}: cannot connect to the index server at "
                             f"127.0.0.1:{server.port}: timeout expired (no answer within 2 s: "
                             "RUNNER_INDEX_CONNECT_TIMEOUT, or connect_timeout in the URL)\n")
        # The URL's own connect_timeout wins over the variable.
        self.env["RUNNER_INDEX"] = self.url(server.port) + "?connect_timeout=3"
        self.assertIn("(no answer within 3 s: ", self.runner("runs", check=1, timeout=120).stderr)
        # A run start (a writer) waits for the server for RUNNER_INDEX_WAIT, then fails without a run.
        self.env.update(RUNNER_INDEX=self.url(server.port), RUNNER_INDEX_WAIT="5")
        self.script("train.lua", TRAINING_SCRIPT)
        result = self.runner("train.lua", timeout=120)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(self.waiting_lines(result.stderr)[0],
                         rf"^{re.escape(self.url(server.port))}: the index server does not answer at "
                         rf"127\.0\.0\.1:{server.port} \(timeout expired\); waiting for it until \d\d:\d\d:\d\d "
                         r"\(5s, RUNNER_INDEX_WAIT\)$")
        self.assertIn(f"train.lua:2: {self.url(server.port)}: the index server at 127.0.0.1:{server.port} did not "
                      "answer in ", result.stderr)
        self.assertFalse((self.home / "train-1").exists())

    def test_a_writer_pointed_at_a_closed_port_says_what_it_waits_for_then_gives_up(self):
        closed = socket.socket()  # bound but not listening: connections to its port are refused
        closed.bind(("127.0.0.1", 0))
        self.addCleanup(closed.close)
        port = closed.getsockname()[1]
        self.env.update(RUNNER_INDEX=self.url(port), RUNNER_INDEX_WAIT="12")
        self.script("train.lua", TRAINING_SCRIPT)
        result = self.runner("train.lua", timeout=120)
        self.assertEqual(result.returncode, 1, result.stderr)
        lines = self.waiting_lines(result.stderr)
        self.assertRegex(lines[0], rf"^{re.escape(self.url(port))}: the index server does not answer at "
                                   rf"127\.0\.0\.1:{port} \(Connection refused\); waiting for it until "
                                   r"(\d\d:\d\d:\d\d) \(12s, RUNNER_INDEX_WAIT\)$")
        until = re.search(r"until (\S+)", lines[0]).group(1)
        # Every 5 s of waiting, a line says so; how many fit in 12 s depends on how fast each attempt fails.
        self.assertGreaterEqual(len(lines), 2, result.stderr)
        for line in lines[1:]:
            self.assertRegex(line, rf"^{re.escape(self.url(port))}: still waiting for the index server at "
                                   rf"127\.0\.0\.1:{port} \(Connection refused\), \d+s so far, until {until}$")
        self.assertRegex(result.stderr, rf"train\.lua:2: {re.escape(self.url(port))}: the index server at "
                                        rf"127\.0\.0\.1:{port} did not answer in \d+s \(RUNNER_INDEX_WAIT\): "
                                        r"Connection refused\n")
        self.assertFalse((self.home / "train-1").exists())

    def test_a_timeout_that_is_not_a_number_of_seconds_is_named(self):
        self.env.update(RUNNER_INDEX=self.url(5432), RUNNER_INDEX_CONNECT_TIMEOUT="ten")
        self.assertEqual(self.runner("runs", check=1).stderr,
                         "runner runs: RUNNER_INDEX_CONNECT_TIMEOUT='ten' is not a number of seconds > 0\n")


# The same tests on a PostgreSQL index (RUNNER_INDEX), on a server of the tests' own with a fresh database per test,
# but for those about the SQLite file itself (its pragmas, a damaged or foreign file, a read-only medium). Without
# PostgreSQL's server programs each of them is skipped, saying why.
SQLITE_FILE_TESTS = {
    "test_sigkill_leaves_a_consistent_index_with_every_flushed_metric",  # PRAGMA integrity_check
    "test_gc_finishes_interrupted_deletions_and_reports_orphans",  # the file unchanged by a dry run
}


def on_postgresql(case):
    """The test class `case` on a PostgreSQL index, named Postgres<case>."""
    variant = type("Postgres" + case.__name__, (case,),
                   {"postgresql": True, "__doc__": f"{case.__name__} on a PostgreSQL index."})
    for test in SQLITE_FILE_TESTS:
        if hasattr(variant, test):
            setattr(variant, test, unittest.skip("about the SQLite file")(getattr(case, test)))
    return unittest.skipIf(postgres_server.missing(), f"no PostgreSQL server: {postgres_server.missing()}")(variant)


PostgresRunsRecordedByScripts = on_postgresql(RunsRecordedByScripts)
PostgresInterruptions = on_postgresql(Interruptions)
PostgresAttempts = on_postgresql(Attempts)
PostgresConcurrentWriters = on_postgresql(ConcurrentWriters)
PostgresControlCharactersInData = on_postgresql(ControlCharactersInData)
PostgresBytesThatAreNotUTF8 = on_postgresql(BytesThatAreNotUTF8)
PostgresIndexCommands = on_postgresql(IndexCommands)
PostgresTagsAndNotes = on_postgresql(TagsAndNotes)


if __name__ == "__main__":
    unittest.main()
