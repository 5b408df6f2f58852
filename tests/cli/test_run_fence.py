"""A plain run fenced by its attempt (issue 60, item 6): a run whose process pauses past the staleness limit shows as
interrupted, `runner --resume` on another host (a UTS namespace named beta, where unshare --uts may be used) continues
it, and when the paused process wakes it stops at its first write with exit status 76 and the reason, having written
nothing into the index or the run folder but that line of its log. On the SQLite index and on a PostgreSQL one."""
import hashlib
import json
import os
import pathlib
import signal
import socket
import sqlite3
import subprocess
import time
import unittest

from runner_process import RUNNER
from test_index import IndexTest, on_postgresql

# Logs which process wrote each step (`writer`, from TEST_WRITER), checkpoints every 5 steps (waiting for the save)
# and, with TEST_HOLD set, waits after step 7 (logged and flushed) until RUNNER_HOME/release exists; after the loop
# it writes a summary, an image, a tag and a note, then ends: every kind of write a woken process would try.
SCRIPT = """
local cfg = config { steps = 12 }
local run = runner.start(cfg)
local model = nn.Linear(2, 1)
local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.001 }, progress = false }
run:restore { trainer = train }
local writer = tonumber(os.getenv("TEST_WRITER"))
for step = run.step + 1, cfg.steps do
  train:step(function() return model(torch.ones(2, 2)):pow(2):mean() end)
  run:log { writer = writer }
  if step % 5 == 0 then run:checkpoint { wait = true } end
  if step == 7 and os.getenv("TEST_HOLD") then
    run:flush()
    while not io.open(os.getenv("RUNNER_HOME") .. "/release") do os.execute("sleep 0.05") end
  end
end
run:set_summary { writer = writer }
run:images("samples", torch.zeros(1, 1, 4, 4))
run:tag("writer" .. writer)
run:note("ended by writer " .. writer)
"""

TABLES = {  # what a run's process writes, each in an order that does not depend on who wrote it
    "runs": "run", "attempts": "run, attempt", "metrics": "run, key, step", "metric_latest": "run, key",
    "checkpoints": "checkpoint", "checkpoint_files": "checkpoint, name", "artifacts": "artifact",
    "histograms": "run, key, step", "run_tags": "run, tag", "inputs": "run, attempt, kind, path",
}


def can_name_hosts():
    """unshare --uts needs root (or a user namespace); without it the resuming process runs as this host."""
    return subprocess.run(["unshare", "--uts", "hostname", "probe"], capture_output=True).returncode == 0


