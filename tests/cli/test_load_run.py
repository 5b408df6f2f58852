"""runner.load_run: a finished run's model rebuilt by its own script with a checkpoint's EMA (or raw) weights, its
config and its objective, read-only: the same weights and samples as the run itself had, nothing written. runner
sample RUN: its samples drawn batch by batch over any number of ranks, resumable, written and recorded."""
import json
import sqlite3

import numpy
import torch
from safetensors.torch import load_file

from runner_process import RunnerHomeTest

# A small class-conditional UNet trained by DDPM with an EMA; at the end the script samples from its EMA model
# and saves the samples and the EMA's weights.
TRAIN = """
local cfg = config { steps = 6, seed = 4, lr = 2e-3 }
local diffusion = runner.diffusion.gaussian { timesteps = 50 }
local run = runner.start(cfg)
local shapes = runner.data.shapes { size = 8, count = 64, seed = 3 }
local loader = runner.data.loader(shapes, { batch = 8, shuffle = true, seed = 3 })
local function make() return nn.UNet { image = 8, channels = 8, mults = { 1, 2 }, blocks = 1, attention = {}, groups = 4,
                                       classes = 3 } end
local model = make()
local train = runner.trainer { model = model, optimizer = { "adamw", lr = cfg.lr }, objective = diffusion:objective(model),
                               ema = 0.5, ema_model = make(), steps = cfg.steps, batch = 8, progress = false }
run:restore { trainer = train, loader = loader, state = { diffusion = diffusion } }
for batch in loader:iter { from = run.step, to = cfg.steps } do
  train:step(batch)
  if run:every(3) then run:checkpoint() end
end
run:checkpoint { wait = true }
local ema = train.ema
local samples = diffusion:sample(ema, { labels = { 0, 1, 2, 1 }, steps = 5, seed = 9 })
local out = { samples = samples }
for name, t in pairs(ema:state_dict()) do out["ema." .. name] = t end
torch.save(out, "trained.safetensors")
"""

LOAD = """
cfg = "the caller's"  -- a global of the caller that the run's script (which sets `local cfg`) must not touch
local loaded = runner.load_run(arg[1] or "last", { device = "cpu", checkpoint = tonumber(arg[2]),
                                                   ema = arg[3] ~= "raw" })
local out = { samples = loaded.objective:sample(loaded.model, { labels = { 0, 1, 2, 1 }, steps = 5, seed = 9 }) }
for name, t in pairs(loaded.model:state_dict()) do out["ema." .. name] = t end
torch.save(out, "loaded.safetensors")
print(string.format("%s step %d lr %g ema %s training %s cfg %s config %s run %s", loaded.run.name, loaded.step,
                    loaded.config.lr, tostring(loaded.ema), tostring(loaded.model:is_training()), cfg,
                    tostring(runner.config), tostring(runner.run)))
"""


