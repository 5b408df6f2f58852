"""End-to-end tests of the training engine: the trainer against a plain PyTorch loop, bit-identical resume
after kill -9 and stop signals, damaged checkpoints, a full disk during a save or while metrics are written,
leftovers of dead checkpoint writers, checkpoints read by Python."""
import json
import os
import random
import resource
import signal
import sqlite3
import subprocess
import time

import torch
from safetensors.torch import load_file, save_file

from runner_process import RUNNER, RunnerHomeTest

# 20 steps of an MLP regression with AdamW, 5 warmup steps, clipping, EMA and accumulation 2; the initial
# weights and the data come from Python, the losses and final weights go back to it.
VERSUS_TORCH = """
local cfg = config { steps = 20 }
local run = runner.start(cfg, { resume = false })
local data = torch.load("data.safetensors")
local model = nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 8))
model:load_state_dict(torch.load("initial.safetensors"))
local ema_model = nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 8))
local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1e-2, weight_decay = 0.01 }, warmup = 5,
                               clip = 0.5, ema = 0.9, ema_model = ema_model, accumulate = 2, amp = "fp32" }
local losses, norms = {}, {}
for step = 1, cfg.steps do
  local batch = { data = data.x:narrow(1, (step - 1) * 4 + 1, 4), target = data.y:narrow(1, (step - 1) * 4 + 1, 4) }
  local out = train:step(batch, function(micro)
    local diff = model:forward(micro.data) - micro.target
    return (diff * diff):mean()
  end)
  losses[step], norms[step] = out.loss:item(), out.grad_norm:item()
end
local result = {}
for name, t in pairs(model:state_dict()) do result["model." .. name] = t end
for name, t in pairs(train.ema:state_dict()) do result["ema." .. name] = t end
result.losses = torch.tensor(losses, { dtype = "float64" })
result.norms = torch.tensor(norms, { dtype = "float64" })
torch.save(result, "result.safetensors")
"""

# A small UNet on the built-in shapes with checkpoints every 4 steps: deterministic on the CPU, so an
# interrupted and resumed run must end bit for bit where an uninterrupted one does. The loss is scaled by a
# math.random() draw, so that a resume which draws other numbers than the uninterrupted run changes the losses.
# objective=flow trains with the flow-matching objective (logit-normal times) instead of DDPM's.
RESUMABLE = """
local cfg = config { steps = 40, every = 4, accumulate = 2, on_error = "stop", name = "run", keep = 2, seed = 5,
                     objective = "ddpm" }
local run = runner.start(cfg, { name = cfg.name })
local shapes = runner.data.shapes { size = 8, count = 512, seed = 3 }
local loader = runner.data.loader(shapes, { batch = 8, shuffle = true, seed = 3, workers = 1 })
local function make() return nn.UNet { image = 8, channels = 8, mults = { 1, 2 }, blocks = 1, attention = {}, groups = 4, dropout = 0.1 } end
local model = make()
local objective = cfg.objective == "flow" and runner.diffusion.flow { time = "logit_normal", seed = 3 }
                  or runner.diffusion.gaussian { timesteps = 100, seed = 3 }
local train = runner.trainer { model = model, optimizer = { "adamw", lr = 2e-3, weight_decay = 0.01 }, warmup = 5,
                               schedule = "cosine", steps = cfg.steps, clip = 1.0, ema = { 0.9, 0.99 },
                               accumulate = cfg.accumulate, amp = "fp32", deterministic = true, progress = false }
run:restore { trainer = train, loader = loader, state = { objective = objective }, keep_last = cfg.keep, on_error = cfg.on_error }
print("start at " .. run.step)
for batch in loader:iter { from = run.step, to = cfg.steps } do
  local out = train:step(batch, function(micro) return objective:loss(model, micro) * (0.5 + math.random()) end)
  run:log { loss = out.loss }
  if run:every(cfg.every) then run:checkpoint() end
  local waited = runner.clock()
  while runner.clock() - waited < 0.05 do end  -- slow steps, so that signals land mid-run
end
run:checkpoint { wait = true }
print("done at " .. run.step)
"""


