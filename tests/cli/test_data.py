"""End-to-end tests of runner.data against the Python reference implementations users compare with.

Every data file is generated at test time in a temporary directory. The runner reads it through a Lua
script, writes what it got to a .safetensors file, and Python compares that with PIL, torchvision and
NumPy. Pixel-level results are compared exactly unless a tolerance is stated next to the assertion.
"""
import os
import pathlib
import struct
import tempfile
import unittest
import zlib

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from runner_process import run, write_script

ONE_LEVEL = 1 / 127.5  # one 8-bit level after v / 127.5 - 1


def noise_image(rng, mode, width, height):
    """A random image: smooth gradients plus noise, so resampling sees both edges and flat areas."""
    y, x = np.mgrid[0:height, 0:width]
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}[mode]
    planes = []
    for c in range(channels):
        base = 255 * (0.5 + 0.5 * np.sin(x / (3 + 2 * c) + y / (5 + c)))
        planes.append(np.clip(base + rng.normal(0, 40, (height, width)), 0, 255))
    array = np.stack(planes, axis=-1).astype(np.uint8)
    return Image.fromarray(array[..., 0] if channels == 1 else array, mode)


def write_png_rgb16(path, array):
    """Writes a 16-bit-per-channel RGB PNG by hand (PIL cannot create 16-bit RGB images)."""
    height, width, _ = array.shape
    rows = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def pil_rgb(path):
    """What torchvision's default loader gives: a uint8 [3, H, W] tensor of Image.open(p).convert('RGB')."""
    with Image.open(path) as image:
        return torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1).contiguous()


def normalized(x):
    """The loader's normalize, computed in float32 NumPy: v / 127.5 - 1."""
    return torch.from_numpy(np.asarray(x).astype(np.float32) / np.float32(127.5) - np.float32(1))