class LoadRun(RunnerHomeTest):
    def setUp(self):
        super().setUp()
        self.env = {**self.env, "OMP_NUM_THREADS": "1"}
        self.script("train.lua", TRAIN)
        self.script("load.lua", LOAD)
        self.runner("train.lua", "lr=0.003", check=0)

    def rows(self):
        with sqlite3.connect(self.home / "index.db") as db:
            return [db.execute(f"SELECT * FROM {table}").fetchall() for table in ("runs", "attempts", "checkpoints")]

    def files(self):
        return sorted(str(p.relative_to(self.home)) for p in self.home.rglob("*") if p.name != "index.db")

    def test_the_run_s_ema_model_samples_as_the_run_did_and_nothing_is_written(self):
        rows, files = self.rows(), self.files()
        loaded = self.runner("load.lua", check=0)
        self.assertIn("train-1 step 6 lr 0.003 ema true training false cfg the caller's config nil run nil",
                      loaded.stdout)
        trained, again = load_file(self.dir / "trained.safetensors"), load_file(self.dir / "loaded.safetensors")
        self.assertEqual(sorted(trained), sorted(again))
        for key in trained:
            self.assertTrue(torch.equal(trained[key], again[key]), key)
        self.assertEqual(self.rows(), rows, "no run, attempt or checkpoint row added or changed")
        self.assertEqual(self.files(), files, "nothing written under RUNNER_HOME")

    def test_another_checkpoint_and_the_raw_weights(self):
        run_dir = self.home / "train-1" / "checkpoints"
        self.runner("load.lua", "--", "last", "3", check=0)
        ema3 = load_file(run_dir / "step-0000003" / "ema.safetensors")
        loaded = load_file(self.dir / "loaded.safetensors")
        for name, tensor in ema3.items():
            self.assertTrue(torch.equal(loaded["ema." + name], tensor), name)
        self.runner("load.lua", "--", "train-1", "6", "raw", check=0)
        raw = load_file(run_dir / "step-0000006" / "model.safetensors")
        loaded = load_file(self.dir / "loaded.safetensors")
        for name, tensor in raw.items():
            self.assertTrue(torch.equal(loaded["ema." + name], tensor), name)
        missing = self.runner("load.lua", "--", "last", "5")
        self.assertEqual(missing.returncode, 1)
        self.assertIn("run train-1 has no checkpoint of step 5 (it has 3, 6)", missing.stderr)

    def test_a_script_that_cannot_rebuild_the_model_is_named(self):
        # The run's script reads a file before it builds the model; the file is gone when the run is loaded.
        (self.dir / "needed.txt").write_text("8")
        self.script("needs.lua", TRAIN.replace('local run = runner.start(cfg)',
                                               'local run = runner.start(cfg)\nassert(io.open("needed.txt"), "needed.txt is gone")'))
        self.runner("needs.lua", check=0)
        (self.dir / "needed.txt").unlink()
        refused = self.runner("load.lua", "--", "needs-1")
        self.assertEqual(refused.returncode, 1)
        self.assertIn("runner.load_run: rebuilding run needs-1's model with its script failed: ", refused.stderr)
        self.assertIn("needed.txt is gone", refused.stderr)