def small_disk(limit):
    """A preexec_fn under which files cannot grow beyond `limit` bytes (writes fail with EFBIG, as on a full disk)."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def tensors_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class TrainerTest(RunnerHomeTest):
    def runner(self, *args, check=0, timeout=300, preexec_fn=None):
        # Here a run must succeed unless a test says otherwise, and training steps get more time.
        return super().runner(*args, check=check, timeout=timeout, preexec_fn=preexec_fn)

    def checkpoint_dir(self, run, step):
        return self.home / run / "checkpoints" / f"step-{step:07d}"

    def final_state(self, run, step=40):
        folder = self.checkpoint_dir(run, step)
        return {name: load_file(folder / name) for name in
                ("model.safetensors", "ema.safetensors", "ema-2.safetensors", "optimizer.safetensors", "trainer.safetensors")}

    def assert_same_state(self, a, b):
        for name in a:
            self.assertTrue(tensors_equal(a[name], b[name]), f"{name} differs")

    def assert_same_checkpoint_files(self, run_a, run_b, step):
        """Every file of the two runs' checkpoints at `step` is byte for byte the same (the manifest apart from
        the run id it names)."""
        a, b = self.checkpoint_dir(run_a, step), self.checkpoint_dir(run_b, step)
        names = sorted(p.name for p in a.iterdir())
        self.assertEqual(names, sorted(p.name for p in b.iterdir()))
        for name in names:
            if name == "manifest.json":
                manifests = [json.loads((d / name).read_text()) for d in (a, b)]
                for manifest in manifests:
                    manifest.pop("run")
                self.assertEqual(manifests[0], manifests[1])
            else:
                self.assertEqual((a / name).read_bytes(), (b / name).read_bytes(), f"{name} differs")

    def metric_rows(self, run, key):
        with sqlite3.connect(self.home / "index.db") as db:
            return db.execute("SELECT m.step, m.value FROM metrics m JOIN runs r USING (run) WHERE r.name = ? "
                              "AND m.key = ? ORDER BY m.step", (run, key)).fetchall()

    def latest_step(self, run):
        try:
            with sqlite3.connect(self.home / "index.db", timeout=30) as db:
                row = db.execute("SELECT max(c.step) FROM checkpoints c JOIN runs r ON r.run = c.run "
                                 "WHERE r.name = ? AND c.kept", (run,)).fetchone()
            return row[0] or 0
        except sqlite3.OperationalError:
            return 0

    def start_resumable(self, *args):
        return subprocess.Popen([RUNNER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=self.dir, env=self.env)

    def wait_for_checkpoint(self, process, run, after):
        deadline = time.time() + 120
        while time.time() < deadline and process.poll() is None:
            if self.latest_step(run) > after:
                return
            time.sleep(0.05)
        self.fail(f"no checkpoint after step {after} (exit {process.poll()})")

    def test_trainer_matches_a_pytorch_loop(self):
        torch.manual_seed(0)
        reference = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8))
        save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, self.dir / "initial.safetensors")
        x, y = torch.randn(80, 8), torch.randn(80, 8)
        save_file({"x": x, "y": y}, self.dir / "data.safetensors")
        self.runner(self.script("versus.lua", VERSUS_TORCH))
        result = load_file(self.dir / "result.safetensors")

        # The same training written plainly in PyTorch.
        optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01, foreach=True)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 6 if step < 5 else 1.0)
        ema = {k: v.detach().clone() for k, v in reference.named_parameters()}
        losses, norms = [], []
        for step in range(1, 21):
            xb, yb = x[(step - 1) * 4: step * 4], y[(step - 1) * 4: step * 4]
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for micro in range(2):
                loss = ((reference(xb[micro * 2:(micro + 1) * 2]) - yb[micro * 2:(micro + 1) * 2]) ** 2).mean()
                (loss / 2).backward()
                total += loss.item()
            norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5, foreach=True).item())
            optimizer.step()
            schedule.step()
            decay = 0.0 if step == 1 else 0.9  # diffusers' EMAModel.get_decay
            with torch.no_grad():
                for k, p in reference.named_parameters():
                    ema[k].lerp_(p, 1 - decay)
            losses.append(total / 2)

        torch.testing.assert_close(result["losses"], torch.tensor(losses, dtype=torch.float64), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(result["norms"], torch.tensor(norms, dtype=torch.float64), rtol=1e-5, atol=1e-6)
        for k, v in reference.state_dict().items():
            torch.testing.assert_close(result["model." + k], v, rtol=1e-5, atol=1e-6, msg=f"model {k}")
            torch.testing.assert_close(result["ema." + k], ema[k], rtol=1e-5, atol=1e-6, msg=f"ema {k}")

    def test_resume_after_kill_and_signals_is_bit_identical(self):
        script = self.script("resumable.lua", RESUMABLE)
        straight = self.runner(script, "name=straight")
        self.assertIn("start at 0", straight.stdout)
        reference = self.final_state("straight")
        # model.safetensors is a plain state dict that PyTorch loads.
        unet_keys = reference["model.safetensors"].keys()
        self.assertIn("conv_in.weight", unet_keys)

        rng = random.Random(7)
        # kill -9 twice at random moments after a checkpoint, then SIGTERM (exit 0) and SIGINT (exit 130),
        # each stop a graceful step-and-checkpoint; every restart continues the same run.
        first = self.start_resumable(script, "name=killed")
        self.wait_for_checkpoint(first, "killed", 0)
        time.sleep(rng.uniform(0.0, 0.3))
        first.kill()
        first.communicate()
        for stop in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            step = self.latest_step("killed")
            process = self.start_resumable("--resume", "killed", script, "name=killed")
            self.wait_for_checkpoint(process, "killed", step)
            time.sleep(rng.uniform(0.0, 0.2))
            process.send_signal(stop)
            out, err = process.communicate(timeout=120)
            if stop == signal.SIGKILL:
                self.assertEqual(process.returncode, -signal.SIGKILL)
            else:
                self.assertEqual(process.returncode, 0 if stop == signal.SIGTERM else 130, err)
                self.assertIn("saving a checkpoint at step", err)
                with sqlite3.connect(self.home / "index.db") as db:
                    status, error = db.execute("SELECT status, error FROM runs WHERE name = 'killed'").fetchone()
                self.assertEqual(status, "interrupted")
                self.assertRegex(error, r"stopped by SIG(TERM|INT) at step \d+ after saving a checkpoint")
        # The same command as the first continues the interrupted run.
        final = self.runner(script, "name=killed")
        self.assertIn("resuming run killed", final.stdout)
        self.assertIn("done at 40", final.stdout)
        self.assertNotIn("start at 0", final.stdout)
        # Every step's loss row is there, with the straight run's value, across kills and graceful stops.
        straight_losses = self.metric_rows("straight", "loss")
        self.assertEqual([step for step, _ in straight_losses], list(range(1, 41)))
        self.assertEqual(self.metric_rows("killed", "loss"), straight_losses)
        self.assert_same_state(reference, self.final_state("killed"))
        self.assert_same_checkpoint_files("straight", "killed", 40)
        with sqlite3.connect(self.home / "index.db") as db:
            runs = db.execute("SELECT name, status FROM runs ORDER BY run").fetchall()
            kept = db.execute("SELECT c.step FROM checkpoints c JOIN runs r USING (run) WHERE r.name = 'killed' "
                              "AND c.kept ORDER BY c.step").fetchall()
        self.assertEqual(runs, [("straight", "finished"), ("killed", "finished")])
        self.assertEqual(kept, [(36,), (40,)])  # keep_last = 2
        self.assertFalse(self.checkpoint_dir("killed", 32).exists())

    def test_a_flow_matching_run_resumes_bit_for_bit_after_kill(self):
        script = self.script("resumable.lua", RESUMABLE)
        self.runner(script, "name=straight", "objective=flow")
        killed = self.start_resumable(script, "name=killed", "objective=flow")
        self.wait_for_checkpoint(killed, "killed", 8)
        killed.kill()
        killed.communicate()
        self.assertLess(self.latest_step("killed"), 40)
        final = self.runner(script, "name=killed", "objective=flow")
        self.assertIn("resuming run killed", final.stdout)
        self.assertIn("done at 40", final.stdout)
        straight_losses = self.metric_rows("straight", "loss")
        self.assertEqual([step for step, _ in straight_losses], list(range(1, 41)))
        self.assertEqual(self.metric_rows("killed", "loss"), straight_losses)
        self.assert_same_state(self.final_state("straight"), self.final_state("killed"))
        self.assert_same_checkpoint_files("straight", "killed", 40)

    def test_fork_last_starts_from_the_newest_run_with_a_checkpoint(self):
        self.runner(self.script("resumable.lua", RESUMABLE), "name=parent", "steps=8")
        fork = self.script("fork.lua", RESUMABLE.replace("runner.start(cfg, { name = cfg.name })",
                                                         "runner.start(cfg, { name = cfg.name, fork = 'last' })")
                                              .replace('print("start at " .. run.step)',
                                                       'print("start at " .. run.step); assert(cfg.steps > 8, "a mistake")'))
        # A first attempt that fails before any checkpoint is the newest run, but not what 'last' forks from.
        self.assertIn("a mistake", self.runner(fork, "name=attempt", "steps=8", check=1).stderr)
        result = self.runner(fork, "name=child", "steps=12")
        self.assertIn("start at 8", result.stdout)
        self.assertIn("done at 12", result.stdout)
        shown = {name: json.loads(self.runner("show", name, "--json").stdout) for name in ("parent", "attempt", "child")}
        self.assertEqual(shown["child"]["parent"], shown["parent"]["id"])
        self.assertEqual(shown["attempt"]["parent"], shown["parent"]["id"])

    def test_a_step_saved_in_the_loop_is_not_saved_again_after_it(self):
        result = self.runner(self.script("resumable.lua", RESUMABLE), "name=twice", "steps=8")
        self.assertEqual(result.stderr.count("checkpoint checkpoints/step-0000008 saved"), 1, result.stderr)
        self.assertEqual(result.stderr.count("checkpoint checkpoints/step-0000004 saved"), 1, result.stderr)
        self.assertIn("done at 8", result.stdout)

    def test_duration_leaves_out_the_pause_between_a_stop_and_its_resume(self):
        script = self.script("resumable.lua", RESUMABLE)
        self.runner(script, "name=paused", "steps=4")
        time.sleep(3)
        self.runner("--resume", "paused", script, "name=paused", "steps=8")
        shown = json.loads(self.runner("show", "paused", "--json").stdout)
        self.assertEqual(shown["attempts"], 2)
        self.assertGreater(shown["wall_seconds"], 3)
        self.assertLess(shown["duration"], shown["wall_seconds"] - 2.9)
        text = self.runner("show", "paused").stdout
        self.assertRegex(text, r"duration \d+s in 2 attempts \(\d+s from the first start to the end\)")

    def test_damaged_checkpoints_are_skipped(self):
        script = self.script("resumable.lua", RESUMABLE)
        self.runner(script, "name=straight", "steps=12", "keep=3")
        reference = load_file(self.checkpoint_dir("straight", 12) / "model.safetensors")
        self.runner(script, "name=damaged", "steps=12", "keep=3")
        newest = self.checkpoint_dir("damaged", 12) / "model.safetensors"
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0x01
        newest.write_bytes(bytes(data))
        older = self.checkpoint_dir("damaged", 8) / "optimizer.safetensors"
        older.write_bytes(older.read_bytes()[:100])
        result = self.runner("--resume", "damaged", script, "name=damaged", "steps=12", "keep=3")
        self.assertIn("checkpoint skipped, it is damaged: checkpoints/step-0000012: model.safetensors: sha256 differs "
                      "(damaged)", result.stderr)
        self.assertRegex(result.stderr, r"checkpoint skipped, it is damaged: checkpoints/step-0000008: "
                                        r"optimizer.safetensors: 100 bytes, expected \d+ \(truncated or replaced\)")
        self.assertIn("start at 4", result.stdout)
        self.assertTrue(torch.equal(load_file(newest)["conv_in.weight"], reference["conv_in.weight"]))

    def test_full_disk_during_a_save(self):
        script = self.script("resumable.lua", RESUMABLE)
        self.runner(script, "name=full", "steps=4", "every=2")
        first = self.checkpoint_dir("full", 4)
        before = {p.name: p.read_bytes() for p in first.iterdir()}
        biggest = max(len(b) for b in before.values())

        # stop policy: the run fails with the cause and exit status 75 (a sweep continues such a trial); the previous
        # checkpoint and nothing else is on disk.
        failed = self.runner("--resume", "full", script, "name=full", "steps=8", "every=2", check=75,
                             preexec_fn=small_disk(biggest // 2))
        self.assertIn("runner: exit status 75: a write failed for want of space (a sweep continues the trial)",
                      failed.stderr)
        self.assertRegex(failed.stderr, r"checkpoint checkpoints/step-00000(06|08) could not be saved: .*File too large.* "
                                        r"\(the previous checkpoint is intact\)")
        self.assertEqual({p.name: p.read_bytes() for p in first.iterdir()}, before)
        leftovers = [p.name for p in (self.home / "full" / "checkpoints").iterdir() if p.name.startswith(".")]
        self.assertEqual(leftovers, [])
        # continue policy: the run goes on and finishes, reporting each failed save.
        going = self.runner("--resume", "full", script, "name=full", "steps=8", "every=2", "on_error=continue",
                            check=0, preexec_fn=small_disk(biggest // 2))
        self.assertIn("the run continues; the previous checkpoint is intact", going.stderr)
        self.assertIn("done at 8", going.stdout)

    def test_full_disk_while_metrics_are_written_fails_the_run(self):
        script = self.script("metrics.lua", """
            local run = runner.start({}, { name = "metrics" })
            for step = 1, 400 do
              local values = {}
              for k = 1, 50 do values[string.format("a_metric_with_a_long_name_%03d", k)] = step * k end
              run:log(values, step)
            end
            print("logged")
        """)
        result = self.runner(script, check=75, preexec_fn=small_disk(1 << 20))
        self.assertIn("logged", result.stdout)
        self.assertRegex(result.stderr, r"runner: run metrics \([0-9a-z]{8}\): \d+ of 20000 metric values could not be "
                                        r"written to the index: ")
        with sqlite3.connect(self.home / "index.db") as db:
            status, error = db.execute("SELECT status, error FROM runs WHERE name = 'metrics'").fetchone()
            written = db.execute("SELECT count(*) FROM metrics").fetchone()[0]
        self.assertEqual(status, "failed")
        self.assertRegex(error, r"\d+ of 20000 metric values could not be written to the index")
        self.assertLess(written, 20000)

    def test_a_final_status_the_full_index_refuses_is_recorded_at_the_next_start(self):
        script = self.script("full.lua", """
            local run = runner.start({}, { name = "full" })
            print("started")
            io.stdout:flush()
            while not io.open("go") do end
            for step = 1, 50 do run:log({ loss = step }, step) end
        """)
        # Once the run has started, no file may grow beyond 4096 bytes: every index write (a WAL frame is
        # larger) fails with EFBIG as on a full disk, while the 4096-byte status file the run reserved can
        # still be overwritten in place.
        process = subprocess.Popen([RUNNER, script], cwd=self.dir, env=self.env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
        self.assertEqual(process.stdout.readline(), "started\n")
        limits = resource.prlimit(process.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (4096, limits[1]))
        (self.dir / "go").write_text("")
        _, stderr = process.communicate(timeout=120)
        self.assertEqual(process.returncode, 75, stderr)  # a write failed for want of space
        self.assertIn("the run's final status (failed) could not be recorded: ", stderr)
        self.assertIn(f"it is in {self.home}/full/final-status.json, and the next run started or `runner gc` records it",
                      stderr)
        with sqlite3.connect(self.home / "index.db") as db:
            self.assertEqual(db.execute("SELECT status FROM runs WHERE name = 'full'").fetchone(), ("running",))
        self.script("next.lua", "runner.start({}, { name = 'next' })")
        self.runner("next.lua", check=0)
        with sqlite3.connect(self.home / "index.db") as db:
            status, error = db.execute("SELECT status, error FROM runs WHERE name = 'full'").fetchone()
        self.assertEqual(status, "failed")
        self.assertRegex(error, r"\d+ of 50 metric values could not be written to the index")

    def test_a_stop_waits_for_the_loop_body_and_saves_nothing_before_the_first_step(self):
        script = self.script("stop.lua", """
            local cfg = config { signal_at = 3 }
            local run = runner.start(cfg, { name = "stop" })
            local model = nn.Linear(2, 1)
            local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.1 }, progress = false }
            run:restore { trainer = train }
            local function terminate_self()
              os.execute("kill -TERM $PPID")
              local start = runner.clock()
              while runner.clock() - start < 0.2 do end
            end
            if cfg.signal_at == 0 then terminate_self() end
            for step = run.step + 1, 6 do
              train:step(function() return model(torch.ones(4, 2)):pow(2):mean() end)
              if step == cfg.signal_at then terminate_self() end
              run:log { after = step }
            end
        """)
        stopped = self.runner(script, check=0)
        self.assertIn("SIGTERM: saving a checkpoint at step 3 before stopping", stopped.stderr)
        self.assertEqual(self.metric_rows("stop", "after"), [(1, 1.0), (2, 2.0), (3, 3.0)])
        self.assertTrue(self.checkpoint_dir("stop", 3).exists())

        early = self.runner("--resume", "stop", script, "signal_at=0", check=0)
        self.assertIn("SIGTERM: stopping before the first step", early.stderr)
        with sqlite3.connect(self.home / "index.db") as db:
            status, error = db.execute("SELECT status, error FROM runs WHERE name = 'stop'").fetchone()
            steps = db.execute("SELECT step FROM checkpoints ORDER BY step").fetchall()
        self.assertEqual((status, error), ("interrupted", "stopped by SIGTERM at step 3 before the first step"))
        self.assertEqual(steps, [(3,)])

        self.runner("--resume", "stop", script, "signal_at=-1", check=0)
        self.assertEqual(self.metric_rows("stop", "after"), [(s, float(s)) for s in range(1, 7)])

    def test_gc_does_not_list_checkpoints_rotation_already_deleted(self):
        script = self.script("resumable.lua", RESUMABLE)
        self.runner(script, "name=rotated", "steps=6", "every=2", "keep=1")
        folder = self.home / "rotated" / "checkpoints"
        self.assertEqual(sorted(p.name for p in folder.iterdir()), ["step-0000006"])
        with sqlite3.connect(self.home / "index.db") as db:
            self.assertEqual(db.execute("SELECT step, kept FROM checkpoints").fetchall(), [(6, 1)])
        dry = self.runner("gc", "--dry-run", check=0)
        self.assertNotIn("checkpoint", dry.stdout)
        self.assertIn("would have 0 B freed", dry.stdout)

    def test_leftovers_of_dead_checkpoint_writers_are_cleaned(self):
        script = self.script("resumable.lua", RESUMABLE)
        self.runner(script, "name=stale", "steps=4", "every=2", "keep=3")
        folder = self.home / "stale" / "checkpoints"

        def leave_leftovers():
            partial = folder / ".partial-0000006-999999"
            partial.mkdir()
            (partial / "model.safetensors").write_bytes(b"x" * 1000)
            # A writer that moved the old step 2 aside and died before its replacement arrived.
            (folder / "step-0000002").rename(folder / ".replaced-0000002-999999")
            return partial

        partial = leave_leftovers()
        dry = self.runner("gc", "--dry-run", check=0)
        self.assertIn(f"would delete {self.home}/stale/checkpoints/.partial-0000006-999999 "
                      "(a checkpoint write that never finished)", dry.stdout)
        self.assertIn(f"would move {self.home}/stale/checkpoints/.replaced-0000002-999999 back into place", dry.stdout)
        self.assertTrue(partial.exists())
        gc = self.runner("gc", check=0)
        self.assertIn(f"delete {self.home}/stale/checkpoints/.partial-0000006-999999", gc.stdout)
        self.assertFalse(partial.exists())
        self.assertTrue((folder / "step-0000002" / "model.safetensors").exists())

        partial = leave_leftovers()
        resumed = self.runner("--resume", "stale", script, "name=stale", "steps=6", "every=2", "keep=3")
        self.assertIn("checkpoints/.partial-0000006-999999 deleted (a checkpoint write that never finished)", resumed.stderr)
        self.assertIn("checkpoints/.replaced-0000002-999999 moved back into place", resumed.stderr)
        self.assertEqual(sorted(p.name for p in folder.iterdir()), ["step-0000002", "step-0000004", "step-0000006"])


# A small UNet for a few steps; the profile flag or option is the test's.
PROFILED = """
local cfg = config { steps = 4, profile = "" }
local run = runner.start(cfg)
local model = nn.UNet { image = 8, channels = 8, mults = { 1, 2 }, blocks = 1, attention = {}, groups = 4 }
local ddpm = runner.diffusion.gaussian { timesteps = 100 }
local options = { model = model, optimizer = { "adamw", lr = 1e-3 }, steps = cfg.steps, progress = false }
if cfg.profile ~= "" then options.profile = cfg.profile end
local train = runner.trainer(options)
for step = 1, cfg.steps do
  train:step(torch.randn(4, 3, 8, 8), function(x) return ddpm:loss(model, x) end)
