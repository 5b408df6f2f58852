"""Data-parallel training over c10d Gloo on the CPU: 2 ranks against 1 process, the launcher's report when a
rank dies and the resume after it, torchrun and a Slurm environment, and runner.dist's collectives."""
import ctypes
import json
import os
import pathlib
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file

from ports import free_port
from runner_process import RUNNER, RunnerHomeTest


class GlooOnTheCpu(RunnerHomeTest):
    """Ranks on the CPU also on a GPU host (one GPU cannot hold two NCCL ranks)."""

    def setUp(self):
        super().setUp()
        self.env = {**self.env, "CUDA_VISIBLE_DEVICES": ""}

# A small UNet on the shapes with every part of the trainer: global batch 8, accumulation 2, AdamW, warmup,
# clipping, EMA; no dropout by default (its masks come from each rank's own generator, so ranks and one process
# draw different ones). Rank 0 writes the losses, gradient norms and weights. A rank can kill itself with SIGKILL
# at a step (die_rank / die_step). clip = 0 turns clipping off. replace_grads = true makes the loss function drop
# one .grad before each step's first micro-batch and replace another by a copy before the second; `live` records
# after each step whether a .grad read after the first step is still that parameter's gradient.
TRAIN = """
local cfg = config { steps = 20, die_rank = -1, die_step = -1, out = "result.safetensors", seed = 5, dropout = 0.0,
                     overlap = true, optimizer = "adamw", lr = 2e-3, clip = 0.05, replace_grads = false,
                     shard = "none", objective = "ddpm", amp = "fp32" }
local run = runner.start(cfg)
local shapes = runner.data.shapes { size = 8, count = 256, seed = 3 }
local loader = runner.data.loader(shapes, { batch = 8, shuffle = true, seed = 3, workers = 1 })
local function make() return nn.UNet { image = 8, channels = 8, mults = { 1, 2 }, blocks = 1, attention = {}, groups = 4, dropout = cfg.dropout } end
local model = make()
local ddpm = cfg.objective == "flow" and runner.diffusion.flow { seed = 3 } or runner.diffusion.gaussian { timesteps = 100, seed = 3 }
local train = runner.trainer { model = model, optimizer = { cfg.optimizer, lr = cfg.lr, weight_decay = 0.01 },
                               warmup = 5, clip = cfg.clip > 0 and cfg.clip or nil, ema = 0.9, ema_model = make(),
                               accumulate = 2, amp = cfg.amp, steps = cfg.steps, batch = 8, progress = false,
                               data_parallel = { overlap = cfg.overlap }, shard = cfg.shard }
run:restore { trainer = train, loader = loader, state = { ddpm = ddpm } }
local losses, norms, live = {}, {}, {}
local params, calls, held = model:parameters(), 0, nil
for batch in loader:iter { from = run.step, to = cfg.steps } do
  local out = train:step(batch, function(micro)
    calls = calls + 1
    if cfg.replace_grads and calls % 2 == 1 then params[1].grad = nil end
    if cfg.replace_grads and calls % 2 == 0 then params[#params - 1].grad = params[#params - 1].grad:clone() end
    return ddpm:loss(model, micro)
  end)
  losses[#losses + 1], norms[#norms + 1] = out.loss:item(), out.grad_norm:item()
  live[#live + 1] = held and held:equal(params[#params].grad) and 1 or 0
  held = held or params[#params].grad
  run:log { loss = out.loss }
  if run:every(4) then run:checkpoint() end
  if runner.dist.rank == cfg.die_rank and run.step == cfg.die_step then
    local pid = io.open("/proc/self/stat"):read("*n")
    os.execute("kill -9 " .. pid)
  end
end
run:checkpoint { wait = true }
local ema = train.ema:state_dict()  -- on every rank: a sharded EMA is gathered
local weights = train:model_state()  -- on every rank: weights sharded over the ranks are gathered
if runner.dist.is_main then
  local result = {}
  for name, t in pairs(weights) do result["model." .. name] = t end
  for name, t in pairs(ema) do result["ema." .. name] = t end
  result.losses = torch.tensor(losses, { dtype = "float64" })
  result.norms = torch.tensor(norms, { dtype = "float64" })
  if cfg.replace_grads then result.live = torch.tensor(live, { dtype = "float64" }) end
  torch.save(result, cfg.out)
end
print(string.format("rank %d of %d done at step %d", runner.dist.rank, runner.dist.world_size, run.step))
"""


