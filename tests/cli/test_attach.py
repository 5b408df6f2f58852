"""`runner attach`: a REPL on a pseudo-terminal in a training process that runs, between its steps."""
import json
import os
import pathlib
import pty
import re
import signal
import socket
import stat
import subprocess
import time
import unittest

from runner_process import RUNNER, RunnerHomeTest
from test_repl import Terminal

# A small CPU run that takes its time while the file `hold` exists (the test attaches meanwhile), then runs its
# remaining steps at full speed. train:step answers the attached session after each step; a session slower than the
# held steps finds the run waiting at step hold_at until the file goes, answering it there as train:step would.
TRAINING_SCRIPT = """
local ffi = require("ffi")
ffi.cdef "int usleep(unsigned int usec);"
local cfg = config { steps = 300, lr = 0.01, hold_at = 200 }
local run = runner.start(cfg, { name = "live" })
local model = nn.Sequential(nn.Linear(4, 16), nn.SiLU(), nn.Linear(16, 1))
local train = runner.trainer { model = model, optimizer = { "sgd", lr = cfg.lr }, steps = cfg.steps, progress = false }
run:restore { trainer = train }
local x, y = torch.randn(64, 4), torch.randn(64, 1)
local sample_every = 100
local function held()
  local file = io.open("hold")
  if file then file:close() end
  return file ~= nil
end
for step in run:steps(cfg.steps) do
  local out = train:step(function() return nn.functional.mse_loss(model(x), y) end)
  run:log { loss = out.loss, lr = out.lr }
  if held() then ffi.C.usleep(50000) end
  while step == cfg.hold_at and held() do
    ffi.C.usleep(20000)
    run:_serve_attached(train, nil, out)
  end
end
print(string.format("trained to step %d, sample_every %d", run.step, sample_every))
"""