end
"""


# Loader batches, and an "evaluation" of `busy` seconds after each step: the loop's own work between steps.
TIMED = """
local cfg = config { steps = 3, busy = 0.2 }
local run = runner.start(cfg)
local model = nn.Linear(3 * 8 * 8, 1)
local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.01 }, steps = cfg.steps, progress = false }
local loader = runner.data.loader(runner.data.shapes { size = 8, count = 16 }, { batch = 4 })
for batch in loader:iter { to = cfg.steps } do
  assert(batch.wait_s >= 0, "a loader batch says how long loader:next() took")
  train:step(batch, function(micro) return model(micro.data:flatten(2)):pow(2):mean() end)
  local t = runner.clock()
  while runner.clock() - t < cfg.busy do end
end
"""


# Trains with a loader until the file `release` exists or, given `seconds`, for that long; the run's system metrics
# every `interval` seconds (0: none, as runner.start's system_metrics = false).
SAMPLED = """
local cfg = config { interval = 0.2, release = "release", seconds = 0, after = 0 }
local run = runner.start(cfg, { system_metrics = cfg.interval > 0 and cfg.interval or false })
local model = nn.Linear(3 * 8 * 8, 1)
local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.01 }, progress = false }
local loader = runner.data.loader(runner.data.shapes { size = 8, count = 16 }, { batch = 4, workers = 1 })
run:restore { trainer = train, loader = loader }
local start = runner.clock()
for batch in loader:iter { to = 1000000000 } do
  train:step(batch, function(micro) return model(micro.data:flatten(2)):pow(2):mean() end)
  if cfg.seconds > 0 then
    if runner.clock() - start > cfg.seconds then break end
  else
    local release = io.open(cfg.release)
    if release then release:close() break end
  end