class DataDir(unittest.TestCase):
    """A temporary directory for the data, the scripts and their outputs, shared by a class's tests."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = pathlib.Path(cls.tmp.name)
        cls.make_data(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def make_data(cls, root):
        pass

    def run_lua(self, name, text, *args, expect_ok=True):
        result = run(write_script(self.dir, name, text), *args, cwd=self.dir)
        if expect_ok:
            self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def load(self, name):
        return load_file(str(self.dir / name))


# Saves every sample of `ds` (as s1, s2, ...) and its labels (-1 for none) to NAME, prints the classes.
DUMP_DATASET = """
local function dump(ds, name)
  local out, labels = {}, {}
  for i = 1, #ds do
    local x, y = ds:get(i)
    out["s" .. i] = x
    labels[i] = y or -1
  end
  out.labels = torch.tensor(labels, {dtype = "int64"})
  torch.save(out, name)
  print("count " .. #ds)
  for _, c in ipairs(ds:classes()) do print("class " .. c) end
end
"""

# Saves every batch of one epoch of `loader` (d1, i1, l1, d2, ...) to NAME.
DUMP_LOADER = """
local function dump_loader(loader, name)
  local out, k = {}, 0
  for batch in loader:iter() do
    k = k + 1
    out["d" .. k] = batch.data
    out["i" .. k] = batch.index
    if batch.label then out["l" .. k] = batch.label end
  end
  torch.save(out, name)
end
"""


def samples_of(saved):
    count = sum(1 for key in saved if key.startswith("s"))
    return [saved[f"s{i}"] for i in range(1, count + 1)]


def batches_of(saved):
    """(data, index, label or None) per batch, in order."""
    count = sum(1 for key in saved if key.startswith("d"))
    return [(saved[f"d{k}"], saved[f"i{k}"], saved.get(f"l{k}")) for k in range(1, count + 1)]


def printed(stdout, prefix):
    return [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)]


class ImageFolderDecoding(DataDir):
    """ds:get(i) against PIL convert('RGB'); order, labels and classes against torchvision's ImageFolder."""

    @classmethod
    def make_data(cls, root):
        rng = np.random.default_rng(1)
        folder = root / "images"

        def path(relative):
            p = folder / relative
            p.parent.mkdir(parents=True, exist_ok=True)
            return p

        def rgb(w, h):
            return noise_image(rng, "RGB", w, h)

        # JPEGs: 4:4:4, 4:2:0 and 4:2:2 (odd sizes, so partial MCUs), grayscale, progressive, upper-case extension.
        rgb(37, 29).save(path("cat/a_444.jpg"), quality=90, subsampling=0)
        rgb(33, 41).save(path("cat/b_420.jpeg"), quality=90, subsampling=2)
        noise_image(rng, "L", 31, 27).save(path("cat/c_gray.JPG"), quality=90)
        rgb(45, 35).save(path("cat/nested/d_progressive.jpg"), quality=90, subsampling=2, progressive=True)
        rgb(19, 23).save(path("cat/nested/inner/e_422.jpg"), quality=90, subsampling=1)
        # Sorts between cat/nested and cat/nested/inner in os.walk order ('-' < '/').
        rgb(16, 16).save(path("cat/nested-x/f.png"))
        # PNGs: RGB, RGBA, palette (4-bit with transparency, 8-bit), gray + alpha, 1-bit, 16-bit RGB.
        rgb(21, 17).save(path("dog/rgb.png"))
        noise_image(rng, "RGBA", 18, 22).save(path("dog/rgba.png"))
        rgb(20, 20).quantize(colors=13).save(path("dog/palette.png"), transparency=3)  # 4-bit indices, tRNS
        rgb(23, 19).quantize(colors=200).save(path("dog/palette8.png"))
        noise_image(rng, "LA", 15, 14).save(path("dog/gray_alpha.PNG"))
        noise_image(rng, "L", 13, 11).convert("1").save(path("dog/bilevel.png"))
        write_png_rgb16(path("dog/rgb16.png"), rng.integers(0, 65536, (12, 10, 3)))
        (folder / "dog" / "notes.txt").write_text("not an image\n")
        rgb(24, 20).save(path("fish/sub/deeper/g.jpg"), quality=90)
        rgb(14, 12).save(path("fish/h.png"))
        # An image outside every class folder: ImageFolder ignores it, labels = false includes it.
        rgb(10, 10).save(path("stray.png"))

    # What each generated file is, as PIL sees it: (format, mode, JPEG subsampling or PNG bit depth, progressive).
    FILES = {
        "cat/a_444.jpg": ("JPEG", "RGB", 0, False),
        "cat/b_420.jpeg": ("JPEG", "RGB", 2, False),
        "cat/c_gray.JPG": ("JPEG", "L", -1, False),
        "cat/nested/d_progressive.jpg": ("JPEG", "RGB", 2, True),
        "cat/nested/inner/e_422.jpg": ("JPEG", "RGB", 1, False),
        "cat/nested-x/f.png": ("PNG", "RGB", 8, False),
        "dog/rgb.png": ("PNG", "RGB", 8, False),
        "dog/rgba.png": ("PNG", "RGBA", 8, False),
        "dog/palette.png": ("PNG", "P", 4, False),
        "dog/palette8.png": ("PNG", "P", 8, False),
        "dog/gray_alpha.PNG": ("PNG", "LA", 8, False),
        "dog/bilevel.png": ("PNG", "1", 1, False),
        "dog/rgb16.png": ("PNG", "RGB", 16, False),
        "fish/sub/deeper/g.jpg": ("JPEG", "RGB", 2, False),
        "fish/h.png": ("PNG", "RGB", 8, False),
        "stray.png": ("PNG", "RGB", 8, False),
    }

    def test_generated_files_cover_the_formats(self):
        from PIL import JpegImagePlugin

        root = self.dir / "images"
        found = {os.path.relpath(os.path.join(r, f), root) for r, _, files in os.walk(root) for f in files}
        self.assertEqual(found, set(self.FILES) | {"dog/notes.txt"})
        for name, expected in self.FILES.items():
            with Image.open(root / name) as image:
                if image.format == "JPEG":
                    detail = JpegImagePlugin.get_sampling(image)
                else:
                    detail = (root / name).read_bytes()[24]  # the IHDR bit depth
                self.assertEqual((image.format, image.mode, detail, bool(image.info.get("progressive"))), expected, name)
        with Image.open(root / "dog/palette.png") as image:
            self.assertIn("transparency", image.info)

    def test_pixels_order_labels_and_classes_match_imagefolder(self):
        from torchvision.datasets import ImageFolder

        result = self.run_lua("folder.lua", DUMP_DATASET + """
            dump(runner.data.image_folder{path = "images", labels = true}, "folder.safetensors")
        """)
        reference = ImageFolder(str(self.dir / "images"))
        self.assertEqual(printed(result.stdout, "class "), reference.classes)
        self.assertEqual(printed(result.stdout, "count "), [str(len(reference.samples))])
        saved = self.load("folder.safetensors")
        got = samples_of(saved)
        self.assertEqual(saved["labels"].tolist(), [label for _, label in reference.samples])
        mismatches = []
        for (path, _), sample in zip(reference.samples, got):
            expected = pil_rgb(path)
            self.assertEqual(sample.dtype, torch.uint8, path)
            if sample.shape != expected.shape:
                mismatches.append(f"{os.path.relpath(path, self.dir)}: shape {list(sample.shape)} != {list(expected.shape)}")
            elif not torch.equal(sample, expected):
                diff = (sample.int() - expected.int()).abs()
                mismatches.append(f"{os.path.relpath(path, self.dir)}: max abs diff {diff.max().item()}, "
                                  f"{(diff > 0).sum().item()} of {diff.numel()} values differ")
        self.assertEqual(mismatches, [])
        # Every image differs from every other, so equal pixels at each position pin the order down.
        self.assertEqual(len({s.numpy().tobytes() for s in got}), len(got))

    def test_unlabelled_folder_lists_every_image_in_walk_order(self):
        result = self.run_lua("flat.lua", DUMP_DATASET + """
            dump(runner.data.image_folder{path = "images"}, "flat.safetensors")
        """)
        root = self.dir / "images"
        expected = [os.path.join(r, f) for r, _, files in sorted(os.walk(root)) for f in sorted(files)
                    if f.lower().endswith((".jpg", ".jpeg", ".png"))]
        saved = self.load("flat.safetensors")
        got = samples_of(saved)
        self.assertEqual(printed(result.stdout, "class "), [])
        self.assertEqual(len(got), len(expected))
        self.assertEqual(saved["labels"].tolist(), [-1] * len(expected))
        for path, sample in zip(expected, got):
            self.assertTrue(torch.equal(sample, pil_rgb(path)), path)

    def test_jpegs_match_torchvision_decode_jpeg(self):
        """A second reference for JPEGs (torchvision's own libjpeg-turbo), to tell decoder versions apart."""
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        result = self.run_lua("jpegs.lua", """
            local ds = runner.data.image_folder{path = "images/cat"}
            local out = {}
            for i = 1, #ds do out["s" .. i] = ds:get(i) end
            torch.save(out, "jpegs.safetensors")
        """)
        root = self.dir / "images" / "cat"
        paths = [os.path.join(r, f) for r, _, files in sorted(os.walk(root)) for f in sorted(files)]
        got = samples_of(self.load("jpegs.safetensors"))
        mismatches = []
        for path, sample in zip(paths, got):
            if not path.lower().endswith((".jpg", ".jpeg")):
                continue
            expected = decode_jpeg(read_file(path), mode=ImageReadMode.RGB)
            if not torch.equal(sample, expected):
                diff = (sample.int() - expected.int()).abs()
                mismatches.append(f"{os.path.basename(path)}: max abs diff {diff.max().item()}")
        self.assertEqual(mismatches, [])


class ResizeCrop(DataDir):
    """resize + center crop + normalize through the loader against torchvision.transforms.v2.functional."""

    @classmethod
    def make_data(cls, root):
        rng = np.random.default_rng(2)
        for folder, sizes in [("down", [(400, 300), (300, 400), (300, 300)]), ("up", [(20, 30), (30, 20)])]:
            (root / folder).mkdir()
            for k, (w, h) in enumerate(sizes):
                noise_image(rng, "RGB", w, h).save(root / folder / f"{k}.png")
            noise_image(rng, "RGB", *sizes[0]).save(root / folder / "q.jpg", quality=90)

    def check(self, folder, size):
        from torchvision.transforms.v2 import functional as F

        self.run_lua(f"{folder}.lua", DUMP_LOADER + f"""
            local ds = runner.data.image_folder{{path = "{folder}"}}
            local loader = runner.data.loader(ds, {{batch = 2, shuffle = false, workers = 2,
                                                   transform = {{resize = {size}, crop = {size}, fast_decode = false}}}})
            dump_loader(loader, "{folder}.safetensors")
        """)
        paths = sorted((self.dir / folder).iterdir())
        batches = batches_of(self.load(f"{folder}.safetensors"))
        got = torch.cat([data for data, _, _ in batches])
        self.assertEqual(torch.cat([index for _, index, _ in batches]).tolist(), list(range(len(paths))))
        self.assertEqual(got.dtype, torch.float32)
        self.assertEqual(list(got.shape), [len(paths), 3, size, size])
        for path, sample in zip(paths, got):
            resized = F.resize(pil_rgb(path), size, interpolation=F.InterpolationMode.BILINEAR, antialias=True)
            expected = normalized(F.center_crop(resized, size))
            diff = (sample - expected).abs()
            # torchvision resamples uint8 in fixed point, the runner in float: one 8-bit level at most, and on a
            # minority of values (about 9% when downscaling, 19% when upscaling these noisy images).
            self.assertLessEqual(diff.max().item(), ONE_LEVEL + 1e-6, path.name)
            self.assertLess(diff.mean().item(), 0.002, path.name)

    def test_downscale(self):
        self.check("down", 64)

    def test_upscale(self):
        self.check("up", 48)


class WindowDecoding(DataDir):
    """A crop makes JPEG decoding stop after the crop's last row and skip iMCU columns outside it; the pixels
    must be those of a full decode, for every chroma layout."""

    @classmethod
    def make_data(cls, root):
        rng = np.random.default_rng(5)
        (root / "jpegs").mkdir()
        for name, mode, options in [("420", "RGB", {"subsampling": 2}), ("422", "RGB", {"subsampling": 1}),
                                    ("444", "RGB", {"subsampling": 0}), ("gray", "L", {}),
                                    ("progressive", "RGB", {"progressive": True, "subsampling": 2})]:
            noise_image(rng, mode, 173, 141).save(root / "jpegs" / f"{name}.jpg", quality=90, **options)

    def test_center_crops_equal_crops_of_the_full_decode(self):
        from torchvision.transforms.v2 import functional as F

        for height, width in [(37, 51), (100, 20), (141, 9), (2, 173)]:
            with self.subTest(crop=(height, width)):
                self.run_lua("window.lua", DUMP_LOADER + f"""
                    local ds = runner.data.image_folder{{path = "jpegs"}}
                    local loader = runner.data.loader(ds, {{batch = 5, shuffle = false, workers = 2, transform =
                        {{crop = {{{height}, {width}}}, normalize = false, fast_decode = false}}}})
                    dump_loader(loader, "window.safetensors")
                """)
                (got, _, _), = batches_of(self.load("window.safetensors"))
                for path, sample in zip(sorted((self.dir / "jpegs").iterdir()), got):
                    expected = F.center_crop(pil_rgb(path), [height, width])
                    self.assertTrue(torch.equal(sample, expected), f"{path.name}: max diff "
                                    f"{(sample.int() - expected.int()).abs().max().item()}")


class Pack(DataDir):
    """runner data pack: an image folder into a uint8 .npy with labels and class names."""

    @classmethod
    def make_data(cls, root):
        rng = np.random.default_rng(6)
        for label in ["b_dogs", "a_cats"]:
            (root / "photos" / label).mkdir(parents=True)
            for k in range(3):
                noise_image(rng, "RGB", int(rng.integers(40, 90)), int(rng.integers(40, 90))).save(
                    root / "photos" / label / f"{k}.jpg", quality=90)
        good = (root / "photos" / "a_cats" / "0.jpg").read_bytes()
        (root / "bad").mkdir()
        (root / "bad" / "cats").mkdir()
        (root / "bad" / "cats" / "good.jpg").write_bytes(good)
        (root / "bad" / "cats" / "short.jpg").write_bytes(good[:200])

    def test_pack_writes_rows_labels_and_classes(self):
        result = run("data", "pack", "photos", "out/photos32.npy", "--size", "32", "--workers", "2", cwd=self.dir)
        self.assertEqual(result.returncode, 1, "the output folder does not exist yet")
        (self.dir / "out").mkdir()
        result = run("data", "pack", "photos", "out/photos32.npy", "--size", "32", "--workers", "2", cwd=self.dir)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("wrote out/photos32.npy: 6 images, uint8 [6, 3, 32, 32]", result.stdout)
        array = np.load(self.dir / "out" / "photos32.npy", mmap_mode="r")
        self.assertEqual((array.shape, array.dtype), ((6, 3, 32, 32), np.uint8))
        self.assertEqual(np.load(self.dir / "out" / "photos32.labels.npy").tolist(), [0, 0, 0, 1, 1, 1])
        self.assertEqual((self.dir / "out" / "photos32.classes.json").read_text().split(), ['[', '"a_cats",', '"b_dogs"', ']'])
        from torchvision.transforms.v2 import functional as F
        paths = sorted((self.dir / "photos").glob("*/*.jpg"))
        for path, row in zip(paths, array):
            resized = F.resize(pil_rgb(path), 32, interpolation=F.InterpolationMode.BILINEAR, antialias=True)
            expected = F.center_crop(resized, 32)
            # One 8-bit level at most: torchvision resamples in fixed point, runner in float.
            self.assertLessEqual((torch.from_numpy(np.array(row)).int() - expected.int()).abs().max().item(), 1, path.name)
        # The packed file reads back through data.npy with its labels and class names.
        self.run_lua("read_pack.lua", DUMP_DATASET + """
            dump(runner.data.npy{path = "out/photos32.npy", labels = "out/photos32.labels.npy",
                                 classes = "out/photos32.classes.json"}, "read_pack.safetensors")
        """)

    def test_a_bad_image_stops_the_pack_and_leaves_nothing(self):
        result = run("data", "pack", "bad", "bad.npy", "--size", "16", cwd=self.dir)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.splitlines()[-1],
                         "runner data: bad/cats/short.jpg: corrupt or truncated JPEG: Premature end of JPEG file "
                         "(--skip-bad leaves unreadable images out)")
        self.assertEqual(sorted(p.name for p in self.dir.iterdir() if p.name.startswith("bad.")), [])

    def test_skip_bad_leaves_the_bad_image_out(self):
        result = run("data", "pack", "bad", "skipped.npy", "--size", "16", "--skip-bad", cwd=self.dir)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("skipped bad/cats/short.jpg: corrupt or truncated JPEG: Premature end of JPEG file", result.stderr)
        self.assertIn("skipped 1 unreadable images", result.stdout)
        self.assertEqual(np.load(self.dir / "skipped.npy").shape, (1, 3, 16, 16))
        self.assertEqual(np.load(self.dir / "skipped.labels.npy").tolist(), [0])

    def test_usage_errors(self):
        result = run("data", "pack", "photos", "x.npy", cwd=self.dir)
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr.splitlines()[0], "runner data: pack needs --size N")
        result = run("data", "pack", "photos", "x.npy", "--size", "0", cwd=self.dir)
        self.assertEqual(result.stderr.splitlines()[0], "runner data: --size needs a positive integer, got '0'")


