"""FID against pytorch-fid on the same images and (random, BatchNorm-calibrated) FID Inception weights: folders,
tensors and .npz statistics, `runner data fid-stats`, weights as .pth (zip and legacy) and safetensors; errors."""
import hashlib
import os
import sqlite3

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

from runner_process import RunnerHomeTest

IMAGES = 8  # the FID Inception resizes every image to 299 x 299: about 0.3 s an image on 2 cores
PYTORCH_FID_WEIGHTS = "pt_inception-2015-12-05-6726825d.pth"
PYTORCH_FID_URL = "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/" + PYTORCH_FID_WEIGHTS
PYTORCH_FID_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"


def fid_inception_state():
    """pytorch-fid's FID Inception with random weights whose BatchNorm statistics are measured on random images,
    so that features vary with the input as the real network's do."""
    import pytorch_fid.inception as inception
    torch.manual_seed(0)
    net = inception._inception_v3(num_classes=1008, aux_logits=False, weights=None)
    net.Mixed_5b, net.Mixed_5c = inception.FIDInceptionA(192, 32), inception.FIDInceptionA(256, 64)
    net.Mixed_5d = inception.FIDInceptionA(288, 64)
    net.Mixed_6b, net.Mixed_6c = inception.FIDInceptionC(768, 128), inception.FIDInceptionC(768, 160)
    net.Mixed_6d, net.Mixed_6e = inception.FIDInceptionC(768, 160), inception.FIDInceptionC(768, 192)
    net.Mixed_7b, net.Mixed_7c = inception.FIDInceptionE_1(1280), inception.FIDInceptionE_2(2048)
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # a cumulative average over the calibration batches
            with torch.no_grad():  # scales and shifts that matter, so that ignoring them would show
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.3, 0.3)
    net.train()
    with torch.no_grad():
        net(torch.rand(4, 3, 299, 299) * 2 - 1)
    return net.state_dict()


def reference_statistics(state, folder):
    """pytorch-fid's own pipeline (ImagePathDataset, InceptionV3 resize + normalise, pool3) with these weights."""
    import pytorch_fid.inception as inception
    from pytorch_fid.fid_score import calculate_activation_statistics
    download = inception.load_state_dict_from_url
    inception.load_state_dict_from_url = lambda *args, **kwargs: state
    try:
        model = inception.InceptionV3([3]).eval()
    finally:
        inception.load_state_dict_from_url = download
    files = sorted(os.path.join(folder, name) for name in os.listdir(folder))
    return calculate_activation_statistics(files, model, batch_size=6, dims=2048, device="cpu", num_workers=0)