class PlainRunFence(IndexTest):
    def setUp(self):
        super().setUp()
        self.script("fence.lua", SCRIPT)
        self.processes = []

    def tearDown(self):
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
        super().tearDown()

    def start(self, *args, host, env, output):
        """`runner ARGS` in self.dir, as host `host` when the test can name hosts."""
        command = [RUNNER, *args]
        if host != socket.gethostname():
            command = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"', *command]
        process = subprocess.Popen(command, cwd=self.dir, env={**self.env, **env}, stdout=output,
                                   stderr=subprocess.STDOUT, text=True)
        self.processes.append(process)
        return process

    def wait_for(self, query, expected, what, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.sql(query) == expected:
                    return
            except (sqlite3.OperationalError, subprocess.CalledProcessError):
                pass  # the index not made yet
            time.sleep(0.1)
        self.fail(f"timed out waiting for {what}")

    def inside_a_write(self):
        """Whether a process holds a write transaction of the index open."""
        if self.postgresql:
            busy = self.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND state <> 'idle'")
            return busy != [(0,)]
        db = sqlite3.connect(self.home / "index.db", timeout=0)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.rollback()
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            db.close()

    def stop_between_writes(self, process):
        """SIGSTOP, where the process holds no write transaction (stopped inside one, it would hold every other
        writer of a SQLite index up): stopped again a moment later when it does."""
        for _ in range(100):
            os.kill(process.pid, signal.SIGSTOP)
            while pathlib.Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                time.sleep(0.01)
            if not self.inside_a_write():
                return
            os.kill(process.pid, signal.SIGCONT)
            time.sleep(0.05)
        self.fail("the run's process was inside a write transaction each time it was stopped")

    def snapshot(self, run_dir):
        """The rows of every table a run writes, and each file of the run folder but log.txt with its sha256."""
        rows = {table: self.sql(f"SELECT * FROM {table} ORDER BY {order}") for table, order in TABLES.items()}
        files = {}
        for folder, _, names in os.walk(run_dir):
            for name in names:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, run_dir)
                if relative != "log.txt":
                    files[relative] = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
        return rows, files

    def status(self, run):
        return json.loads(self.runner("show", run, "--json", check=0).stdout)["status"]

    def test_a_paused_run_resumed_elsewhere_stops_at_its_first_write_when_it_wakes(self):
        here = socket.gethostname()
        beta = "beta" if can_name_hosts() else here
        paused_output = open(self.dir / "paused.out", "w+")
        self.addCleanup(paused_output.close)
        paused = self.start("fence.lua", host=here, env={"TEST_WRITER": "1", "TEST_HOLD": "1"}, output=paused_output)
        self.wait_for("SELECT count(*) FROM metrics WHERE key = 'writer' AND step = 7", [(1,)], "step 7 logged")
        self.wait_for("SELECT step FROM checkpoints", [(5,)], "the checkpoint of step 5")
        self.stop_between_writes(paused)
        self.assertEqual(self.status("fence-1"), "running")
        # Paused past the staleness limit (60 s without a heartbeat): its heartbeat is moved back as the time would.
        self.set_sql("UPDATE runs SET heartbeat_at = heartbeat_at - 120")
        self.assertEqual(self.status("fence-1"), "interrupted")

        (self.home / "release").touch()  # for the paused process once it wakes; the resumed one does not hold
        resumed = self.start("--resume", "fence-1", "fence.lua", host=beta, env={"TEST_WRITER": "2"},
                             output=subprocess.PIPE)
        out, _ = resumed.communicate(timeout=180)
        self.assertEqual(resumed.returncode, 0, out)
        run_dir = self.home / "fence-1"
        before = self.snapshot(run_dir)
        log_before = (run_dir / "log.txt").read_text()

        paused.send_signal(signal.SIGCONT)
        self.assertEqual(paused.wait(timeout=120), 76)
        paused_output.seek(0)
        reason = ("run fence-1 was resumed by host " + beta + " (attempt 2, this process has attempt 1); this "
                  "process stops without writing")
        self.assertTrue(paused_output.read().endswith(f"runner: {reason}\n"))
        # Nothing of the woken process reached the index or the run folder: the one line it added to the log says why.
        self.assertEqual(self.snapshot(run_dir), before)
        log_after = (run_dir / "log.txt").read_text()
        self.assertTrue(log_after.startswith(log_before))
        self.assertRegex(log_after[len(log_before):], r"^\[[-0-9 :.]+\] \[error\] " + reason.replace("(", r"\(")
                         .replace(")", r"\)") + "\n$")

        # What the index shows: the run as the resumed process ended it, every step after the checkpoint it continued
        # from written by it.
        files = before[1]
        self.assertEqual(self.sql("SELECT host, status, start_step, end_step FROM attempts ORDER BY attempt"),
                         [(here, "interrupted", 0, 7), (beta, "finished", 5, 12)])
        self.assertEqual(self.sql("SELECT host, status, step, attempts, summary, note FROM runs"),
                         [(beta, "finished", 12, 2, '{"writer":2}', "ended by writer 2")])
        self.assertEqual(self.sql("SELECT step, value FROM metrics WHERE key = 'writer' ORDER BY step"),
                         [(s, 1.0) for s in range(1, 6)] + [(s, 2.0) for s in range(6, 13)])
        self.assertEqual(self.sql("SELECT tag FROM run_tags"), [("writer2",)])
        self.assertEqual(sorted(f for f in files if f.startswith("checkpoints/")),
                         [f"checkpoints/step-{step:07d}/{name}" for step in (5, 10) for name in
                          ("manifest.json", "model.safetensors", "optimizer.safetensors", "trainer.safetensors")])


PostgresPlainRunFence = on_postgresql(PlainRunFence)


if __name__ == "__main__":
    unittest.main()
