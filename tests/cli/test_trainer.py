"""End-to-end tests of the training engine: the trainer against a plain PyTorch loop, bit-identical resume
after kill -9 and stop signals, damaged checkpoints, a full disk during a save, checkpoints read by Python."""
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
# interrupted and resumed run must end bit for bit where an uninterrupted one does.
RESUMABLE = """
local cfg = config { steps = 40, every = 4, accumulate = 2, on_error = "stop", name = "run", keep = 2, seed = 5 }
local run = runner.start(cfg, { name = cfg.name })
local shapes = runner.data.shapes { size = 8, count = 512, seed = 3 }
local loader = runner.data.loader(shapes, { batch = 8, shuffle = true, seed = 3, workers = 1 })
local function make() return nn.UNet { image = 8, channels = 8, mults = { 1, 2 }, blocks = 1, attention = {}, groups = 4, dropout = 0.1 } end
local model = make()
local ddpm = runner.diffusion.gaussian { timesteps = 100, seed = 3 }
local train = runner.trainer { model = model, optimizer = { "adamw", lr = 2e-3, weight_decay = 0.01 }, warmup = 5,
                               schedule = "cosine", steps = cfg.steps, clip = 1.0, ema = { 0.9, 0.99 },
                               accumulate = cfg.accumulate, amp = "fp32", deterministic = true, progress = false }
run:restore { trainer = train, loader = loader, state = { ddpm = ddpm }, keep_last = cfg.keep, on_error = cfg.on_error }
print("start at " .. run.step)
for batch in loader:iter { from = run.step, to = cfg.steps } do
  local out = train:step(batch, function(micro) return ddpm:loss(model, micro) + 0 * math.random() end)
  run:log { loss = out.loss }
  if run:every(cfg.every) then run:checkpoint() end
  local waited = runner.clock()
  while runner.clock() - waited < 0.05 do end  -- slow steps, so that signals land mid-run
end
run:checkpoint { wait = true }
print("done at " .. run.step)
"""


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
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / 5 if step < 5 else 1.0)
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
        final = self.runner("--resume", "killed", script, "name=killed")
        self.assertIn("done at 40", final.stdout)
        self.assertNotIn("start at 0", final.stdout)
        self.assert_same_state(reference, self.final_state("killed"))
        with sqlite3.connect(self.home / "index.db") as db:
            runs = db.execute("SELECT name, status FROM runs ORDER BY run").fetchall()
            kept = db.execute("SELECT c.step FROM checkpoints c JOIN runs r USING (run) WHERE r.name = 'killed' "
                              "AND c.kept ORDER BY c.step").fetchall()
        self.assertEqual(runs, [("straight", "finished"), ("killed", "finished")])
        self.assertEqual(kept, [(36,), (40,)])  # keep_last = 2
        self.assertFalse(self.checkpoint_dir("killed", 32).exists())

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

        def small_disk():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (biggest // 2, biggest // 2))

        # stop policy: the run fails with the cause; the previous checkpoint and nothing else is on disk.
        failed = self.runner("--resume", "full", script, "name=full", "steps=8", "every=2", check=1,
                             preexec_fn=small_disk)
        self.assertRegex(failed.stderr, r"checkpoint checkpoints/step-00000(06|08) could not be saved: .*File too large.* "
                                        r"\(the previous checkpoint is intact\)")
        self.assertEqual({p.name: p.read_bytes() for p in first.iterdir()}, before)
        leftovers = [p.name for p in (self.home / "full" / "checkpoints").iterdir() if p.name.startswith(".")]
        self.assertEqual(leftovers, [])
        # continue policy: the run goes on and finishes, reporting each failed save.
        going = self.runner("--resume", "full", script, "name=full", "steps=8", "every=2", "on_error=continue",
                            check=0, preexec_fn=small_disk)
        self.assertIn("the run continues; the previous checkpoint is intact", going.stderr)
        self.assertIn("done at 8", going.stdout)