class Flip(DataDir):
    @classmethod
    def make_data(cls, root):
        rng = np.random.default_rng(3)
        (root / "flip").mkdir()
        for k in range(64):
            noise_image(rng, "RGB", 9, 7).save(root / "flip" / f"{k:02d}.png")

    def test_each_sample_is_the_image_or_its_mirror_and_both_occur(self):
        self.run_lua("flip.lua", DUMP_LOADER + """
            local ds = runner.data.image_folder{path = "flip"}
            local loader = runner.data.loader(ds, {batch = 16, shuffle = true, seed = 7, workers = 2,
                                                   transform = {flip = true, normalize = false}})
            dump_loader(loader, "flip.safetensors")
        """)
        paths = sorted((self.dir / "flip").iterdir())
        batches = batches_of(self.load("flip.safetensors"))
        seen = {"plain": 0, "flipped": 0}
        indices = []
        for data, index, _ in batches:
            self.assertEqual(data.dtype, torch.uint8)
            for sample, i in zip(data, index.tolist()):
                indices.append(i)
                expected = pil_rgb(paths[i])
                if torch.equal(sample, expected):
                    seen["plain"] += 1
                elif torch.equal(sample, expected.flip(-1)):
                    seen["flipped"] += 1
                else:
                    self.fail(f"sample {i} ({paths[i].name}) is neither the image nor its mirror")
        self.assertEqual(sorted(indices), list(range(64)))
        self.assertGreater(seen["plain"], 0)
        self.assertGreater(seen["flipped"], 0)