end
print("trained to step " .. run.step)
if cfg.after > 0 then os.execute("sleep " .. cfg.after) end  -- as a final evaluation: no steps
"""

SYSTEM_KEYS = ["sys/cpu_percent", "sys/data_wait_percent", "sys/host_cpu_percent", "sys/host_memory_available_mib",
               "sys/host_memory_used_mib", "sys/loader_queue_depth", "sys/peak_rss_mib", "sys/rss_mib",
               "sys/samples_per_second", "sys/steps_per_second"]
CUDA_KEYS = ["sys/cuda_allocated_mib", "sys/cuda_peak_allocated_mib", "sys/cuda_reserved_mib", "sys/gpu_memory_used_mib",
             "sys/gpu_percent", "sys/gpu_power_watts", "sys/gpu_temperature_celsius"]


class SystemMetrics(RunnerHomeTest):
    def setUp(self):
        super().setUp()
        self.script("sampled.lua", SAMPLED)

    def system_rows(self, name):
        with sqlite3.connect(f"file:{self.home / 'index.db'}?mode=ro", uri=True) as db:
            return db.execute("SELECT m.key, m.step, m.value FROM metrics m JOIN runs r USING (run) "
                              "WHERE r.name = ? AND m.key LIKE 'sys/%' ORDER BY m.key, m.step", (name,)).fetchall()

    def logged(self, name, key):
        """Whether run `name` has a value of `key` in the index (False before the index and its tables exist)."""
        try:
            return any(row[0] == key for row in self.system_rows(name))
        except sqlite3.OperationalError:  # no index yet, or its schema is being created
            return False

    def test_rates_of_training_leave_out_a_time_without_steps(self):
        # A final evaluation (no steps for several readings) leaves no steps/s, samples/s or data wait reading of 0:
        # the finished run's latest rates are its training's.
        self.runner("sampled.lua", "seconds=2", "after=2", check=0)
        rows = self.system_rows("sampled-1")
        last_step = max(step for _, step, _ in rows)
        at_last = {key for key, step, _ in rows if step == last_step}
        self.assertIn("sys/cpu_percent", at_last)
        for key in ("sys/steps_per_second", "sys/samples_per_second"):
            values = [value for k, _, value in rows if k == key]
            self.assertTrue(values and all(value > 0 for value in values), f"{key}: {values}")

    def test_a_run_records_its_system_metrics_at_its_steps(self):
        job = subprocess.Popen([RUNNER, "sampled.lua"], cwd=self.dir, env=self.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            # The loader's metrics come from the second sample after run:restore attached it: once they are in
            # the index (flushed each second), every key has been sampled.
            deadline = time.monotonic() + 120
            while not self.logged("sampled-1", "sys/samples_per_second"):
                self.assertIsNone(job.poll(), job.stderr.read() if job.poll() is not None else "")
                self.assertLess(time.monotonic(), deadline, "no system metrics reached the index")
                time.sleep(0.1)
        finally:
            (self.dir / "release").touch()
            stdout, stderr = job.communicate(timeout=120)
        self.assertEqual(job.returncode, 0, stderr)
        last_step = int(stdout.split("trained to step ")[1])
        rows = self.system_rows("sampled-1")
        cuda = torch.cuda.is_available()
        self.assertEqual(sorted({key for key, _, _ in rows}), sorted(SYSTEM_KEYS + (CUDA_KEYS if cuda else [])))
        self.assertTrue(all(0 <= step <= last_step for _, step, _ in rows))
        latest = {key: value for key, _, value in rows}  # at the highest step of each key
        cores = os.cpu_count()
        self.assertGreaterEqual(latest["sys/cpu_percent"], 0)
        self.assertLessEqual(latest["sys/cpu_percent"], 100 * cores + 10)
        self.assertGreaterEqual(latest["sys/host_cpu_percent"], 0)
        self.assertLessEqual(latest["sys/host_cpu_percent"], 100)
        self.assertGreater(latest["sys/rss_mib"], 10)
        self.assertGreaterEqual(latest["sys/peak_rss_mib"], latest["sys/rss_mib"])
        self.assertGreater(latest["sys/host_memory_available_mib"], 0)
        self.assertGreater(latest["sys/host_memory_used_mib"], latest["sys/rss_mib"])
        self.assertIn(latest["sys/loader_queue_depth"], [0, 1, 2])  # one worker: 2 batches in flight
        # Every reading of the rates is of an interval that trained, and samples/s is the batch (4) times steps/s
        # (the loader counts a batch when the loop takes it, up to one batch ahead of the step: 4 samples over an
        # interval of 0.2 s or more).
        steps = {step: value for key, step, value in rows if key == "sys/steps_per_second"}
        samples = {step: value for key, step, value in rows if key == "sys/samples_per_second"}
        self.assertTrue(steps and all(value > 0 for value in steps.values()), steps)
        self.assertTrue(samples)
        for step, value in samples.items():
            self.assertAlmostEqual(value, 4 * steps[step], delta=4 / 0.2 + 0.02 * 4 * steps[step], msg=f"step {step}")
        for key in ("sys/data_wait_percent", "sys/host_cpu_percent"):
            values = [value for k, _, value in rows if k == key]
            self.assertTrue(values and all(0 <= value <= 100 for value in values), f"{key}: {values}")
        if cuda:
            self.assertGreater(latest["sys/cuda_reserved_mib"], 0)
            self.assertGreaterEqual(latest["sys/cuda_peak_allocated_mib"], latest["sys/cuda_allocated_mib"])
            self.assertGreater(latest["sys/gpu_memory_used_mib"], latest["sys/cuda_allocated_mib"])
            self.assertLess(latest["sys/gpu_temperature_celsius"], 120)
        # The run's page and runner show list them with the rest.
        shown = json.loads(self.runner("show", "sampled-1", "--json", check=0).stdout)
        self.assertIn("sys/rss_mib", shown["metrics"])

    def test_system_metrics_false_records_none(self):
        # Longer than the default interval (10 s), which would otherwise have sampled once.
        result = self.runner("sampled.lua", "interval=0", "seconds=11", check=0)
        self.assertIn("trained to step", result.stdout)
        self.assertEqual(self.system_rows("sampled-1"), [])

    def test_a_bad_interval_is_an_error_naming_the_option(self):
        self.script("bad.lua", 'runner.start({}, { system_metrics = "often" })')
        result = self.runner("bad.lua", check=1)
        self.assertIn("bad.lua:1: runner.start: system_metrics must be a number of seconds, or false for none, "
                      "got string", result.stderr)
        self.script("negative.lua", "runner.start({}, { system_metrics = -1 })")
        result = self.runner("negative.lua", check=1)
        self.assertIn("runner.start: system_metrics must be a number of seconds, or false for none, got -1",
                      result.stderr)


class Profiling(RunnerHomeTest):
    def setUp(self):
        super().setUp()
        self.script("profiled.lua", PROFILED)

    def show(self):
        shown = self.runner("show", "last", "--json", check=0)
        return json.loads(shown.stdout)

    def test_profile_flag_writes_a_trace_artifact_and_prints_the_top_operators(self):
        result = self.runner("--profile", "2:3", "profiled.lua", check=0)
        run_dir = self.home / "profiled-1"
        trace = run_dir / "profile-steps-2-3.json"
        self.assertIn(f"profile of steps 2-3: {trace}", result.stdout)
        table = result.stdout.split(str(trace), 1)[1]
        self.assertRegex(table, r"CPU operator +self ms +self % +total ms +calls")
        self.assertRegex(table, r"\naten::\S+ +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9]+\n")
        self.assertIn("CPU self time in all operators:", table)
        events = json.loads(trace.read_text())["traceEvents"]
        names = {event.get("name") for event in events}
        self.assertIn("aten::convolution", names)
        shown = self.show()
        self.assertIn({"kind": "file", "name": "profile", "path": "profile-steps-2-3.json", "step": 3},
                      [{k: a[k] for k in ("kind", "name", "path", "step")} for a in shown["artifacts"]])
        # The step-time breakdown, logged at the last step as the mean of the steps since the last log.
        for key in ("time/batch_wait_ms", "time/between_steps_ms", "time/forward_backward_ms", "time/optimizer_ms",
                    "time/ema_ms"):
            self.assertEqual(shown["metrics"][key]["step"], 4, key)
            self.assertGreaterEqual(shown["metrics"][key]["value"], 0, key)
        self.assertGreater(shown["metrics"]["time/forward_backward_ms"]["value"], 0)

    def test_the_loops_own_work_between_steps_is_not_counted_as_waiting_for_batches(self):
        self.script("timed.lua", TIMED)
        self.runner("timed.lua", check=0)
        metrics = self.show()["metrics"]
        self.assertNotIn("time/data_ms", metrics)
        # Steps 2 and 3 each follow a busy-wait of 0.2 s outside the trainer and the loader (step 1 follows none).
        self.assertGreaterEqual(metrics["time/between_steps_ms"]["value"], 2 * 200 / 3)
        self.assertEqual(metrics["time/between_steps_ms"]["step"], 3)
        self.assertGreaterEqual(metrics["time/batch_wait_ms"]["value"], 0)

    def test_bad_ranges_are_errors_naming_them(self):
        result = self.runner("--profile", "3:2", "profiled.lua", check=2)
        self.assertIn("--profile: '3:2' ends before it starts: expected A:B with A <= B", result.stderr)
        result = self.runner("--profile", "two", "profiled.lua", check=2)
        self.assertIn("--profile: 'two' is not a step range: expected A:B or A, steps from 1", result.stderr)
        result = self.runner("profiled.lua", "profile=5:9", check=1)
        self.assertIn("profiled.lua:7: runner.trainer: profile 5:9 ends after the last step (4)", result.stderr)