class Fid(RunnerHomeTest):
    @classmethod
    def setUpClass(cls):
        cls.state = fid_inception_state()

    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(0)
        self.pixels = {}
        for name, low, high in (("a", 0, 200), ("b", 60, 256)):
            os.makedirs(self.dir / name)
            images = rng.integers(low, high, (IMAGES, 32, 32, 3), dtype=np.uint8)
            for i, image in enumerate(images):
                Image.fromarray(image).save(self.dir / name / f"{i:02d}.png")
            self.pixels[name] = images
        torch.save(self.state, self.dir / "weights.pth")
        save_file({k: v.contiguous() for k, v in self.state.items()}, self.dir / "weights.safetensors")

    def test_runner_sample_scores_a_run_s_samples_and_records_the_fid_against_it(self):
        from test_load_run import TRAIN
        self.script("train.lua", TRAIN)
        self.runner("train.lua", check=0)
        self.runner("data", "fid-stats", "a", "a.npz", "--weights", "weights.pth", check=0, timeout=600)
        done = self.runner("sample", "last", "--n", "6", "--batch", "3", "--steps", "5", "--out", "drawn", "--fid",
                           "a.npz", "--fid-weights", "weights.pth", check=0, timeout=600)
        # The same number from runner.eval.fid over the samples drawn.
        self.script("fid.lua", """
            local parts = { torch.load("drawn/parts/batch-000000.safetensors").samples,
                            torch.load("drawn/parts/batch-000001.safetensors").samples }
            print(string.format("%.10e", runner.eval.fid(torch.cat(parts, 1), "a.npz", { weights = "weights.pth" })))
        """)
        expected = float(self.runner("fid.lua", check=0, timeout=600).stdout)
        with sqlite3.connect(self.home / "index.db") as db:
            (step, value), = db.execute("SELECT step, value FROM metrics WHERE key = 'sample/fid'").fetchall()
        self.assertEqual(step, 6)
        self.assertAlmostEqual(value, expected, delta=1e-9 * expected)
        self.assertIn(f"6 samples of run train-1 step 6 in drawn; sample/fid {expected:.4f}", done.stdout)

    def test_folders_tensors_and_statistics_equal_pytorch_fid(self):
        from pytorch_fid.fid_score import calculate_frechet_distance
        mu_a, sigma_a = reference_statistics(self.state, self.dir / "a")
        mu_b, sigma_b = reference_statistics(self.state, self.dir / "b")
        expected = calculate_frechet_distance(mu_a, sigma_a, mu_b, sigma_b)
        self.assertGreater(expected, 1.0, "the two sets differ")
        tensor = torch.from_numpy(self.pixels["b"]).permute(0, 3, 1, 2).float() / 127.5 - 1
        save_file({"b": tensor.contiguous()}, self.dir / "b.safetensors")
        stats = self.runner("data", "fid-stats", "a", "a.npz", "--weights", "weights.pth", "--batch", "5", check=0, timeout=600)
        self.assertRegex(stats.stderr, r"fid-stats \[#{18}\.{12}\] 5/8 images", "progress after each batch")
        self.assertRegex(stats.stderr, r"fid-stats \[#{30}\] 8/8 images")
        other = hashlib.sha256((self.dir / "weights.pth").read_bytes()).hexdigest()
        self.assertIn(f"weights.pth: sha256 {other} is not that of pytorch-fid's {PYTORCH_FID_WEIGHTS} "
                      f"({PYTORCH_FID_SHA256})", stats.stderr, "other weights are used with a warning")
        self.script("fid.lua", """
            local options = { weights = "weights.safetensors", batch = 5, device = "cpu" }
            local b = torch.load("b.safetensors").b
            print(string.format("folders %.10e", runner.eval.fid("a", "b", options)))
            print(string.format("tensor %.10e", runner.eval.fid("a.npz", b, options)))
        """)
        stdout = self.runner("fid.lua", check=0, timeout=600).stdout
        values = dict(line.split() for line in stdout.splitlines())
        # pytorch-fid: float32 features in float64 statistics, scipy's sqrtm; runner: float64 statistics and an
        # eigendecomposition. The bar: 1e-3 relative.
        self.assertLess(abs(float(values["folders"]) - expected) / expected, 1e-3, (values, expected))
        self.assertLess(abs(float(values["tensor"]) - expected) / expected, 1e-3, (values, expected))
        stats = np.load(self.dir / "a.npz")
        self.assertEqual((stats["mu"].dtype, stats["sigma"].shape), (np.float64, (2048, 2048)))
        self.assertLess(np.abs(stats["mu"] - mu_a).max(), 1e-4 * np.abs(mu_a).max())
        self.assertLess(np.abs(stats["sigma"] - sigma_a).max(), 1e-3 * np.abs(sigma_a).max())

    def test_pytorch_fids_legacy_weights_file_and_npz_files_of_other_tools(self):
        torch.save(self.state, self.dir / "legacy.pth", _use_new_zipfile_serialization=False)
        mu, sigma = reference_statistics(self.state, self.dir / "b")
        np.savez_compressed(self.dir / "b_compressed.npz", mu=mu, sigma=sigma)  # as clean-fid and ADM ship them
        self.script("fid.lua", """
            local options = { weights = "legacy.pth", batch = 6, device = "cpu" }
            print(string.format("%.10e", runner.eval.fid("b", "b_compressed.npz", options)))
        """)
        value = float(self.runner("fid.lua", check=0, timeout=600).stdout.strip())
        self.assertLess(abs(value), 1e-3 * np.trace(sigma), "a set against its own statistics")

    def test_errors(self):
        self.script("no_weights.lua", 'runner.eval.fid("a", "b")')
        result = self.runner("no_weights.lua", check=1)
        self.assertIn("no_weights.lua:1: fid: give weights = the FID Inception weights file", result.stderr)
        for text in (PYTORCH_FID_WEIGHTS, PYTORCH_FID_URL, PYTORCH_FID_SHA256, "runner.eval.sliced_wasserstein"):
            self.assertIn(text, result.stderr)
        np.savez(self.dir / "mu_only.npz", mu=np.zeros(2048))
        os.makedirs(self.dir / "empty")
        state = dict(self.state)
        del state["Mixed_7c.branch_pool.bn.running_var"]
        torch.save(state, self.dir / "partial.pth")
        self.script("bad.lua", """
            local ok, message = pcall(runner.eval.fid, arg[1], "a", { weights = arg[2] or "weights.pth" })
            print(message)
        """)
        self.assertIn("mu_only.npz: no array 'sigma'", self.runner("bad.lua", "--", "mu_only.npz", check=0).stdout)
        self.assertIn("empty", self.runner("bad.lua", "--", "empty", check=0).stdout)
        self.assertIn("partial.pth: the weights do not fit the FID Inception", self.runner("bad.lua", "--", "b", "partial.pth", check=0).stdout)
        self.assertIn("missing keys: Mixed_7c.branch_pool.bn.running_var",
                      self.runner("bad.lua", "--", "b", "partial.pth", check=0).stdout)

    def test_without_the_weights_the_errors_say_where_they_come_from_and_a_wrong_copy_is_refused(self):
        result = self.runner("data", "fid-stats", "a", "a.npz", check=2)
        for text in ("runner data: fid-stats needs --weights PATH", PYTORCH_FID_WEIGHTS, PYTORCH_FID_URL,
                     PYTORCH_FID_SHA256, "runner.eval.sliced_wasserstein", "see 'runner data --help'"):
            self.assertIn(text, result.stderr)
        self.assertNotIn("data pack", result.stderr, "the usage of fid-stats only")
        os.replace(self.dir / "weights.pth", self.dir / PYTORCH_FID_WEIGHTS)  # the name, other bytes
        actual = hashlib.sha256((self.dir / PYTORCH_FID_WEIGHTS).read_bytes()).hexdigest()
        result = self.runner("data", "fid-stats", "a", "a.npz", "--weights", PYTORCH_FID_WEIGHTS, check=1)
        self.assertIn(f"runner data: {PYTORCH_FID_WEIGHTS}: sha256 {actual}, not {PYTORCH_FID_SHA256} as pytorch-fid "
                      f"publishes it: the file is damaged or another one; download it again from {PYTORCH_FID_URL}",
                      result.stderr)
        self.assertFalse((self.dir / "a.npz").exists())