class Sample(RunnerHomeTest):
    """runner sample RUN: the run's objective's samples, batch by batch, at any number of ranks, resumable."""

    def setUp(self):
        super().setUp()
        self.env = {**self.env, "OMP_NUM_THREADS": "1", "RUNNER_DIST_TIMEOUT": "60"}
        self.script("train.lua", TRAIN)
        self.runner("train.lua", check=0)

    def npz(self, folder):
        with numpy.load(folder / "samples.npz") as archive:
            return {name: archive[name] for name in archive.files}

    def test_samples_equal_the_run_s_own_and_are_recorded_against_it(self):
        with sqlite3.connect(self.home / "index.db") as db:
            runs = db.execute("SELECT * FROM runs").fetchall()
        out = self.dir / "four"
        done = self.runner("sample", "last", "--n", "4", "--batch", "4", "--seed", "9", "--steps", "5", "--labels",
                           "0,1,2,1", "--out", str(out), check=0)
        self.assertIn(f"4 samples of run train-1 step 6 in {out}", done.stdout)
        trained = load_file(self.dir / "trained.safetensors")["samples"]
        self.assertTrue(torch.equal(load_file(out / "parts/batch-000000.safetensors")["samples"], trained))
        arrays = self.npz(out)
        images = ((trained.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        self.assertTrue((arrays["arr_0"] == images).all())
        self.assertEqual(arrays["arr_0"].shape, (4, 8, 8, 3))
        self.assertEqual(arrays["arr_1"].tolist(), [0, 1, 2, 1])
        self.assertTrue((out / "grid.png").exists())
        with sqlite3.connect(self.home / "index.db") as db:
            self.assertEqual(db.execute("SELECT * FROM runs").fetchall(), runs, "the run itself is unchanged")
        # The default folder is in the run's, and its grid one of the run's images.
        self.runner("sample", "train-1", "--n", "3", "--steps", "5", check=0)
        shown = json.loads(self.runner("show", "train-1", "--json", check=0).stdout)
        paths = [artifact["path"] for artifact in shown["artifacts"]]
        self.assertIn("samples/step-0000006-n3-seed0-steps5/grid.png", paths)

    def test_any_number_of_ranks_draws_the_same_samples_and_a_killed_command_continues(self):
        args = ("--n", "10", "--batch", "4", "--steps", "5", "--seed", "3")
        self.runner("sample", "last", *args, "--out", "one", check=0)
        two = self.runner("--nproc", "2", "sample", "last", *args, "--out", "two", check=0)
        self.assertIn("10 samples of run train-1", two.stdout)
        one_arrays, two_arrays = self.npz(self.dir / "one"), self.npz(self.dir / "two")
        for name in ("arr_0", "arr_1"):
            self.assertTrue((one_arrays[name] == two_arrays[name]).all(), name)
        self.assertEqual(one_arrays["arr_1"].tolist(), [0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
        # A batch lost (the command killed before it): the same command draws only that one again.
        (self.dir / "one/parts/batch-000001.safetensors").unlink()
        (self.dir / "one/samples.npz").unlink()
        again = self.runner("sample", "last", *args, "--out", "one", check=0)
        self.assertEqual(again.stderr.count("runner sample: batch"), 1, again.stderr)
        self.assertIn("runner sample: batch 2 of 3", again.stderr)
        self.assertTrue((self.npz(self.dir / "one")["arr_0"] == one_arrays["arr_0"]).all())
        # Other settings into the same folder are refused.
        other = self.runner("sample", "last", "--n", "10", "--batch", "4", "--steps", "5", "--seed", "4", "--out", "one")
        self.assertEqual(other.returncode, 1)
        self.assertIn("one holds samples of other settings (", other.stderr)

    def test_bad_options_are_usage_errors(self):
        for args, message in ((("--n", "0"), "sample: --n must be a whole number >= 1, got '0'"),
                              (("--labels", "5"), "sample: --labels: '5' is not a class of the model (0 .. 2)"),
                              (("--fid", "ref.npz"), "sample: --fid REF.npz and --fid-weights PATH go together"),
                              (("--nsamples", "3"), "sample: unknown option '--nsamples' (runner sample --help)")):
            refused = self.runner("sample", "last", *args)
            self.assertEqual(refused.returncode, 2, refused.stderr)
            self.assertIn(message, refused.stderr)
        missing = self.runner("sample", "last", "--checkpoint", "4")
        self.assertEqual(missing.returncode, 1)
        self.assertIn("run train-1 has no checkpoint of step 4 (it has 3, 6)", missing.stderr)


# A latent DiT (4 channels of 8x8) whose config names the VAE it works under, trained for a few steps on random latents.
LATENT = """
local cfg = config { steps = 4, seed = 4, vae = "" }
local run = runner.start(cfg)
local function make() return nn.DiT { depth = 1, hidden = 32, heads = 2, patch = 2, image = 8, in_channels = 4,
                                      classes = 0, learn_sigma = false } end
local model = make()
local diffusion = runner.diffusion.gaussian { timesteps = 50 }
local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1e-3 }, objective = diffusion:objective(model),
                               ema = 0.5, ema_model = make(), steps = cfg.steps, progress = false }
run:restore { trainer = train, state = { diffusion = diffusion } }
for _ in run:steps(cfg.steps) do train:step({ data = torch.randn(4, 4, 8, 8) }) end
run:checkpoint { wait = true }
local loaded = runner.load_run(run.id, { device = "cpu" })
torch.save({ latents = loaded.objective:sample(loaded.model, { n = 2, seed = 9, steps = 3 }) }, "latents.safetensors")
"""


class LatentSample(RunnerHomeTest):
    def test_a_latent_runs_samples_are_decoded_with_the_vae_its_config_names(self):
        from test_autoencoder import make_vae
        vae = make_vae()
        vae.save_pretrained(self.dir / "vae", safe_serialization=True)
        self.env = {**self.env, "OMP_NUM_THREADS": "1"}
        self.script("latent.lua", LATENT)
        self.runner("latent.lua", "vae=vae", check=0)
        out = self.dir / "decoded"
        done = self.runner("sample", "last", "--n", "2", "--batch", "2", "--seed", "9", "--steps", "3", "--out",
                           str(out), check=0)
        self.assertIn(f"2 samples of run latent-1 step 4 in {out}", done.stdout)
        latents = load_file(self.dir / "latents.safetensors")["latents"]
        with torch.no_grad():
            expected = vae.decode(latents / vae.config.scaling_factor).sample
        samples = load_file(out / "parts/batch-000000.safetensors")["samples"]
        self.assertEqual(tuple(samples.shape), (2, 3, 32, 32))
        # runner's AutoencoderKL against diffusers' in float32: 1e-5 of the largest value (test_autoencoder's bar).
        torch.testing.assert_close(samples, expected, rtol=0, atol=1e-5 * expected.abs().max().item())
        with numpy.load(out / "samples.npz") as archive:
            images = archive["arr_0"]
        self.assertEqual(images.shape, (2, 32, 32, 3))
        wanted = ((expected.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        self.assertLessEqual(int(numpy.abs(images.astype(int) - wanted.astype(int)).max()), 1)
