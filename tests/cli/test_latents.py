"""The latent workflow: `runner data encode` against diffusers' encoder, its files, resume after a kill, and
data.latents drawing posterior samples from the loader's keyed stream; dit.lua on encoded latents with a VAE."""
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import time

import numpy as np
import torch
from diffusers import AutoencoderKL
from PIL import Image
from safetensors.torch import load_file
from torchvision.utils import make_grid

from runner_process import RUNNER, RunnerHomeTest, home_env, run
from test_experiments import last_run, run_experiment


def make_vae(directory):
    """A small diffusers VAE with random weights (biases and norms too), saved as a diffusers folder."""
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(16, 32), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, norm_num_groups=8,
                        latent_channels=4).eval()
    with torch.no_grad():
        for parameter in vae.parameters():
            if parameter.dim() == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
    vae.save_pretrained(directory, safe_serialization=True)
    return vae


def make_fid_weights(path):
    """pytorch-fid's FID Inception with random weights, as test_fid.py builds it."""
    from test_fid import fid_inception_state
    torch.save(fid_inception_state(), path)


def make_images(directory, per_class, seed=0):
    rng = np.random.default_rng(seed)
    for name in ("cat", "dog"):
        os.makedirs(directory / name, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(directory / name / f"{i:03d}.png")


class Encode(RunnerHomeTest):
    def setUp(self):
        super().setUp()
        self.vae = make_vae(self.dir / "vae")
        make_images(self.dir / "images", 6)

    def test_posteriors_equal_diffusers_and_the_files_beside_them(self):
        result = self.runner("data", "pack", "images", "packed.npy", "--size", "16", check=0)
        result = self.runner("data", "encode", "packed.npy", "latents.npy", "--vae", "vae", "--flip", "--batch", "5",
                             "--device", "cpu", check=0)
        self.assertIn('use: runner.data.latents { path = "latents.npy" }', result.stdout)
        latents = np.load(self.dir / "latents.npy")
        self.assertEqual(latents.shape, (12, 2, 2, 4, 8, 8))
        pixels = torch.from_numpy(np.load(self.dir / "packed.npy")).float() / 127.5 - 1
        with torch.no_grad():
            for flip, images in enumerate((pixels, pixels.flip(3))):
                posterior = self.vae.encode(images).latent_dist
                for k, expected in enumerate((posterior.mean, posterior.logvar)):
                    actual = torch.from_numpy(latents[:, flip, k])
                    # float32, same operations in another library: 1e-5 of the largest value.
                    worst = (actual - expected).abs().max().item()
                    self.assertLessEqual(worst, 1e-5 * expected.abs().max().item(), f"flip {flip}, {('mean', 'logvar')[k]}")
        self.assertTrue(np.array_equal(np.load(self.dir / "latents.labels.npy"), np.load(self.dir / "packed.labels.npy")))
        self.assertEqual(json.loads((self.dir / "latents.classes.json").read_text()), ["cat", "dog"])
        manifest = json.loads((self.dir / "latents.json").read_text())
        weights = self.dir / "vae" / "diffusion_pytorch_model.safetensors"
        self.assertEqual(manifest["vae"]["sha256"], hashlib.sha256(weights.read_bytes()).hexdigest())
        self.assertEqual(manifest["vae"]["scaling_factor"], 0.18215)
        self.assertEqual((manifest["images"], manifest["flip"], manifest["shape"]), (12, True, [12, 2, 2, 4, 8, 8]))
        self.assertEqual(sorted(p.name for p in self.dir.iterdir() if p.name.startswith("latents")),
                         ["latents.classes.json", "latents.json", "latents.labels.npy", "latents.npy"],
                         "no partial or progress files are left")
        # The folder itself, resized and cropped as pack does, gives the same array.
        self.runner("data", "encode", "images", "direct.npy", "--vae", "vae", "--size", "16", "--flip", "--device", "cpu",
                    check=0)
        self.assertTrue(np.array_equal(np.load(self.dir / "direct.npy"), latents))

    def test_a_killed_encoding_continues_where_it_stopped(self):
        make_images(self.dir / "many", 150, seed=1)
        self.runner("data", "encode", "many", "whole.npy", "--vae", "vae", "--size", "16", "--batch", "2",
                    "--device", "cpu", check=0)
        process = subprocess.Popen([RUNNER, "data", "encode", "many", "cut.npy", "--vae", "vae", "--size", "16",
                                    "--batch", "2", "--device", "cpu"], cwd=self.dir, env=self.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        progress = self.dir / "cut.npy.progress.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (progress.exists() and json.loads(progress.read_text())["images"] >= 20):
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.communicate()
        self.assertFalse((self.dir / "cut.npy").exists(), "the array appears only when complete")
        done = json.loads(progress.read_text())["images"]
        self.assertLess(done, 300, "killed before the end")
        result = self.runner("data", "encode", "many", "cut.npy", "--vae", "vae", "--size", "16", "--batch", "2",
                             "--device", "cpu", check=0)
        self.assertRegex(result.stderr, r"continuing: \d+ of 300 images were encoded before")
        self.assertTrue(np.array_equal(np.load(self.dir / "cut.npy"), np.load(self.dir / "whole.npy")))
        self.assertTrue(np.array_equal(np.load(self.dir / "cut.labels.npy"), np.load(self.dir / "whole.labels.npy")))

    def test_bad_input(self):
        result = self.runner("data", "encode", "images", "x.npy", "--size", "16", check=2)
        self.assertIn("runner data: encode needs --vae PATH", result.stderr)
        result = self.runner("data", "encode", "images", "x.npy", "--vae", "vae", check=1)
        self.assertIn("encode: an image folder needs --size N", result.stderr)
        result = self.runner("data", "encode", "images", "x.npy", "--vae", "vae", "--size", "15", check=1)
        self.assertIn("the image side 15 is not a multiple of the VAE's downsampling 2", result.stderr)
        result = self.runner("data", "encode", "missing", "x.npy", "--vae", "vae", "--size", "16", check=1)
        self.assertIn("missing: no such folder or file", result.stderr)


class Latents(RunnerHomeTest):
    def test_each_read_draws_from_the_posterior_by_the_samples_key(self):
        # Posteriors as `runner data encode` lays them out, with flips far apart: mean +-(10 + row), std 0.1.
        stored = np.zeros((16, 2, 2, 4, 8, 8), np.float32)
        for row in range(16):
            stored[row, 0, 0], stored[row, 1, 0] = 10 + row, -10 - row
        stored[:, :, 1] = np.log(0.01)
        np.save(self.dir / "latents.npy", stored)
        np.save(self.dir / "latents.labels.npy", np.arange(16) % 2)
        (self.dir / "latents.classes.json").write_text('["cat", "dog"]')
        (self.dir / "latents.json").write_text(json.dumps({"format": "runner latents", "vae": {"scaling_factor": 0.5}}))
        self.script("draw.lua", """
            local latents = runner.data.latents { path = "latents.npy" }
            assert(#latents == 16 and latents:classes()[2] == "dog", tostring(latents))
            local function epoch(seed, from)
              local loader = runner.data.loader(latents, { batch = 16, shuffle = true, seed = seed, workers = 1 })
              if from then loader:seek(from) end
              return loader:next()
            end
            local a, again, other = epoch(3), epoch(3), epoch(4)
            local second, resumed = nil, nil
            do
              local loader = runner.data.loader(latents, { batch = 16, shuffle = true, seed = 3, workers = 1 })
              loader:next()
              second = loader:next()
              resumed = epoch(3, 1)
            end
            torch.save({ z = a.data, index = a.index, label = a.label, again = again.data, other = other.data,
                         second = second.data, resumed = resumed.data }, "draws.safetensors")
        """)
        self.runner("draw.lua", check=0)
        draws = load_file(self.dir / "draws.safetensors")
        self.assertTrue(torch.equal(draws["z"], draws["again"]), "the same seed draws the same latents")
        self.assertFalse(torch.equal(draws["z"], draws["other"]))
        self.assertTrue(torch.equal(draws["second"], draws["resumed"]), "a loader moved to batch 1 draws what one that got there does")
        index = draws["index"]
        z = draws["z"].double() / 0.5
        sign = torch.sign(z.flatten(1)[:, 0])
        self.assertEqual(set(sign.tolist()), {-1.0, 1.0}, "both the image and its flip are drawn")
        mean = (sign * (10 + index.double())).view(16, 1, 1, 1)
        drawn = ((z - mean) / 0.1).flatten()
        # 16 x 256 standard normal values: mean within 4 standard errors (4 / 64), std within 5%.
        self.assertLess(drawn.mean().abs().item(), 4 / 64)
        self.assertLess(abs(drawn.std().item() - 1), 0.05)
        self.assertTrue(torch.equal(draws["label"], torch.from_numpy(np.load(self.dir / "latents.labels.npy"))[draws["index"]]))

    def test_dit_trains_on_encoded_latents_and_decodes_its_grid(self):
        vae = make_vae(self.dir / "vae")
        make_images(self.dir / "images", 8)
        self.runner("data", "encode", "images", "latents.npy", "--vae", "vae", "--size", "16", "--flip", "--device", "cpu",
                    check=0)
        stdout = run_experiment("dit.lua", "data=latents.npy", "vae=vae", "size=DiT-S/4", "classes=2", "batch=4",
                                "steps=2", "sample_every=2", "sample_steps=3", "sample_classes=0,1", "log_every=1",
                                "workers=1", cwd=self.dir)
        self.assertIn("latents latents.npy: 16 x [4, 8, 8] with flips, labelled", stdout)
        run_record = last_run(self.dir)
        latents = load_file(run_record["path"] / "samples-0000002.safetensors")["latents"]
        self.assertEqual(latents.shape, (2, 4, 8, 8))
        # The saved latents decoded by diffusers, unscaled by the VAE's scaling factor, tiled as torchvision's
        # make_grid and save_image do: two 16x16 images in a row with 2 px of black around them.
        with torch.no_grad():
            images = vae.decode(latents / vae.config.scaling_factor).sample.clamp(-1, 1)
        expected = make_grid((images + 1) / 2, nrow=8, padding=2, pad_value=0)
        expected = expected.mul(255).add(0.5).clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy().astype(int)
        self.assertEqual(expected.shape, (20, 38, 3))
        self.assertGreater(expected[2:18, 2:18].std(), 10, "the decode is an image, not a flat colour")
        with Image.open(run_record["path"] / "images" / "samples-0000002.png") as grid:
            self.assertEqual((grid.size, grid.mode), ((38, 20), "RGB"))
            pixels = np.asarray(grid).astype(int)
        # float32 in LibTorch and in diffusers differ by about 1e-6: a pixel near a rounding boundary may be 1 level off.
        difference = np.abs(pixels - expected)
        self.assertLessEqual(difference.max(), 1, f"{(difference > 1).sum()} pixels differ by more than 1 level")
        self.assertLess(difference.mean(), 0.05)
        # The run records what it read, as resolved, so that its command can be rerun from another folder: the
        # latents with the encode manifest's source and VAE hash, and the VAE with the same hash.
        manifest = json.loads((self.dir / "latents.json").read_text())
        weights = next((self.dir / "vae").glob("*.safetensors"))
        vae_sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()
        self.assertEqual(manifest["vae"]["sha256"], vae_sha256)
        inputs = run_record["inputs"]
        self.assertEqual([(i["attempt"], i["kind"], i["path"]) for i in inputs],
                         [(1, "data", str((self.dir / "latents.npy").resolve())), (1, "vae", str((self.dir / "vae").resolve()))])
        self.assertEqual(inputs[0]["bytes"], (self.dir / "latents.npy").stat().st_size)
        self.assertEqual(inputs[0]["detail"]["vae"]["sha256"], vae_sha256)
        self.assertEqual(inputs[0]["detail"]["source"], str((self.dir / "images").resolve()))
        self.assertEqual(inputs[0]["detail"]["latents"], 16)
        self.assertEqual(inputs[1]["detail"], {"weights": str(weights.resolve()), "sha256": vae_sha256})
        self.assertIsNone(inputs[1]["bytes"])  # a folder
        shown = run("show", "last", cwd=self.dir, timeout=60, env=home_env(self.dir / "runs")).stdout
        self.assertIn(f"encoded from {(self.dir / 'images').resolve()} with the VAE sha256 {vae_sha256[:12]}", shown)
        self.assertIn(f"sha256 {vae_sha256[:12]}", shown)

    def test_dit_fine_tunes_from_a_pt_state_dict_and_logs_fid(self):
        make_vae(self.dir / "vae")
        make_images(self.dir / "images", 4)
        self.runner("data", "encode", "images", "latents.npy", "--vae", "vae", "--size", "16", "--device", "cpu", check=0)
        common = ("data=latents.npy", "vae=vae", "size=DiT-S/4", "classes=2", "batch=4", "sample_every=100",
                  "sample_steps=2", "log_every=1", "workers=1", "sample_classes=0")
        run_experiment("dit.lua", *common, "steps=1", cwd=self.dir)
        trained = load_file(str(last_run(self.dir)["path"] / "ema.safetensors"))
        # Noise of 0.01 on every value (the zero-initialized layers' too): no tensor of the file is what a fresh
        # model holds (the smallest has 128 values), so one left unloaded shows.
        generator = torch.Generator().manual_seed(1)
        init = {name: value + 0.01 * torch.randn(value.shape, generator=generator) for name, value in trained.items()}
        torch.save(init, self.dir / "init.pt")
        make_fid_weights(self.dir / "fid.pth")
        self.runner("data", "fid-stats", "images/cat", "ref.npz", "--weights", "fid.pth", "--device", "cpu", check=0)
        stdout = run_experiment("dit.lua", *common, "steps=1", "init=init.pt", "fid_every=1", "fid_samples=4",
                                "fid_ref=ref.npz", "fid_weights=fid.pth", cwd=self.dir, flags=("--fresh",))
        self.assertRegex(stdout, r"step       1  FID [0-9.]+ of 4 EMA samples")
        run_record = last_run(self.dir)
        self.assertEqual(run_record["config"]["init"], "init.pt")
        with sqlite3.connect(self.dir / "runs" / "index.db") as db:
            keys = {row[0] for row in db.execute("SELECT key FROM metrics JOIN runs USING (run) WHERE runs.name = ?",
                                                 (run_record["name"],))}
        self.assertTrue({"fid", "fid_seconds"} <= keys, keys)
        # Trained one step from the file's weights: AdamW's first step moves each weight by at most lr = 1e-4 (its
        # update is g / (|g| + eps)), and after one step the EMA is a copy of the model; 1% more for float32 rounding.
        model = load_file(str(run_record["path"] / "checkpoints" / "step-0000001" / "model.safetensors"))
        ema = load_file(str(run_record["path"] / "ema.safetensors"))
        self.assertEqual(set(model), set(init))
        for name, value in init.items():
            self.assertLessEqual((model[name] - value).abs().max().item(), 1.01e-4, f"model: {name}")
            self.assertLessEqual((ema[name] - value).abs().max().item(), 1.01e-4, f"EMA: {name}")
        moved = max((model[name] - value).abs().max().item() for name, value in init.items())
        self.assertGreater(moved, 1e-5, "the model trained")