def write_idx(path, array):
    """An IDX file of unsigned bytes: magic 0, 0, type 0x08, rank, then big-endian 32-bit dimensions."""
    assert array.dtype == np.uint8
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.tobytes())


class Cifar10AndMnist(DataDir):
    CLASSES = ["plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    @classmethod
    def make_data(cls, root):
        rng = np.random.default_rng(4)
        cifar = root / "cifar10"
        cifar.mkdir()
        cls.cifar = {}
        for name, records in [("data_batch_1", 3), ("data_batch_2", 2), ("data_batch_3", 4), ("data_batch_4", 1),
                              ("data_batch_5", 3), ("test_batch", 5)]:
            labels = rng.integers(0, 10, records, dtype=np.uint8)
            pixels = rng.integers(0, 256, (records, 3072), dtype=np.uint8)
            (cifar / f"{name}.bin").write_bytes(np.concatenate([labels[:, None], pixels], axis=1).tobytes())
            cls.cifar[name] = (labels, pixels)
        (cifar / "batches.meta.txt").write_text("\n".join(cls.CLASSES) + "\n\n")
        mnist = root / "mnist"
        mnist.mkdir()
        cls.mnist = {}
        for prefix, count in [("train", 7), ("t10k", 4)]:
            images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
            labels = rng.integers(0, 10, count, dtype=np.uint8)
            write_idx(mnist / f"{prefix}-images-idx3-ubyte", images)
            write_idx(mnist / f"{prefix}-labels-idx1-ubyte", labels)
            cls.mnist[prefix] = (images, labels)

    def dump(self, kind, split):
        name = f"{kind}_{split}"
        result = self.run_lua(f"{name}.lua", DUMP_DATASET + f"""
            dump(runner.data.{kind}{{path = "{kind}", split = "{split}"}}, "{name}.safetensors")
        """)
        saved = self.load(f"{name}.safetensors")
        return result, samples_of(saved), saved["labels"].tolist()

    def test_cifar10(self):
        for split, files in [("train", [f"data_batch_{i}" for i in range(1, 6)]), ("test", ["test_batch"])]:
            result, samples, labels = self.dump("cifar10", split)
            expected_labels = np.concatenate([self.cifar[f][0] for f in files])
            expected_pixels = np.concatenate([self.cifar[f][1] for f in files]).reshape(-1, 3, 32, 32)
            self.assertEqual(printed(result.stdout, "count "), [str(len(expected_labels))])
            self.assertEqual(printed(result.stdout, "class "), self.CLASSES)
            self.assertEqual(labels, expected_labels.tolist())
            self.assertEqual(len(samples), len(expected_pixels))
            for i, sample in enumerate(samples):
                self.assertEqual((sample.dtype, list(sample.shape)), (torch.uint8, [3, 32, 32]))
                self.assertTrue(np.array_equal(sample.numpy(), expected_pixels[i]), f"{split} record {i}")

    def test_mnist(self):
        for split, prefix in [("train", "train"), ("test", "t10k")]:
            result, samples, labels = self.dump("mnist", split)
            images, expected_labels = self.mnist[prefix]
            self.assertEqual(printed(result.stdout, "count "), [str(len(images))])
            self.assertEqual(printed(result.stdout, "class "), [str(d) for d in range(10)])
            self.assertEqual(labels, expected_labels.tolist())
            self.assertEqual(len(samples), len(images))
            mismatches = []
            for i, sample in enumerate(samples):
                self.assertEqual((sample.dtype, list(sample.shape)), (torch.uint8, [1, 28, 28]))
                differ = np.argwhere(sample.numpy()[0] != images[i])
                if len(differ):
                    mismatches.append(f"{split} image {i}: {len(differ)} pixels differ, first at (y, x) = {tuple(int(v) for v in differ[0])}")
            self.assertEqual(mismatches, [])

    def test_mnist_through_the_loader(self):
        self.run_lua("mnist_loader.lua", DUMP_LOADER + """
            local ds = runner.data.mnist{path = "mnist", split = "train"}
            dump_loader(runner.data.loader(ds, {batch = 3, shuffle = false, workers = 2, transform = {normalize = false}}),
                        "mnist_loader.safetensors")
        """)
        images, labels = self.mnist["train"]
        batches = batches_of(self.load("mnist_loader.safetensors"))
        got = torch.cat([d for d, _, _ in batches])
        self.assertEqual((got.dtype, list(got.shape)), (torch.uint8, [len(images), 1, 28, 28]))
        self.assertTrue(np.array_equal(got.numpy()[:, 0], images))
        self.assertEqual(torch.cat([l for _, _, l in batches]).tolist(), labels.tolist())


class Npy(DataDir):
    N = 10

    @classmethod
    def make_data(cls, root):
        rng = np.random.default_rng(5)
        n = cls.N
        cls.arrays = {
            "latents": rng.standard_normal((n, 4, 8, 8)).astype(np.float32),
            "images": rng.integers(0, 256, (n, 3, 16, 16), dtype=np.uint8),
            "half": rng.standard_normal((n, 5, 3)).astype(np.float16),
            "short": rng.integers(-32768, 32768, (n, 6), dtype=np.int16),
        }
        for name, array in cls.arrays.items():
            np.save(root / f"{name}.npy", array)
        cls.labels = rng.integers(0, 3, n).astype(np.int64)
        np.save(root / "labels.npy", cls.labels)

    def test_get_returns_the_stored_rows(self):
        self.run_lua("get.lua", """
            local out = {}
            for _, name in ipairs{"latents", "images", "half", "short"} do
              local ds = runner.data.npy{path = name .. ".npy"}
              assert(#ds == 10)
              for i = 1, #ds do
                local x, y = ds:get(i)
                assert(y == nil)
                out[name .. i] = x
              end
            end
            local ds = runner.data.npy{path = "latents.npy", labels = "labels.npy", classes = {"a", "b", "c"}}
            local labels = {}
            for i = 1, #ds do labels[i] = select(2, ds:get(i)) end
            out.labels = torch.tensor(labels, {dtype = "int64"})
            torch.save(out, "get.safetensors")
            print(table.concat(ds:classes(), ","))
        """)
        saved = self.load("get.safetensors")
        for name, array in self.arrays.items():
            for i in range(self.N):
                got = saved[f"{name}{i + 1}"]
                self.assertEqual(got.dtype, torch.from_numpy(array).dtype, name)
                self.assertTrue(np.array_equal(got.numpy(), array[i]), f"{name} row {i}")
        self.assertEqual(saved["labels"].tolist(), self.labels.tolist())

    def test_loader_normalizes_uint8_and_passes_float32_through(self):
        self.run_lua("load.lua", DUMP_LOADER + """
            local images = runner.data.npy{path = "images.npy"}
            dump_loader(runner.data.loader(images, {batch = 4, shuffle = false, workers = 2}), "images.safetensors")
            local latents = runner.data.npy{path = "latents.npy", labels = "labels.npy"}
            dump_loader(runner.data.loader(latents, {batch = 4, shuffle = false, workers = 2}), "latents.safetensors")
        """)
        batches = batches_of(self.load("images.safetensors"))
        self.assertEqual([len(d) for d, _, _ in batches], [4, 4, 2])
        got = torch.cat([d for d, _, _ in batches])
        self.assertEqual(got.dtype, torch.float32)
        self.assertTrue(torch.equal(got, normalized(self.arrays["images"])))
        self.assertIsNone(batches[0][2])
        batches = batches_of(self.load("latents.safetensors"))
        got = torch.cat([d for d, _, _ in batches])
        self.assertEqual(got.dtype, torch.float32)
        self.assertTrue(torch.equal(got, torch.from_numpy(self.arrays["latents"])))
        self.assertEqual(torch.cat([l for _, _, l in batches]).tolist(), self.labels.tolist())


class Errors(DataDir):
    """The first line a user sees on stderr, exactly, with the script's file:line, and exit status 1."""

    @classmethod
    def make_data(cls, root):
        rng = np.random.default_rng(6)
        (root / "empty").mkdir()
        (root / "empty_classes" / "a").mkdir(parents=True)
        bad = root / "bad"
        bad.mkdir()
        for k in range(5):
            noise_image(rng, "RGB", 16, 12).save(bad / f"{k}.jpg", quality=90)
        whole = (bad / "2.jpg").read_bytes()
        (bad / "2.jpg").write_bytes(whole[: len(whole) // 2])
        np.save(root / "big_endian.npy", np.arange(6, dtype=">f4").reshape(3, 2))
        cifar = root / "cifar"
        cifar.mkdir()
        for i in range(1, 6):
            (cifar / f"data_batch_{i}.bin").write_bytes(bytes(3073 * 2))
        (cifar / "data_batch_3.bin").write_bytes(bytes(3073 * 2 + 100))
        (cifar / "test_batch.bin").write_bytes(bytes(3073))

    def failure(self, script):
        name = "exp.lua"
        result = self.run_lua(name, script, expect_ok=False)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertTrue(result.stderr, "no message on stderr")
        return result.stderr.splitlines()[0]

    def test_missing_folder(self):
        line = self.failure("""
            local data = runner.data

            local ds = data.image_folder{path = "no/such/folder", labels = true}
        """)
        self.assertEqual(line, "exp.lua:3: no/such/folder: no such directory")

    def test_empty_folder(self):
        line = self.failure("""
            local ds = runner.data.image_folder{path = "empty"}
        """)
        self.assertEqual(line, "exp.lua:1: empty: no .jpg, .jpeg or .png files found")
        line = self.failure("""
            local ds = runner.data.image_folder{path = "empty", labels = true}
        """)
        self.assertEqual(line, "exp.lua:1: empty: has no class subfolders (labels = true takes classes from subfolder names)")
        line = self.failure("""
            local ds = runner.data.image_folder{path = "empty_classes", labels = true}
        """)
        self.assertEqual(line, "exp.lua:1: empty_classes/a: class folder has no .jpg, .jpeg or .png files")

    def test_truncated_jpeg_raises_naming_the_file(self):
        line = self.failure("""
            local ds = runner.data.image_folder{path = "bad"}
            local loader = runner.data.loader(ds, {batch = 2, shuffle = false, workers = 2,
                                                   transform = {fast_decode = false}})
            for batch in loader:iter() do
            end
        """)
        self.assertEqual(line, "exp.lua:4: bad/2.jpg: corrupt or truncated JPEG: Premature end of JPEG file "
                               "(on_error = \"skip\" leaves bad samples out)")

    def test_truncated_jpeg_skipped_with_one_warning(self):
        result = self.run_lua("skip.lua", """
            local ds = runner.data.image_folder{path = "bad"}
            local loader = runner.data.loader(ds, {batch = 2, shuffle = false, workers = 2, on_error = "skip",
                                                   transform = {fast_decode = false}})
            for epoch = 1, 2 do
              local sizes = {}
              for batch in loader:iter() do sizes[#sizes + 1] = batch.data:size(1) end
              print(table.concat(sizes, " "))
            end
        """)
        # Batches of 2 over 5 files, 2.jpg (in the second batch) left out: 4 = N - 1 samples per epoch.
        self.assertEqual(result.stdout, "2 1 1\n2 1 1\n")
        warnings = [line for line in result.stderr.splitlines() if "[warning]" in line]
        self.assertEqual(len(warnings), 1, result.stderr)
        self.assertRegex(warnings[0], r"^\[\d\d:\d\d:\d\d\.\d{3}\] \[warning\] data: skipped a bad sample: bad/2\.jpg: "
                                      r"corrupt or truncated JPEG: Premature end of JPEG file$")

    def test_big_endian_npy(self):
        line = self.failure("""
            local ds = runner.data.npy{path = "big_endian.npy"}
        """)
        self.assertEqual(line, "exp.lua:1: big_endian.npy: big-endian dtype '>f4' is not supported "
                               "(convert with arr.astype(arr.dtype.newbyteorder('<')))")

    def test_files_truncated_while_open_raise_naming_the_file(self):
        rng = np.random.default_rng(7)
        shrink = self.dir / "shrink"
        shrink.mkdir()
        write_idx(shrink / "train-images-idx3-ubyte", rng.integers(0, 256, (40, 28, 28), dtype=np.uint8))
        write_idx(shrink / "train-labels-idx1-ubyte", rng.integers(0, 10, 40, dtype=np.uint8))
        np.save(self.dir / "shrink.npy", rng.standard_normal((400, 256)).astype(np.float32))
        line = self.failure("""
            local ds = runner.data.mnist{path = "shrink"}
            local first = ds:get(1)
            io.open("shrink/train-images-idx3-ubyte", "wb"):close()
            ds:get(40)
        """)
        self.assertEqual(line, "exp.lua:4: shrink/train-images-idx3-ubyte: the file shrank while it was being read "
                               "(now 0 bytes, 31376 when opened): was it truncated or rewritten?")
        line = self.failure("""
            local ds = runner.data.npy{path = "shrink.npy"}
            local loader = runner.data.loader(ds, {batch = 8, shuffle = false, workers = 2})
            local first = loader:next()
            io.open("shrink.npy", "wb"):close()
            for batch in loader:iter() do end
        """)
        self.assertEqual(line, "exp.lua:5: shrink.npy: the file shrank while it was being read (now 0 bytes, 409728 "
                               "when opened): was it truncated or rewritten?")

    def test_malformed_arrays_and_images_are_named(self):
        flags = self.dir / "flags.npy"
        np.save(flags, np.array([[True, False], [False, True]]))
        raw = bytearray(flags.read_bytes())
        raw[-1] = 2
        flags.write_bytes(bytes(raw))
        line = self.failure("""
            local ds = runner.data.npy{path = "flags.npy"}
            ds:get(2)
        """)
        self.assertEqual(line, "exp.lua:2: flags.npy: bool value 2 in row 1 (a bool byte must be 0 or 1)")

        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 0, 4611686018427387904, 4611686018427387904), }"
        header += " " * (63 - (10 + len(header)) % 64) + "\n"
        (self.dir / "huge.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        line = self.failure("""
            local ds = runner.data.npy{path = "huge.npy"}
        """)
        self.assertEqual(line, "exp.lua:1: huge.npy: shape (1, 0, 4611686018427387904, 4611686018427387904) is too large")

        flat = self.dir / "flat"
        flat.mkdir()
        write_idx(flat / "train-images-idx3-ubyte", np.zeros((2, 0, 28), dtype=np.uint8))
        write_idx(flat / "train-labels-idx1-ubyte", np.zeros(2, dtype=np.uint8))
        line = self.failure("""
            local ds = runner.data.mnist{path = "flat"}
        """)
        self.assertEqual(line, "exp.lua:1: flat/train-images-idx3-ubyte: images of 0 x 28 pixels: both sides must be "
                               "at least 1")

    def test_cifar_file_of_the_wrong_size(self):
        line = self.failure("""
            local data = runner.data
            local ds = data.cifar10{path = "cifar"}
        """)
        self.assertEqual(line, "exp.lua:2: cifar/data_batch_3.bin: size 6246 is not a multiple of the 3073-byte "
                               "CIFAR-10 record (truncated, or not the binary version?)")


if __name__ == "__main__":
    unittest.main()