class AttachTerminal(Terminal):
    """`runner ARGS...` on a pseudo-terminal with the environment `env`."""

    def __init__(self, args, cwd, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.chdir(cwd)
                os.execve(RUNNER, [RUNNER, *args], {**env, "RUNNER_HISTORY": os.path.join(cwd, "history")})
            finally:
                os._exit(127)
        self.seen = b""

    def ask(self, line, token, seconds=30):
        """Types `line` and reads until `token` and then the next prompt; returns whether they came, and the text
        from the line on."""
        start = len(self.seen)
        self.type(line.encode() + b"\n")
        deadline = time.time() + seconds
        while time.time() < deadline:
            after = self.seen[start:]
            at = after.find(token.encode())
            if at >= 0 and b"\n> " in after[at:]:
                return True, after.decode(errors="replace")
            if not self.read_until(b"> ", max(0.0, deadline - time.time())):
                break
        return False, self.seen[start:].decode(errors="replace")


class Attach(RunnerHomeTest):
    def start_training(self, *options, script=TRAINING_SCRIPT):
        self.script("train.lua", script)
        (self.dir / "hold").touch()
        log = open(self.dir / "training.log", "w")
        self.addCleanup(log.close)
        process = subprocess.Popen([RUNNER, *options, "train.lua"], cwd=self.dir, env=self.env, stdout=log,
                                   stderr=subprocess.STDOUT)
        self.addCleanup(lambda: process.poll() is None and process.kill())
        socket_path = self.home / "live" / "attach" / "socket"
        deadline = time.time() + 60
        while not socket_path.exists() and process.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        self.assertTrue(socket_path.exists(), (self.dir / "training.log").read_text())
        return process, socket_path

    def attach(self):
        terminal = AttachTerminal(["attach", "live"], str(self.dir), self.env)
        self.addCleanup(terminal.close)
        self.assertTrue(terminal.read_until(b"\n> ", 30), terminal.seen)
        return terminal

    def start_endless_chunk(self, terminal, chunk="while true do end"):
        """Types a chunk that does not return soon; returns once the client says it waits for the answer (its
        Ctrl-C handler is in place then)."""
        start = len(terminal.seen)
        terminal.type(chunk.encode() + b"\n")
        self.assertTrue(terminal.read_until(b"(waiting: the run answers between two steps)", 60),
                        terminal.seen[start:])
        return start

    def finish_training(self, training):
        (self.dir / "hold").unlink()
        self.assertEqual(training.wait(120), 0, (self.dir / "training.log").read_text())
        return self.runner("query", "SELECT status, step, error FROM runs WHERE name = 'live'", "--csv",
                           check=0).stdout.splitlines()[1]

    def metric(self, key, step):
        result = self.runner("query", f"SELECT value FROM metrics JOIN runs r USING (run) WHERE r.name = 'live' "
                             f"AND key = '{key}' AND metrics.step = {step}", "--csv", check=0)
        return float(result.stdout.splitlines()[1])

    def test_read_change_checkpoint_detach_and_the_run_finishes(self):
        training, socket_path = self.start_training()
        # Owner only: the socket 0600 in a folder 0700.
        self.assertEqual(stat.S_IMODE(socket_path.stat().st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(socket_path.parent.stat().st_mode), 0o700)
        self.assertEqual(socket_path.stat().st_uid, os.getuid())

        terminal = self.attach()
        self.assertIn("attached to run live", terminal.seen.decode())
        # A value, a weight norm, a script local and the step's loss.
        found, text = terminal.ask("=run.step > 0, model[1].weight:norm():item() > 0, sample_every, loss:dim()",
                                   "true")
        self.assertTrue(found, text)
        self.assertIn("true\ttrue\t100\t0", text)
        # The learning rate: the step after the chunk uses the new one.
        found, text = terminal.ask("train:set_lr(0.0123); print('set' .. ' at', run.step)", "set at")
        self.assertTrue(found, text)
        set_at = int(text.split("set at")[1].split()[0])
        # An error is shown with its traceback and the training goes on.
        found, text = terminal.ask("local function f() error('boom') end f()", "boom")
        self.assertTrue(found, text)
        self.assertIn("stdin:1: boom", text)
        self.assertIn("stack traceback", text)
        self.assertNotIn("train.lua", text)  # the traceback ends at the chunk: no frames of the script below it
        # A script local assigned from the session changes in the script.
        found, text = terminal.ask("sample_every = 7; print('assign' .. 'ed')", "assigned")
        self.assertTrue(found, text)
        found, text = terminal.ask("=sample_every", "7")
        self.assertTrue(found, text)
        # A checkpoint now: its folder is there when the chunk returns.
        found, text = terminal.ask("run:checkpoint { wait = true }; print('saved' .. ' at', run.step)", "saved at")
        self.assertTrue(found, text)
        saved_at = int(text.split("saved at")[1].split()[0])
        self.assertTrue((self.home / "live" / "checkpoints" / f"step-{saved_at:07d}").is_dir())
        # os.exit is refused, by every path to it: the run goes on.
        for chunk in ("os.exit(3)", "_G.os.exit(7)", "require('os').exit(7)", "package.loaded.os.exit(true)",
                      "local e = os.exit; e(5)"):
            found, text = terminal.ask(chunk, "run:stop() stops the run")
            self.assertTrue(found, chunk + ": " + text)
        # Output past 1 MiB is cut with a note; the run goes on.
        found, text = terminal.ask("io.write(string.rep('x', 3 * 2^20))", "more bytes were not sent", seconds=60)
        self.assertTrue(found, text[-300:])
        self.assertIn("[runner attach: the output was cut at 1 MiB; 2097152 more bytes were not sent]", text)
        found, text = terminal.ask("print('still' .. ' here')", "still here")
        self.assertTrue(found, text)
        terminal.type(b".detach\n")
        self.assertTrue(terminal.read_until(b"detached from run live", 30), terminal.seen)
        self.assertEqual(terminal.wait(10), 0)

        (self.dir / "hold").unlink()
        self.assertEqual(training.wait(120), 0, (self.dir / "training.log").read_text())
        output = (self.dir / "training.log").read_text()
        self.assertIn("trained to step 300, sample_every 7", output)
        self.assertNotIn("boom", output)  # what the session did went to the session only
        self.assertEqual(self.metric("lr", set_at), 0.01)
        self.assertEqual(self.metric("lr", set_at + 1), 0.0123)
        shown = self.runner("query", "SELECT status, step FROM runs WHERE name = 'live'", "--csv", check=0).stdout
        self.assertEqual(shown.splitlines()[1], "finished,300")
        checkpoints = self.runner("query", "SELECT c.step FROM checkpoints c JOIN runs r USING (run) "
                                  "WHERE r.name = 'live'", "--csv", check=0).stdout.splitlines()[1:]
        self.assertIn(str(saved_at), checkpoints)
        # The socket went with the run; attaching to it now says why not.
        self.assertFalse(socket_path.parent.exists())
        late = self.runner("attach", "live", check=1)
        self.assertEqual(late.stderr,
                         "runner attach: run live is finished, not running: runner attach reaches a run while it trains\n")

    def test_chunks_that_change_the_run_are_recorded_with_their_step_and_the_trainer_logs_the_lr(self):
        # The script does not log the learning rate itself: the trainer does.
        script = TRAINING_SCRIPT.replace("run:log { loss = out.loss, lr = out.lr }", "run:log { loss = out.loss }")
        self.assertNotEqual(script, TRAINING_SCRIPT)
        training, _ = self.start_training(script=script)
        terminal = self.attach()
        # Reading, and a chunk's own locals, change nothing: not recorded.
        for chunk, token in (("=run.step > 0, train:lr()", "true"), ("local x = 5; print(x * 2)", "10")):
            found, text = terminal.ask(chunk, token)
            self.assertTrue(found, text)
        found, text = terminal.ask("train:set_lr(0.0123); print('set' .. ' at', run.step)", "set at")
        self.assertTrue(found, text)
        set_at = int(text.split("set at")[1].split()[0])
        # A config value set to what it was is no change; a global, a script local and a config value are.
        found, text = terminal.ask("helper = 1; sample_every = 7; cfg.hold_at = 200; cfg.lr = 0.5; "
                                   "print('assign' .. 'ed at', run.step)", "assigned at")
        self.assertTrue(found, text)
        assigned_at = int(text.split("assigned at")[1].split()[0])
        found, text = terminal.ask("run:stop(); print('stop' .. ' at', run.step)", "stop at")
        self.assertTrue(found, text)
        stop_at = int(text.split("stop at")[1].split()[0])
        # Detached while the run still holds its step: it stops after it, not goes on.
        terminal.type(b".detach\n")
        self.assertTrue(terminal.read_until(b"detached from run live (it stops after its current step, with a "
                                            b"checkpoint)", 60), terminal.seen)
        self.assertEqual(terminal.wait(10), 0)
        (self.dir / "hold").unlink()
        self.assertEqual(training.wait(120), 0, (self.dir / "training.log").read_text())

        rows = self.runner("query", "SELECT i.step, i.chunk, i.changes FROM interventions i JOIN runs r USING (run) "
                           "WHERE r.name = 'live' ORDER BY i.time", "--json", check=0).stdout
        self.assertEqual([(row["step"], row["chunk"], json.loads(row["changes"])) for row in json.loads(rows)], [
            (set_at, "train:set_lr(0.0123); print('set' .. ' at', run.step)", ["train:set_lr(0.0123)"]),
            (assigned_at, "helper = 1; sample_every = 7; cfg.hold_at = 200; cfg.lr = 0.5; print('assign' .. 'ed at', "
                          "run.step)", ["global helper", "local sample_every", "config.lr = 0.5"]),
            (stop_at, "run:stop(); print('stop' .. ' at', run.step)", ["run:stop()"]),
        ])
        # In the run's log, with the step and the chunk.
        log = (self.home / "live" / "log.txt").read_text()
        self.assertIn(f"runner attach after step {set_at} changed train:set_lr(0.0123):\n"
                      f"  train:set_lr(0.0123); print('set' .. ' at', run.step)\n", log)
        self.assertIn(f"runner attach after step {assigned_at} changed global helper, local sample_every, "
                      f"config.lr = 0.5:\n", log)
        # runner show lists them; --json carries them.
        shown = self.runner("show", "live", check=0).stdout
        section = shown[shown.index("\ninterventions (runner attach)\n"):]
        self.assertRegex(section, rf"\n +{set_at}  \S+ \S+ +train:set_lr\(0\.0123\) +train:set_lr\(0\.0123\); print")
        self.assertRegex(section, rf"\n +{stop_at}  \S+ \S+ +run:stop\(\) +run:stop\(\); print")
        # The config as the run started, and the value an intervention set beside it.
        config = shown[shown.index("\nconfig\n"):shown.index("\n\n", shown.index("\nconfig\n") + 1)]
        self.assertRegex(config, r"key +value +now \(runner attach\)\n")
        self.assertRegex(config, rf"\n  lr +0\.01 +0\.5 \(after step {assigned_at}\)\n")
        self.assertRegex(config, r"\n  steps +300  -")
        # --where compares the value now.
        self.assertIn("live", self.runner("runs", "--where", "lr = 0.5", "--csv", check=0).stdout)
        self.assertNotIn("live", self.runner("runs", "--where", "lr = 0.01", "--csv", check=0).stdout)
        shown = json.loads(self.runner("show", "live", "--json", check=0).stdout)
        self.assertEqual([(i["step"], i["changes"]) for i in shown["interventions"]],
                         [(set_at, ["train:set_lr(0.0123)"]),
                          (assigned_at, ["global helper", "local sample_every", "config.lr = 0.5"]),
                          (stop_at, ["run:stop()"])])
        # The trainer's lr metric shows the change at the step after the chunk.
        self.assertEqual(self.metric("lr", set_at), 0.01)
        self.assertEqual(self.metric("lr", set_at + 1), 0.0123)

    def test_a_chunks_output_is_sent_whole_up_to_1_mib_and_cut_with_a_note_past_it(self):
        training, _ = self.start_training()
        terminal = self.attach()
        # Exactly 1 MiB arrives whole (its letters in one run: the echoed line holds the letter apart).
        found, text = terminal.ask('io.write(string.rep("Q", 1048575), "\\n")', "QQQQ")
        self.assertTrue(found, text[-300:])
        self.assertEqual(max(map(len, re.findall("Q+", text))), 1048575)
        self.assertNotIn("was cut", text)
        # 10 bytes more are counted, not sent, and said so; the run goes on.
        found, text = terminal.ask('io.write(string.rep("Z", 1048585), "\\n")', "more bytes were not sent]")
        self.assertTrue(found, text[-300:])
        self.assertIn("[runner attach: the output was cut at 1 MiB; 10 more bytes were not sent]", text)
        self.assertEqual(max(map(len, re.findall("Z+", text))), 1048576)
        terminal.close()
        self.assertEqual(self.finish_training(training), "finished,300,")

    def test_a_refused_change_leaves_the_run_going_and_is_no_intervention(self):
        script = TRAINING_SCRIPT.replace("config { steps = 300, lr = 0.01, hold_at = 200 }",
                                         "config({ steps = 300, lr = 0.01, hold_at = 200 }, { hold_at = { min = 1 } })")
        self.assertNotEqual(script, TRAINING_SCRIPT)
        training, _ = self.start_training(script=script)
        terminal = self.attach()
        for chunk, error in (
                ("train:set_lr(1e308)", "train:set_lr: lr 1e+308 is more than float32, the dtype the optimizer "
                                        "applies learning rates in, holds (at most 3.4028235e+38)"),
                ("cfg.hold_at = 'x'", "bad value 'x' for config key 'hold_at': expected a whole number >= 1 "
                                      "(default 200)"),
                ("cfg.hold_at = 0", "bad value 0 for config key 'hold_at': expected a whole number >= 1"),
                ("cfg.hold_at = -5", "bad value -5 for config key 'hold_at': expected a whole number >= 1"),
                ("cfg.lr = math.huge", "bad value inf for config key 'lr': expected a number (default 0.01)"),
                ("cfg.hlod_at = 10", "config has no key 'hlod_at' (known keys: hold_at, lr, steps); did you mean "
                                     "'hold_at'?")):
            found, text = terminal.ask(chunk, error)
            self.assertTrue(found, text)
        found, text = terminal.ask("=train:lr(), cfg.hold_at, cfg.lr", "0.01")
        self.assertTrue(found, text)
        self.assertIn("200", text)
        terminal.close()
        self.assertEqual(self.finish_training(training), "finished,300,")
        rows = self.runner("query", "SELECT count(*) AS n FROM interventions", "--csv", check=0).stdout
        self.assertEqual(rows.splitlines()[1], "0")
        self.assertNotIn("runner attach after step", (self.home / "live" / "log.txt").read_text())

    def test_rank_0_of_a_data_parallel_job_refuses_what_the_ranks_would_disagree_on_and_stops_them_all(self):
        training, _ = self.start_training("--nproc", "2")
        terminal = self.attach()
        self.assertIn("attached to run live", terminal.seen.decode())
        self.assertIn("rank 0 of 2", terminal.seen.decode())
        found, text = terminal.ask("train:set_lr(1)", "refused")
        self.assertTrue(found, text)
        self.assertIn("train:set_lr is refused in runner attach: this job has 2 ranks and attach reaches rank 0 "
                      "alone, so the ranks would disagree", text)
        found, text = terminal.ask("run:checkpoint()", "refused")
        self.assertTrue(found, text)
        found, text = terminal.ask("=train:lr()", "0.01")
        self.assertTrue(found, text)
        # run:stop() is agreed by both ranks: they stop after the same step, with a checkpoint.
        start = len(terminal.seen)
        terminal.type(b"run:stop()\n")
        self.assertTrue(terminal.read_until(b"\n> "), terminal.seen)  # answered: the stop comes after the next step
        (self.dir / "hold").unlink()  # which the ranks take at once if they wait at step hold_at
        self.assertTrue(b"the run ended (interrupted)" in terminal.seen[start:]
                        or terminal.read_until(b"the run ended (interrupted)", 60), terminal.seen)
        self.assertEqual(terminal.wait(10), 0)
        self.assertEqual(training.wait(60), 0, (self.dir / "training.log").read_text())
        shown = self.runner("query", "SELECT status, error FROM runs WHERE name = 'live'", "--csv", check=0).stdout
        self.assertRegex(shown.splitlines()[1], r"^interrupted,stopped by run:stop\(\) at step \d+ after saving a "
                                                 r"checkpoint$")

    def test_ctrl_c_stops_an_endless_chunk_and_the_session_and_the_run_go_on(self):
        training, _ = self.start_training()
        terminal = self.attach()
        start = self.start_endless_chunk(terminal)
        terminal.type(b"\x03")
        self.assertTrue(terminal.read_until(b"\n> ", 60), terminal.seen[start:])
        text = terminal.seen[start:].decode(errors="replace")
        self.assertIn("stopping the chunk (Ctrl-C again detaches; the run goes on)", text)
        self.assertIn("interrupted by Ctrl-C in runner attach; the run goes on\r\nstack traceback:\r\n\tstdin:1: in main chunk", text)
        found, text = terminal.ask("print('after' .. ' ctrl-c')", "after ctrl-c")
        self.assertTrue(found, text)
        # A pcall in the chunk cannot go on with the stop.
        start = self.start_endless_chunk(terminal, "while true do pcall(function() while true do end end) end")
        terminal.type(b"\x03")
        self.assertTrue(terminal.read_until(b"\n> ", 60), terminal.seen[start:])
        self.assertIn("interrupted by Ctrl-C in runner attach; the run goes on", terminal.seen[start:].decode())
        # A chunk inside one C function (os.execute waits for its child) stops when it returns; Ctrl-C again
        # meanwhile detaches, and the run goes on.
        start = self.start_endless_chunk(terminal, "os.execute('sleep 5')")
        terminal.type(b"\x03")
        self.assertTrue(terminal.read_until(b"Ctrl-C again detaches", 60), terminal.seen[start:])
        terminal.type(b"\x03")
        self.assertTrue(terminal.read_until(b"detached from run live (it goes on)", 60), terminal.seen[start:])
        self.assertEqual(terminal.wait(10), 0)
        self.assertEqual(self.finish_training(training), "finished,300,")

    def test_sigterm_to_the_run_stops_an_endless_chunk_and_the_run_stops_with_a_checkpoint(self):
        training, _ = self.start_training()
        terminal = self.attach()
        start = self.start_endless_chunk(terminal)
        training.send_signal(signal.SIGTERM)
        self.assertTrue(terminal.read_until(b"\n> ", 60), terminal.seen[start:])
        self.assertIn("the run received SIGTERM: the chunk stopped, the run stops after this step with a checkpoint",
                      terminal.seen[start:].decode(errors="replace"))
        (self.dir / "hold").unlink()
        self.assertTrue(b"the run ended (interrupted)" in terminal.seen[start:]
                        or terminal.read_until(b"the run ended (interrupted)", 60), terminal.seen[start:])
        self.assertEqual(terminal.wait(10), 0)
        self.assertEqual(training.wait(120), 0, (self.dir / "training.log").read_text())
        status, step, error = self.runner("query", "SELECT status, step, error FROM runs WHERE name = 'live'",
                                          "--csv", check=0).stdout.splitlines()[1].split(",")
        self.assertEqual((status, error), ("interrupted", f"stopped by SIGTERM at step {step} after saving a checkpoint"))
        self.assertTrue((self.home / "live" / "checkpoints" / f"step-{int(step):07d}").is_dir())

    def test_an_idle_client_is_disconnected_and_the_session_is_free_again(self):
        self.env["RUNNER_ATTACH_IDLE_TIMEOUT"] = "3"
        training, socket_path = self.start_training()
        # A client that connects and says nothing.
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(silent.close)
        silent.connect(str(socket_path))
        silent.settimeout(60)
        received = b""
        while chunk := silent.recv(4096):
            received += chunk
        notice = (b"runner attach: disconnected after 3s without a request (RUNNER_ATTACH_IDLE_TIMEOUT), so that "
                  b"another session can attach; the run goes on")
        self.assertTrue(received.startswith(b"hello "), received)
        self.assertTrue(received.endswith(b"disconnected %d\n%s" % (len(notice), notice)), received)
        # The session is free: runner attach gets it, and is itself disconnected when it sends nothing.
        terminal = self.attach()
        self.assertIn("attached to run live", terminal.seen.decode())
        self.assertTrue(terminal.read_until(notice, 60), terminal.seen)
        self.assertEqual(terminal.wait(10), 0)
        self.assertEqual(self.finish_training(training), "finished,300,")

    def test_rank_0_of_a_data_parallel_job_stops_a_chunk_before_the_other_ranks_time_out(self):
        self.env["RUNNER_DIST_TIMEOUT"] = "60"
        training, _ = self.start_training("--nproc", "2")
        terminal = self.attach()
        self.assertIn("rank 0 of 2; chunks may run 30s after a step (half of RUNNER_DIST_TIMEOUT: the other ranks "
                      "wait), then they are stopped", terminal.seen.decode())
        start = self.start_endless_chunk(terminal)
        self.assertTrue(terminal.read_until(b"\n> ", 120), terminal.seen[start:])
        self.assertIn("stopped: rank 0 has answered runner attach for 30s since its step, the most a job of 2 ranks "
                      "allows (half of RUNNER_DIST_TIMEOUT: the other ranks wait for rank 0 meanwhile); the run goes "
                      "on", terminal.seen[start:].decode(errors="replace"))
        found, text = terminal.ask("=1 + 1", "2")
        self.assertTrue(found, text)
        terminal.type(b".detach\n")
        self.assertTrue(terminal.read_until(b"detached from run live", 30), terminal.seen)
        self.assertEqual(terminal.wait(10), 0)
        self.assertEqual(self.finish_training(training), "finished,300,")

    def test_a_chunk_in_one_long_c_call_on_rank_0_makes_the_other_ranks_wait_and_none_times_out(self):
        # Steps go on while the file `hold` exists (no waiting loop): rank 0 answers between two steps, and the other
        # rank waits for it at the end of that step, outside the collectives and their 10 s timeout.
        self.env["RUNNER_DIST_TIMEOUT"] = "10"
        script = TRAINING_SCRIPT.replace("config { steps = 300, lr = 0.01, hold_at = 200 }",
                                         "config { steps = 4000, lr = 0.01, hold_at = 0 }")
        self.assertNotEqual(script, TRAINING_SCRIPT)
        training, _ = self.start_training("--nproc", "2", script=script)
        terminal = self.attach()
        found, text = terminal.ask("=run.step > 0", "true")
        self.assertTrue(found, text)
        # The C call runs to its end (14 s, past the 5 s that rank 0 may answer for): the chunk is stopped where it
        # comes back to Lua, and the other rank, which waited outside the collectives, goes on with it.
        started = time.monotonic()
        found, text = terminal.ask("os.execute('sleep 14'); print('slept' .. ' at', run.step)",
                                   "stopped: rank 0 has answered runner attach for 5s since its step", seconds=90)
        self.assertTrue(found, text)
        self.assertGreaterEqual(time.monotonic() - started, 14)
        self.assertNotIn("slept at", text)
        found, text = terminal.ask("=run.step", "\n")
        self.assertTrue(found, text)
        terminal.type(b".detach\n")
        self.assertTrue(terminal.read_until(b"detached from run live", 30), terminal.seen)
        self.assertEqual(self.finish_training(training), "finished,4000,")
        self.assertNotIn("timed out", (self.dir / "training.log").read_text())

    def test_a_run_that_is_not_there_is_named(self):
        self.runner("-e", "runner.start({}, { name = 'other' })", check=0)
        result = self.runner("attach", "nosuch", check=1)
        self.assertTrue(result.stderr.startswith("runner attach: no run matches 'nosuch' (give an id"), result.stderr)


if __name__ == "__main__":
    unittest.main()