class DataParallel(GlooOnTheCpu):
    def setUp(self):
        super().setUp()
        self.script("train.lua", TRAIN)
        self.env = {**self.env, "OMP_NUM_THREADS": "1", "RUNNER_DIST_TIMEOUT": "60"}

    def runs(self):
        with sqlite3.connect(self.home / "index.db") as db:
            return db.execute("SELECT name, status, step, world_size, error FROM runs ORDER BY rowid").fetchall()

    def assert_same_training(self, a, b, what):
        # fp32 sums over ranks and micro-batches in another order: equal to float rounding.
        torch.testing.assert_close(a["losses"], b["losses"], rtol=1e-5, atol=1e-7,
                                   msg=lambda m: f"{what}: losses: {m}")
        # The norms before clipping: AdamW and the clipping hide a gradient of the wrong scale from the weights.
        torch.testing.assert_close(a["norms"], b["norms"], rtol=1e-4, atol=1e-7,
                                   msg=lambda m: f"{what}: gradient norms: {m}")
        for name in a:
            if name != "live":
                torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{what}: {name}: {m}")

    def test_two_ranks_train_as_one_process_with_the_global_batch(self):
        self.runner("train.lua", "out=one.safetensors", check=0)
        result = self.runner("--nproc", "2", "--fresh", "train.lua", "out=two.safetensors", check=0)
        self.assertIn("rank 0 of 2 done at step 20", result.stdout)
        self.assertNotIn("rank 1 of 2", result.stdout, "only rank 0's output reaches the terminal")
        one, two = load_file(self.dir / "one.safetensors"), load_file(self.dir / "two.safetensors")
        self.assertEqual(len(one["losses"]), 20)
        self.assert_same_training(one, two, "2 ranks vs 1 process")
        runs = self.runs()
        self.assertEqual(len(runs), 2, "one run per job, not one per rank")
        self.assertEqual(runs[1][1:4], ("finished", 20, 2))
        with sqlite3.connect(self.home / "index.db") as db:
            hosts = [json.loads(row[0]) for row in db.execute("SELECT hosts FROM runs ORDER BY rowid")]
        self.assertEqual(hosts, [[socket.gethostname()]] * 2, "the hosts of all ranks, each once")

    def test_flow_matching_on_two_ranks_trains_as_one_process_also_under_bf16_autocast(self):
        # The flow's keyed draws (times, noise, label dropout) follow the sample, not the rank.
        self.runner("train.lua", "objective=flow", "out=one.safetensors", check=0)
        self.runner("--nproc", "2", "--fresh", "train.lua", "objective=flow", "out=two.safetensors", check=0)
        one, two = load_file(self.dir / "one.safetensors"), load_file(self.dir / "two.safetensors")
        self.assertEqual(len(one["losses"]), 20)
        self.assert_same_training(one, two, "flow matching, 2 ranks vs 1 process")
        # Under bf16 autocast the two ranks still agree with one process to bf16's precision, and the losses stay
        # those of the fp32 training to within it.
        self.runner("train.lua", "objective=flow", "amp=bf16", "out=one-bf16.safetensors", check=0)
        self.runner("--nproc", "2", "--fresh", "train.lua", "objective=flow", "amp=bf16", "out=two-bf16.safetensors",
                    check=0)
        one16, two16 = load_file(self.dir / "one-bf16.safetensors"), load_file(self.dir / "two-bf16.safetensors")
        self.assertTrue(torch.isfinite(two16["losses"]).all())
        torch.testing.assert_close(two16["losses"], one16["losses"], rtol=2e-2, atol=1e-3)
        torch.testing.assert_close(two16["losses"], one["losses"], rtol=5e-2, atol=1e-2)

    def test_sgd_without_clipping_steps_the_same_weights_on_two_ranks(self):
        # SGD moves the weights by the gradient itself: ranks that summed their gradients instead of averaging
        # them would move them twice as far.
        args = ("train.lua", "optimizer=sgd", "lr=0.05", "clip=0", "steps=6")
        self.runner(*args, "out=one.safetensors", check=0)
        self.runner("--nproc", "2", "--fresh", *args, "out=two.safetensors", check=0)
        one, two = load_file(self.dir / "one.safetensors"), load_file(self.dir / "two.safetensors")
        self.assertEqual(len(one["losses"]), 6)
        self.assert_same_training(one, two, "SGD, 2 ranks vs 1 process")

    def test_gradients_stay_in_their_buckets_and_a_replaced_grad_still_counts(self):
        # With data parallel every .grad is a view of its averaging bucket, the same tensor from step to step (one
        # process sets them to none at each step); a .grad a loss function drops or replaces by another tensor is
        # copied back into its bucket, so the numbers stay those of one process doing the same.
        args = ("train.lua", "replace_grads=true", "steps=6")
        self.runner(*args, "out=one.safetensors", check=0)
        self.runner("--nproc", "2", "--fresh", *args, "out=two.safetensors", check=0)
        one, two = load_file(self.dir / "one.safetensors"), load_file(self.dir / "two.safetensors")
        self.assertEqual(len(one["losses"]), 6)
        self.assert_same_training(one, two, "grads replaced by the loss function, 2 ranks vs 1 process")
        self.assertEqual(two["live"].tolist(), [0, 1, 1, 1, 1, 1], "a .grad read after step 1, after each step")
        self.assertEqual(one["live"].tolist(), [0] * 6, "one process: a new .grad each step")

    def kill_rank_1_at_step_10(self, out, *args):
        start = time.monotonic()
        failed = self.runner("--nproc", "2", "--fresh", "train.lua", "die_rank=1", "die_step=10", f"out={out}", *args)
        elapsed = time.monotonic() - start
        self.assertNotEqual(failed.returncode, 0)
        self.assertRegex(failed.stderr, r"runner: rank 1 of 2 \(pid \d+\) was killed by signal 9 \(SIGKILL\)")
        self.assertRegex(failed.stderr, r"runner: rank 0 (exited with status 1|was killed by signal \d+)")
        self.assertLess(elapsed, 60, "the other rank stops well within the collective timeout")
        name, status, step, world, error = self.runs()[-1]
        self.assertEqual((status, step, world), ("failed", 10, 2), error)
        self.assertIn("failed", error)
        return name

    def test_a_killed_rank_stops_the_job_and_the_run_resumes_at_any_world_size(self):
        self.runner("--nproc", "2", "train.lua", "out=whole.safetensors", check=0)
        whole = load_file(self.dir / "whole.safetensors")
        # Continued with 2 ranks from the checkpoint at step 8: ends where the uninterrupted run ends, bit for bit.
        name = self.kill_rank_1_at_step_10("resumed.safetensors")
        resumed = self.runner("--nproc", "2", "--resume", name, "train.lua", "out=resumed.safetensors", check=0)
        self.assertIn("rank 0 of 2 done at step 20", resumed.stdout)
        again = load_file(self.dir / "resumed.safetensors")
        for key in ("losses", "norms"):
            self.assertTrue(torch.equal(again[key], whole[key][8:]), f"the {key} after the resume")
        for key in whole:
            if key not in ("losses", "norms"):
                self.assertTrue(torch.equal(again[key], whole[key]), key)
        self.assertEqual(self.runs()[-1][1:3], ("finished", 20))
        # Continued by one process: the same global batches, to the same step.
        name = self.kill_rank_1_at_step_10("single.safetensors")
        single = self.runner("--resume", name, "train.lua", "out=single.safetensors", check=0)
        self.assertIn("rank 0 of 1 done at step 20", single.stdout)
        self.assertIn("saved by 2 ranks, continuing with 1: the sample order and the keyed noise streams continue "
                      "exactly, but each rank's default random generator", single.stderr)
        self.assertEqual(self.runs()[-1][1:4], ("finished", 20, 1))
        self.assert_same_training(load_file(self.dir / "single.safetensors"), again, "resumed by 1 process")
        # Each attempt keeps its world size and the steps it ran.
        self.assertIn(f"attempt 2 of run {name} changes the config: die_rank 1 -> -1, die_step 10 -> -1; the world "
                      "size: 2 -> 1", single.stderr)
        with sqlite3.connect(self.home / "index.db") as db:
            attempts = db.execute("SELECT a.status, a.world_size, a.start_step, a.end_step FROM attempts a JOIN runs r "
                                  "USING (run) WHERE r.name = ? ORDER BY a.attempt", (name,)).fetchall()
        self.assertEqual(attempts, [("failed", 2, 0, 10), ("finished", 1, 8, 20)])

    def test_sharded_modes_train_as_unsharded_data_parallel_and_resume_at_any_world_size(self):
        self.runner("--nproc", "2", "train.lua", "out=whole.safetensors", check=0)
        whole = load_file(self.dir / "whole.safetensors")
        def checkpoint():
            with sqlite3.connect(self.home / "index.db") as db:
                run_dir = db.execute("SELECT dir FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()[0]
            return self.home / run_dir / "checkpoints/step-0000020"

        unsharded_state = load_file(checkpoint() / "optimizer.safetensors")
        unsharded_ema = load_file(checkpoint() / "ema.safetensors")
        for mode, zero in (("optimizer", "ZeRO-1"), ("gradients", "ZeRO-2"), ("weights", "ZeRO-3")):
            run = self.runner("--nproc", "2", "--fresh", "train.lua", f"shard={mode}", f"out={mode}.safetensors",
                              check=0)
            self.assertIn(f"sharded data parallel: shard {mode} ({zero}), model state ", run.stderr)
            shown = self.runner("show", "last", check=0).stdout
            self.assertRegex(shown, rf"shard\s+{mode}\n")
            self.assertRegex(shown, r"model_state_mb_per_rank\s+0\.\d+")
            sharded = load_file(self.dir / f"{mode}.safetensors")
            # PyTorch's FSDP2-versus-DDP tolerance: the gradient norm sums the ranks' squares in another order.
            for key in whole:
                torch.testing.assert_close(sharded[key], whole[key], rtol=1.3e-6, atol=1e-5,
                                           msg=lambda m: f"shard={mode}: {key}: {m}")
            # Each rank saved its rows of the optimizer state and the EMA (sharded over the weights, of the model too);
            # consolidated, they are the files unsharded training saves.
            self.assertEqual(sorted(p.name for p in checkpoint().iterdir()),
                             ["manifest.json"] + ([] if mode == "weights" else ["model.safetensors"]) +
                             ["shard-0-of-2.safetensors", "shard-1-of-2.safetensors", "trainer.safetensors"])
            done = self.runner("consolidate", "last", "-o", f"{mode}-whole", check=0)
            files = ("model.safetensors, optimizer.safetensors, ema.safetensors" if mode == "weights" else
                     "optimizer.safetensors, ema.safetensors, model.safetensors")
            self.assertRegex(done.stdout, rf"^{mode}-whole: {files}, trainer.safetensors of run \S+ \(\w+\) step 20, "
                                          r"whole\n$")
            consolidated = load_file(self.dir / f"{mode}-whole/model.safetensors")
            for key in consolidated:
                self.assertTrue(torch.equal(consolidated[key], sharded["model." + key]), f"shard={mode}: model {key}")
            # runner.load_run reads the EMA from the rank files: the consolidated one.
            self.script("load.lua", """
                local loaded = runner.load_run("last", { device = "cpu" })
                torch.save(loaded.model:state_dict(), "loaded.safetensors")
            """)
            self.runner("load.lua", check=0)
            loaded, whole_ema = load_file(self.dir / "loaded.safetensors"), load_file(self.dir / f"{mode}-whole/ema.safetensors")
            self.assertEqual(sorted(loaded), sorted(whole_ema))
            for key in loaded:
                self.assertTrue(torch.equal(loaded[key], whole_ema[key]), f"shard={mode}: load_run's EMA {key}")
            for name, unsharded in (("optimizer", unsharded_state), ("ema", unsharded_ema)):
                state = load_file(self.dir / f"{mode}-whole" / f"{name}.safetensors")
                self.assertEqual(sorted(state), sorted(unsharded))
                for key in state:
                    torch.testing.assert_close(state[key], unsharded[key], rtol=1.3e-6, atol=1e-5,
                                               msg=lambda m: f"shard={mode}: checkpoint {name} {key}: {m}")
        gradients = load_file(self.dir / "gradients.safetensors")
        # Killed and resumed at the same world size and mode: bit for bit.
        name = self.kill_rank_1_at_step_10("resumed.safetensors", "shard=gradients")
        self.runner("--nproc", "2", "--resume", name, "train.lua", "shard=gradients", "out=resumed.safetensors", check=0)
        again = load_file(self.dir / "resumed.safetensors")
        for key in gradients:
            self.assertTrue(torch.equal(again[key], gradients[key][8:] if key in ("losses", "norms") else gradients[key]),
                            f"resumed sharded run: {key}")
        # Sharded over the weights too: the rank files hold the model's rows, and the run continues bit for bit.
        weights = load_file(self.dir / "weights.safetensors")
        name = self.kill_rank_1_at_step_10("resumed-weights.safetensors", "shard=weights")
        self.runner("--nproc", "2", "--resume", name, "train.lua", "shard=weights", "out=resumed-weights.safetensors",
                    check=0)
        again_weights = load_file(self.dir / "resumed-weights.safetensors")
        for key in weights:
            self.assertTrue(torch.equal(again_weights[key], weights[key][8:] if key in ("losses", "norms") else
                                        weights[key]), f"resumed run sharded over the weights: {key}")
        # The same sharded checkpoint continued by one process, unsharded: the same training to float rounding.
        name = self.kill_rank_1_at_step_10("single.safetensors", "shard=gradients")
        single = self.runner("--resume", name, "train.lua", "out=single.safetensors", check=0)
        self.assertIn("rank 0 of 1 done at step 20", single.stdout)
        self.assertIn("saved with shard gradients by 2 ranks, continuing with shard none on 1: each rank takes its rows "
                      "of the saved optimizer state and EMA", single.stderr)
        self.assert_same_training(load_file(self.dir / "single.safetensors"), again, "sharded, resumed by 1 process")
        # A checkpoint without one of its rank files is skipped as damaged, naming the file, and is not consolidated.
        name = self.kill_rank_1_at_step_10("damaged.safetensors", "shard=gradients")
        with sqlite3.connect(self.home / "index.db") as db:
            run_dir = db.execute("SELECT dir FROM runs WHERE name = ?", (name,)).fetchone()[0]
        (self.home / run_dir / "checkpoints/step-0000008/shard-1-of-2.safetensors").unlink()
        refused = self.runner("consolidate", name, "--step", "8", "-o", "damaged-whole")
        self.assertEqual(refused.returncode, 1)
        self.assertIn(f"run {name}: its checkpoint is damaged: checkpoints/step-0000008: shard-1-of-2.safetensors: "
                      "missing", refused.stderr)
        self.assertFalse((self.dir / "damaged-whole").exists())
        resumed = self.runner("--nproc", "2", "--resume", name, "train.lua", "shard=gradients", check=0)
        self.assertIn("checkpoints/step-0000008: shard-1-of-2.safetensors: missing", resumed.stderr)

    def test_a_dit_sharded_over_the_weights_trains_as_unsharded_and_its_weights_are_not_read_between_steps(self):
        # A class-conditional DiT with activation checkpointing: each block's weights gathered for its forward and
        # again for its recomputation in the backward; the numbers are unsharded data parallel's.
        self.script("dit.lua", """
            local cfg = config { shard = "none", out = "dit.safetensors", peek = false, seed = 5, amp = "fp32",
                                 gather = "fp32" }
            runner.start(cfg)
            local model = nn.DiT { depth = 3, hidden = 32, heads = 2, patch = 2, image = 8, in_channels = 4,
                                   classes = 5, checkpoint = true }
            local ddpm = runner.diffusion.gaussian { timesteps = 100, seed = 3 }
            local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1e-3 }, amp = cfg.amp,
                                           objective = ddpm:objective(model), shard = cfg.shard,
                                           shard_gather = cfg.gather, progress = false }
            local losses = {}
            for step = 1, 4 do
              torch.manual_seed(step * 10 + runner.dist.rank)
              local batch = { data = torch.randn({ 4, 4, 8, 8 }), label = torch.randint(0, 5, { 4 }) }
              losses[step] = train:step(batch).loss:item()
            end
            print(string.format("%d parameters", model:num_parameters()))  -- the shapes stay readable
            if cfg.peek then print(model:state_dict()) end
            local weights = train:model_state()
            print(string.format("weights held between steps: %d bytes", train:state_bytes().weights))
            if runner.dist.is_main then
              weights.losses = torch.tensor(losses, { dtype = "float64" })
              torch.save(weights, cfg.out)
            end
        """)
        whole = self.runner("--nproc", "2", "dit.lua", check=0)
        sharded = self.runner("--nproc", "2", "dit.lua", "shard=weights", "out=sharded.safetensors", check=0)
        self.assertIn("sharded data parallel: shard weights (ZeRO-3), model state ", sharded.stderr)
        expected, got = load_file(self.dir / "dit.safetensors"), load_file(self.dir / "sharded.safetensors")
        self.assertEqual(sorted(got), sorted(expected))
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=1.3e-6, atol=1e-5, msg=lambda m: f"{key}: {m}")
        # Under bf16 autocast too (each block's weights cast at each use, as unsharded): to bf16's rounding.
        self.runner("--nproc", "2", "dit.lua", "amp=bf16", "out=bf16.safetensors", check=0)
        self.runner("--nproc", "2", "dit.lua", "amp=bf16", "shard=weights", "out=bf16-sharded.safetensors", check=0)
        expected, got = load_file(self.dir / "bf16.safetensors"), load_file(self.dir / "bf16-sharded.safetensors")
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=1e-3, atol=1e-4, msg=lambda m: f"bf16 {key}: {m}")
        # Gathered in bf16 under bf16 autocast: the blocks' matmuls see the weights autocast gives them anyway; the
        # embeddings and the rounded updates move some weights by up to one AdamW step (lr 1e-3).
        rounded = self.runner("--nproc", "2", "dit.lua", "amp=bf16", "shard=weights", "gather=bf16",
                              "out=bf16-gathers.safetensors", check=0)
        self.assertIn("sharded data parallel: shard weights (ZeRO-3, bf16 gathers), model state ", rounded.stderr)
        got = load_file(self.dir / "bf16-gathers.safetensors")
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=1e-2, atol=1e-3, msg=lambda m: f"gathers {key}: {m}")
        # The blocks' weights are held as each rank's rows between steps: fewer bytes than whole.
        held = [int(n) for n in re.findall(r"weights held between steps: (\d+) bytes", sharded.stdout)]
        whole_bytes = int(re.search(r"weights held between steps: (\d+) bytes", whole.stdout).group(1))
        self.assertEqual(len(held), 1)  # rank 0's line; the other rank's output is not shown
        self.assertLess(held[0], whole_bytes * 0.75)
        # Reading the model's weights between steps is refused, naming the parameter and what to read instead.
        peek = self.runner("--nproc", "2", "dit.lua", "shard=weights", "peek=true")
        self.assertEqual(peek.returncode, 1)
        self.assertIn("dit.lua:17: this tensor is a model parameter that runner.trainer with shard = \"weights\" holds "
                      "only a share of on this rank between steps (its shape, device and gradient can be read, not its "
                      "values; train:model_state() gathers the model's weights, called on every rank)", peek.stderr)
        # A model built in Lua has no blocks to gather by: refused before the run trains.
        self.script("lua_model.lua", """
            runner.start(config {})
            local model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))
            runner.trainer { model = model, optimizer = { "adamw", lr = 1e-3 }, shard = "weights", progress = false }
        """)
        refused = self.runner("--nproc", "2", "lua_model.lua")
        self.assertEqual(refused.returncode, 1)
        self.assertIn("lua_model.lua:3: shard = \"weights\" needs a model whose forward gathers each block's weights: "
                      "nn.DiT or nn.UNet (a model built in Lua can use shard = \"gradients\")", refused.stderr)

    def test_a_sharded_ema_read_on_one_rank_fails_naming_the_gather(self):
        # Reading a sharded EMA gathers it from every rank: read on rank 0 alone, it fails with the collective's
        # name instead of hanging.
        self.script("one_rank.lua", TRAIN.replace("local ema = train.ema:state_dict()  -- on every rank: a sharded "
                                                  "EMA is gathered", "local ema = {}").replace(
            "for name, t in pairs(ema) do", "for name, t in pairs(train.ema:state_dict()) do"))
        failed = self.runner("--nproc", "2", "one_rank.lua", "shard=optimizer", "steps=2")
        self.assertNotEqual(failed.returncode, 0)
        self.assertIn("one_rank.lua:", failed.stderr)
        self.assertIn("EMA all_gather failed:", failed.stderr)
        self.assertEqual(self.runs()[-1][1], "failed")

    def test_dropout_resumes_bit_for_bit_and_overlap_does_not_change_the_numbers(self):
        # Each rank's generator (dropout masks) is saved in the checkpoint: a resume at the same world size
        # continues exactly. Averaging during the backward pass sums the same buckets as averaging after it.
        self.runner("--nproc", "2", "train.lua", "dropout=0.3", "out=whole.safetensors", check=0)
        self.runner("--nproc", "2", "--fresh", "train.lua", "dropout=0.3", "overlap=false", "out=after.safetensors",
                    check=0)
        whole, after = load_file(self.dir / "whole.safetensors"), load_file(self.dir / "after.safetensors")
        for key in whole:
            self.assertTrue(torch.equal(whole[key], after[key]), f"overlapped vs after the backward pass: {key}")
        name = self.kill_rank_1_at_step_10("resumed.safetensors", "dropout=0.3")
        resumed = self.runner("--nproc", "2", "--resume", name, "train.lua", "dropout=0.3", "out=resumed.safetensors",
                              check=0)
        self.assertNotIn("continuing with", resumed.stderr)
        again = load_file(self.dir / "resumed.safetensors")
        for key in ("losses", "norms"):
            self.assertTrue(torch.equal(again[key], whole[key][8:]), f"the {key} after the resume")
        for key in whole:
            if key not in ("losses", "norms"):
                self.assertTrue(torch.equal(again[key], whole[key]), key)
        self.assertEqual(self.runs()[-1][1:4], ("finished", 20, 2))

    def test_torchrun_and_a_slurm_environment_train_the_same(self):
        self.runner("--nproc", "2", "train.lua", "out=launcher.safetensors", check=0)
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        result = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", RUNNER, "--fresh",
                                 "train.lua", "out=torchrun.safetensors"], cwd=self.dir, env=self.env,
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assert_same_training(load_file(self.dir / "launcher.safetensors"),
                                  load_file(self.dir / "torchrun.safetensors"), "torchrun vs runner --nproc")
        # srun sets these for each task; the rendezvous host is the job's first node, the port from the job id.
        procs = []
        for rank in range(2):
            env = {**self.env, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
                   "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": str(os.getpid())}
            procs.append(subprocess.Popen([RUNNER, "--fresh", "train.lua", "out=slurm.safetensors"], cwd=self.dir,
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(outputs))
        self.assert_same_training(load_file(self.dir / "launcher.safetensors"),
                                  load_file(self.dir / "slurm.safetensors"), "Slurm vs runner --nproc")
        self.assertEqual([r[3] for r in self.runs()], [2, 2, 2])


    def test_the_quickstart_trains_to_the_end_on_two_simulated_nodes_under_torchrun(self):
        # Sharded (ZeRO-2): the examples read the EMA on every rank, which gathers it.
        port = free_port()
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        quickstart = os.path.join(os.environ.get("RUNNER_SOURCE", "../.."), "experiments", "quickstart.lua")
        nodes = [subprocess.Popen([torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                                   "--master-addr", "127.0.0.1", "--master-port", str(port), "--no-python", RUNNER,
                                   quickstart, "steps=6", "sample_every=6", "checkpoint_every=3", "metric_samples=16",
                                   "sample_steps=5", "shard=gradients"],
                                  cwd=self.dir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for node in range(2)]
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
        self.assertEqual([node.returncode for node in nodes], [0, 0], "\n".join(outputs))
        self.assertIn("sample quality (sliced Wasserstein distance to real shapes", outputs[0])
        # 1.11M parameters: the gradients, AdamW's moments and the EMA halved over 2 ranks, the weights whole.
        self.assertIn("sharded data parallel: shard gradients (ZeRO-2), model state 13.4 MB per rank (weights 4.5, "
                      "gradients 2.2, optimizer 4.5, EMA 2.2)", outputs[0])
        self.assertEqual([r[1:4] for r in self.runs()], [("finished", 6, 2)])


class Console(GlooOnTheCpu):
    """What a data-parallel job says on the console: the ranks and the batch split, what --nproc auto chose, no c10d
    error under torchrun, the other ranks' silence about files only rank 0 writes, and the global batch in --help."""

    def setUp(self):
        super().setUp()
        self.env = {**self.env, "OMP_NUM_THREADS": "1", "RUNNER_DIST_TIMEOUT": "60"}

    def test_rank_0_says_once_how_many_ranks_there_are_and_how_the_global_batch_splits(self):
        self.script("train.lua", TRAIN)
        two = self.runner("--nproc", "2", "train.lua", "steps=2", check=0)
        self.assertEqual(re.findall(r"\[info\] (data parallel: .*)", two.stdout + two.stderr),
                         ["data parallel: 2 ranks, global batch 8 = 2 x 4 (2 micro-batches of 2 per rank)"])
        one = self.runner("--fresh", "train.lua", "steps=2", check=0)
        self.assertNotIn("data parallel", one.stdout + one.stderr)

    def test_nproc_auto_on_a_cpu_host_says_what_it_chose(self):
        self.script("ranks.lua", 'print(string.format("rank %d of %d", runner.dist.rank, runner.dist.world_size))')
        result = self.runner("--nproc", "auto", "ranks.lua", check=0)
        cores = os.cpu_count()
        self.assertEqual(result.stderr, "runner: --nproc auto: no GPU is visible, so 1 rank on the CPU (auto starts one "
                                        "rank per GPU; --nproc N starts N ranks that share this host's "
                                        f"{cores} CPU core{'' if cores == 1 else 's'})\n")
        self.assertEqual(result.stdout, "rank 0 of 1\n")

    def test_torchrun_shows_no_c10d_error_about_the_store_its_agent_serves(self):
        # torchrun's agent serves the TCPStore at MASTER_PORT: a rank 0 that tried to serve it too had c10d log
        # "[E... TCPStore.cpp:...] [c10d] The server socket on PORT has failed to bind. TORCHELASTIC_USE_AGENT_STORE
        # is enabled so ignoring the error."
        self.script("ranks.lua", """
            runner.dist.barrier()
            print(string.format("rank %d of %d", runner.dist.rank, runner.dist.world_size))
            """)
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        result = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", RUNNER, "ranks.lua"],
                                cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stderr, "")
        self.assertEqual(sorted(result.stdout.splitlines()), ["rank 0 of 2", "rank 1 of 2"])

    def test_only_rank_0_of_the_quickstart_draws_metric_samples_and_prints_the_paths_it_writes(self):
        # Two ranks as torchrun starts them, each with its own output; sharded (ZeRO-1): rank 1 says nothing of it.
        port = free_port()
        quickstart = os.path.join(os.environ.get("RUNNER_SOURCE", "../.."), "experiments", "quickstart.lua")
        procs = []
        for rank in range(2):
            env = {**self.env, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            procs.append(subprocess.Popen([RUNNER, quickstart, "steps=4", "sample_every=2", "checkpoint_every=2",
                                           "metric_samples=16", "sample_steps=3", "channels=8", "shard=optimizer"],
                                          cwd=self.dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        (out0, err0), (out1, err1) = [p.communicate(timeout=300) for p in procs]
        self.assertEqual([p.returncode for p in procs], [0, 0], out0 + err0 + out1 + err1)
        self.assertIn("[info] data parallel: 2 ranks, global batch 32 = 2 x 16\n", err0)
        images = self.home / "quickstart-1" / "images"
        self.assertRegex(out0, rf"step     2  samples: {re.escape(str(images))}/samples-0000002\.png  sliced Wasserstein "
                               r"to real shapes: \d\.\d{4} \(real to real: \d\.\d{4}\)\n")
        self.assertIn(f"sample grids in {images} (runner show quickstart-1, runner report quickstart-1)\n", out0)
        # Rank 1 says what it trains, then nothing: no samples drawn, no path of a file rank 0 writes.
        self.assertEqual(out1.splitlines()[-1], "0.07M parameters on cpu; 4 steps of batch 32")
        self.assertNotIn(str(self.home), out1 + err1)
        self.assertNotIn("samples", out1)
        self.assertEqual(err1, "")

    def test_help_and_readme_say_the_batch_is_global_so_the_learning_rate_does_not_scale_with_the_ranks(self):
        self.assertIn("  --nproc N|auto      data parallel on this host: start N ranks of the script (auto: one per "
                      "GPU); the\n                      loader's batch is the global batch, each rank takes 1/N of it, "
                      "so the learning rate\n                      stays what it is for that batch at any N; see \"Data "
                      "parallel\" in the README\n", self.runner("--help", check=0).stdout)
        readme = pathlib.Path(os.environ.get("RUNNER_SOURCE", "../..")) / "README.md"
        self.assertIn("Because the batch is global, the learning rate does not scale with the number of GPUs",
                      " ".join(readme.read_text().split()))


class Collectives(GlooOnTheCpu):
    def test_all_reduce_broadcast_all_gather_and_barrier(self):
        self.script("collectives.lua", """
            local d = runner.dist
            local x = torch.tensor({ d.rank + 1, 10 * (d.rank + 1) })
            d.all_reduce(x)
            local m = d.all_reduce(torch.tensor({ d.rank + 1.0 }), "mean")
            local hi = d.all_reduce(torch.tensor({ d.rank }), "max")
            local b = d.broadcast(torch.tensor({ d.rank + 7 }), math.min(1, d.world_size - 1))
            local g = torch.cat(d.all_gather(torch.tensor({ d.rank, d.rank })))
            d.barrier()
            print(string.format("rank %d/%d main=%s sum=%s mean=%s max=%s bcast=%s gather=%s", d.rank, d.world_size,
              tostring(d.is_main), table.concat(x:tolist(), ","), m:item(), hi:item(), b:item(),
              table.concat(g:tolist(), ",")))
            """)
        env = {**self.env, "OMP_NUM_THREADS": "1"}
        # 3 ranks on a 2-core host: --oversubscribe
        result = subprocess.run([RUNNER, "--nproc", "3", "--oversubscribe", "collectives.lua"], cwd=self.dir,
                                env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "rank 0/3 main=true sum=6,60 mean=2 max=2 bcast=8 gather=0,0,1,1,2,2")
        single = self.runner("collectives.lua", check=0)
        self.assertEqual(single.stdout.strip(), "rank 0/1 main=true sum=1,10 mean=1 max=0 bcast=7 gather=0,0")

    def test_usage_errors(self):
        self.script("noop.lua", "print(1)")
        bad = self.runner("--nproc", "zero", "noop.lua", check=2)
        self.assertIn("runner: --nproc must be a whole number >= 1 or auto, got 'zero'", bad.stderr)
        empty = self.runner("--nproc", "", "noop.lua", check=2)
        self.assertIn("runner: --nproc needs a value: a whole number >= 1 or auto, got ''", empty.stderr)
        self.assertEqual(empty.stdout, "")  # the script did not run
        many = self.runner("--nproc", "1000", "noop.lua", check=2)
        self.assertIn(f"runner: --nproc 1000 is more ranks than this host's {os.cpu_count()} CPU cores (ranks on the CPU "
                      "share them); --oversubscribe starts them anyway", many.stderr)
        self.assertIn("--oversubscribe goes with --nproc N", self.runner("--oversubscribe", "noop.lua", check=2).stderr)
        nested = subprocess.run([RUNNER, "--nproc", "2", "noop.lua"], cwd=self.dir, capture_output=True, text=True,
                                env={**self.env, "RANK": "0", "WORLD_SIZE": "2"}, timeout=60)
        self.assertEqual(nested.returncode, 2)
        self.assertIn("--nproc starts its own ranks", nested.stderr)
        uneven = self.script("uneven.lua", """
            local ds = runner.data.shapes { size = 4, count = 16 }
            runner.data.loader(ds, { batch = 5 })
            """)
        result = self.runner("--nproc", "2", uneven)
        self.assertEqual(result.returncode, 1)
        self.assertIn("loader: batch 5 (the global batch of all ranks) does not split evenly over 2 ranks", result.stderr)
        # Both ranks fail on their own at once: the report names the one whose failure report is the earlier.
        self.assertRegex(result.stderr, r"runner: rank [01] of 2 \(pid \d+\) exited with status 1")


# A tiny model trained by 2 ranks; rank `bad_rank` raises an error (or stops itself with SIGSTOP: hang = true) before
# step `bad_step`. Each rank writes the step it is at into steps-<rank>.txt; rank 0 prints it.
RANK_FAILS = """
local cfg = config { steps = 8, bad_rank = -1, bad_step = 3, hang = false, step_seconds = 0.0, seed = 1 }
local run = runner.start(cfg)
local model = nn.Linear(4, 2)
local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.1 }, steps = cfg.steps, batch = 4,
                               progress = false }
run:restore { trainer = train }
while run.step < cfg.steps do
  if runner.dist.rank == cfg.bad_rank and run.step + 1 == cfg.bad_step then
    if cfg.hang then os.execute("kill -STOP " .. io.open("/proc/self/stat"):read("*n")) end
    error(string.format("rank %d broke before step %d", runner.dist.rank, run.step + 1))
  end
  local x = torch.randn(2, 4)
  train:step(function() return model(x):pow(2):mean() end)
  local steps = io.open(string.format("steps-%d.txt", runner.dist.rank), "w")
  steps:write(run.step)
  steps:close()
  if runner.dist.is_main then print("step " .. run.step) end
  local busy = os.clock() + cfg.step_seconds
  while os.clock() < busy do end
end
"""


class RankFailures(GlooOnTheCpu):
    """The rank that failed first is the one named and recorded; the ranks outlive their launcher."""

    def setUp(self):
        super().setUp()
        self.script("fails.lua", RANK_FAILS)
        self.env = {**self.env, "OMP_NUM_THREADS": "1"}

    def last_run(self):
        with sqlite3.connect(self.home / "index.db") as db:
            return db.execute("SELECT name, status, step, error FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()

    def test_the_rank_whose_error_came_first_is_named_and_recorded_not_the_rank_its_failure_broke(self):
        # Rank 1's error ends its process; rank 0's all_reduce then fails with "Connection closed by peer", often
        # before the launcher sees rank 1 end. Each rank's own report says which came first.
        failed = self.runner("--nproc", "2", "fails.lua", "bad_rank=1", check=1)
        self.assertRegex(failed.stderr, r"runner: rank 1 of 2 \(pid \d+\) exited with status 1, the first rank to fail: "
                                        r"fails\.lua:10: rank 1 broke before step 3; its last lines:\n"
                                        r"\[rank 1\] fails\.lua:10: rank 1 broke before step 3\n")
        self.assertRegex(failed.stderr, r"runner: rank 0 exited with status 1 after the failure, as a consequence: "
                                        r"fails\.lua:13: all_reduce failed: ")
        name, status, step, error = self.last_run()
        self.assertEqual((status, step), ("failed", 2))
        self.assertTrue(error.startswith("rank 1 of 2 failed first: fails.lua:10: rank 1 broke before step 3\n"
                                         "stack traceback:\n\tfails.lua:10: in main chunk\n"
                                         "rank 0, as a consequence: fails.lua:13: all_reduce failed: "), error)
        shown = self.runner("show", name, check=0)
        self.assertIn("error     rank 1 of 2 failed first: fails.lua:10: rank 1 broke before step 3\n", shown.stdout)
        self.runner("report", name, "-o", "report.html", check=0)
        self.assertIn("rank 1 of 2 failed first: fails.lua:10: rank 1 broke before step 3", (self.dir / "report.html").read_text())
        # Rank 0 failing first is recorded with its own error, as in one process.
        failed = self.runner("--nproc", "2", "--fresh", "fails.lua", "bad_rank=0", check=1)
        self.assertRegex(failed.stderr, r"runner: rank 0 of 2 \(pid \d+\) exited with status 1, the first rank to fail: "
                                        r"fails\.lua:10: rank 0 broke before step 3\n"
                                        r"runner: rank 1 exited with status 1 after the failure, as a consequence: "
                                        r"fails\.lua:13: all_reduce failed: ")
        self.assertEqual(self.last_run()[1:], ("failed", 2, "fails.lua:10: rank 0 broke before step 3\nstack traceback:"
                                                            "\n\tfails.lua:10: in main chunk"))

    def test_ranks_whose_weights_differ_stop_with_the_checksums_at_the_steps_check_or_a_checkpoint(self):
        # Rank 1 adds 1 to the 2 biases after the trainer gave every rank rank 0's weights: the checksums of the
        # weights (compared at step 1, every 100 steps and at each checkpoint) differ by 2.
        self.script("diverge.lua", """
            local cfg = config { steps = 3, change_before = 1, checkpoint_at = 0 }
            local run = runner.start(cfg)
            local model = nn.Linear(4, 2)
            local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.1 }, steps = cfg.steps, batch = 4,
                                           progress = false }
            run:restore { trainer = train }
            for step = 1, cfg.steps do
              if runner.dist.rank == 1 and step == cfg.change_before then
                torch.no_grad(function() model.bias:add_(1) end)
              end
              train:step(function() return model(torch.ones(2, 4)):pow(2):mean() end)
              if step == cfg.checkpoint_at then run:checkpoint() end
            end
            print("rank " .. runner.dist.rank .. " trained " .. cfg.steps .. " steps")
            """)
        same = self.runner("--nproc", "2", "diverge.lua", "change_before=0", "checkpoint_at=2", check=0)
        self.assertIn("rank 0 trained 3 steps", same.stdout)
        # The check in step 1 fails that step (the run stays at step 0); a checkpoint's, after step 3, fails at 3.
        cases = {"the step's check": (("change_before=1",), 1, 0, r"diverge\.lua:11"),
                 "a checkpoint's check": (("change_before=2", "checkpoint_at=3"), 3, 3, r"diverge\.lua:12")}
        for case, (args, step, recorded, where) in cases.items():
            with self.subTest(case):
                failed = self.runner("--nproc", "2", "--fresh", "diverge.lua", *args, check=1)
                message = (rf"the ranks' weights differ after step {step} \(parameter checksums from (-?[\d.e+-]+) to "
                           r"(-?[\d.e+-]+); rank [01] has -?[\d.e+-]+\): something made a rank train differently \(a "
                           r"rank-dependent model change, or a step skipped on one rank\)")
                first = re.search(rf"runner: rank [01] of 2 \(pid \d+\) exited with status 1, the first rank to fail: "
                                  rf"{where}: {message}", failed.stderr)
                self.assertIsNotNone(first, failed.stderr)
                low, high = float(first[1]), float(first[2])
                self.assertAlmostEqual(high - low, 2, places=4, msg=failed.stderr)
                name, status, at, error = self.last_run()
                self.assertEqual((status, at), ("failed", recorded), error)
                self.assertRegex(error, message)

    def test_a_hung_rank_is_named_not_the_rank_whose_collective_timed_out_waiting_for_it(self):
        env = {**self.env, "RUNNER_DIST_TIMEOUT": "2"}
        failed = subprocess.run([RUNNER, "--nproc", "2", "fails.lua", "bad_rank=1", "hang=true"], cwd=self.dir, env=env,
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(failed.returncode, 1, failed.stderr)
        self.assertRegex(failed.stderr, r"runner: rank 1 of 2 \(pid \d+\) did not take part in all_reduce for 2 s \(hung "
                                        r"or stopped\): rank 0 timed out waiting for it; then it ")
        self.assertRegex(failed.stderr, r"runner: rank 0 exited with status 1 after the failure, as a consequence: "
                                        r"fails\.lua:13: all_reduce failed: .*Timed out")
        name, status, step, error = self.last_run()
        self.assertEqual((status, step), ("failed", 2))
        self.assertTrue(error.startswith("rank 1 of 2 did not take part in all_reduce for 2 s (hung or stopped): rank 0 "
                                         "timed out waiting at fails.lua:13\n"
                                         "rank 0, as a consequence: fails.lua:13: all_reduce failed: "), error)

    def test_the_ranks_outlive_a_killed_launcher_and_stop_after_the_same_step_with_one_checkpoint(self):
        # kill -9 of the launcher closes the pipe of rank 1's output: rank 1 goes on without it (no SIGPIPE), and
        # the SIGTERM each rank gets at its parent's death stops both after the same step, with one checkpoint.
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36  # the ranks become this process's children when the launcher dies
        self.assertEqual(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0)
        try:
            # TMPDIR: the killed launcher leaves its directory for the ranks' failure reports behind.
            launcher = subprocess.Popen([RUNNER, "--nproc", "2", "fails.lua", "steps=500", "step_seconds=0.02"],
                                        cwd=self.dir, env={**self.env, "TMPDIR": str(self.dir)},
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in launcher.stdout:
                if line.startswith("step 5"):
                    break
            ranks = [int(pid) for pid in
                     pathlib.Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()]
            self.assertEqual(len(ranks), 2)
            launcher.kill()
            launcher.wait()
            statuses = {}
            deadline = time.monotonic() + 60
            while len(statuses) < 2 and time.monotonic() < deadline:
                for pid in ranks:
                    if pid not in statuses:
                        done, status = os.waitpid(pid, os.WNOHANG)
                        if done:
                            statuses[pid] = status
                time.sleep(0.05)
            output = launcher.stdout.read()
            launcher.stdout.close()
        finally:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        self.assertEqual([os.waitstatus_to_exitcode(statuses.get(pid, -1)) for pid in ranks], [0, 0], output)
        name, status, step, error = self.last_run()
        self.assertEqual((status, error), ("interrupted", f"stopped by SIGTERM at step {step} after saving a checkpoint"))
        self.assertEqual([(self.dir / f"steps-{r}.txt").read_text() for r in range(2)], [str(step)] * 2)
        with sqlite3.connect(self.home / "index.db") as db:
            checkpoints = db.execute("SELECT step FROM checkpoints WHERE run = (SELECT run FROM runs WHERE name = ?)",
                                     (name,)).fetchall()
        self.assertEqual(checkpoints, [(step,)])
