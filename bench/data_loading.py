# Benchmark: JPEG loading throughput of runner's data loader against PyTorch's DataLoader + torchvision/PIL.
"""Images per second for decode + resize (shorter side) + random crop + random flip + normalize to [-1, 1],
batch 64, at the same worker count, for output sizes 64 and 256.

    ~/.cache/runner/venv/bin/python bench/data_loading.py [--images N] [--workers N] [--rounds 3]
                                                          [--runner build/runner] [--only runner|pytorch]

The JPEG folder is generated once (deterministic in --seed) under $RUNNER_CACHE/bench/jpegs-<n>/.
Both sides are timed the same way: one pass over the dataset (one epoch, drop_last), with the clock
started when the first batch arrives and stopped when the last one arrives; the images counted are
those of the batches after the first. The first batch is the warm-up (worker start-up, first reads).
Rounds alternate runner / PyTorch; the medians are reported. The last line printed is
`ratio X.XX`, the geometric mean over sizes of runner images/s over PyTorch images/s.
"""

import argparse
import io
import json
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from runner_side import find_runner, run_runner_script  # noqa: E402
from bench_record import machine_info, runner_version, write_record

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SIZES = (64, 256)
BATCH = 64
CLASSES = 10
JPEG_QUALITY = 90


def cache_root():
    if os.environ.get("RUNNER_CACHE"):
        return Path(os.environ["RUNNER_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(xdg) / "runner"


# JPEG folder ----------------------------------------------------------------------------------------

def synthetic_jpeg(seed, index):
    """One natural-looking RGB JPEG (bytes): layered smooth colour fields, blurred blobs, sensor-like noise.
    Sides are uniform in 400..500 px; files come out around 50-100 KB at quality 90."""
    rng = np.random.default_rng([seed, index])
    width, height = (int(v) for v in rng.integers(400, 501, size=2))
    pixels = np.zeros((height, width, 3), np.float32)
    for cells, amplitude in ((3, 1.0), (8, 0.5), (24, 0.3), (80, 0.2), (200, 0.15)):
        field = (rng.random((cells, cells, 3), dtype=np.float32) * 255).astype(np.uint8)
        smooth = Image.fromarray(field).resize((width, height), Image.BICUBIC)
        pixels += amplitude * (np.asarray(smooth, np.float32) - 128)
    pixels = pixels / 1.75 + rng.uniform(60, 190, size=3)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(4, 12))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(15, width / 3), rng.uniform(15, height / 3)
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 1.5)))
    noise = rng.normal(0, rng.uniform(8, 16), size=(height, width, 3)).astype(np.float32)
    image = Image.fromarray(np.clip(np.asarray(image, np.float32) + noise, 0, 255).astype(np.uint8))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def image_relpath(index):
    return Path(f"class_{index % CLASSES:02d}") / f"img_{index:06d}.jpg"


def _write_one(job):
    folder, seed, index = job
    path = Path(folder) / image_relpath(index)
    path.write_bytes(synthetic_jpeg(seed, index))
    return path.stat().st_size


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)


def _default_sigterm():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def jpeg_folder(count, seed, processes):
    """The cached folder of `count` JPEGs in CLASSES class subfolders, generated on first use. Generation
    writes into a temporary folder beside it and renames it into place, so an interrupted run leaves no
    half folder behind."""
    parent = cache_root() / "bench"
    folder = parent / (f"jpegs-{count}" if seed == 0 else f"jpegs-{count}-seed{seed}")
    if folder.is_dir():
        return folder
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=parent))
    previous_term = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        for c in range(CLASSES):
            (staging / f"class_{c:02d}").mkdir()
        print(f"generating {count} JPEGs in {folder} ({processes} processes) ...", flush=True)
        start = time.perf_counter()
        jobs = [(str(staging), seed, i) for i in range(count)]
        with multiprocessing.get_context("fork").Pool(processes, initializer=_default_sigterm) as pool:
            sizes = pool.map(_write_one, jobs, chunksize=16)
        try:
            os.rename(staging, folder)
        except OSError:
            if not folder.is_dir():  # else another run finished the same folder first
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    print(f"  {count} files, {sum(sizes) / 2**20:.0f} MiB, median {statistics.median(sizes) / 1000:.0f} KB, "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return folder


def read_all_files(folder):
    """Reads every file once so both sides start with the folder in the page cache."""
    total = 0
    for path in sorted(folder.rglob("*.jpg")):
        total += len(path.read_bytes())
    return total


# The two sides --------------------------------------------------------------------------------------

def measure_runner(runner, folder, size, workers, images):
    return run_runner_script(runner, "data_loading.lua",
                             {"path": folder, "size": size, "workers": workers, "batch": BATCH, "images": images})


def measure_pytorch(folder, size, workers):
    import torch
    from torchvision import datasets, transforms

    transform = transforms.Compose([
        transforms.Resize(size),
        transforms.RandomCrop(size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.5] * 3, [0.5] * 3),
    ])
    dataset = datasets.ImageFolder(str(folder), transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers, shuffle=True,
                                         drop_last=True, persistent_workers=False, pin_memory=False)
    start = time.perf_counter()
    batches = iter(loader)
    data, _ = next(batches)
    first = time.perf_counter()
    count, images = 1, 0
    for data, _ in batches:
        count += 1
        images += data.size(0)
    last = time.perf_counter()
    del batches
    seconds = last - first
    return {"images_per_s": images / seconds, "batches": count, "images": images, "seconds": seconds,
            "first_batch_s": first - start, "workers": workers, "size": size}


# Report ---------------------------------------------------------------------------------------------

def versions(runner):
    import PIL
    import torch
    import torchvision

    found = {"torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__,
             "numpy": np.__version__}
    try:
        from PIL import features
        found["pillow_libjpeg_turbo"] = bool(features.check("libjpeg_turbo"))
    except Exception:
        pass
    if runner is not None:
        found["runner"] = runner_version(runner)
    return found


def format_rate(value):
    return "-" if value is None else f"{value:.0f}"


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--images", type=int,
                        help="JPEGs in the dataset (default 2000, or 8 batches per worker when that is more)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(),
                        help="loader workers on both sides (default: CPU cores, here %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported")
    parser.add_argument("--runner", default="build/runner", help="the runner binary (relative to the checkout)")
    parser.add_argument("--only", choices=("runner", "pytorch"), help="measure one side only (no ratio)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated JPEGs")
    parser.add_argument("--output", help="results JSON (default bench/results/data_loading-<date>-<host>.json)")
    args = parser.parse_args()
    if args.images is None:
        args.images = max(2000, 8 * BATCH * max(args.workers, 1))
    if args.images < 2 * BATCH:
        parser.error(f"--images must be at least {2 * BATCH} (two batches)")
    if args.workers < 0 or args.rounds < 1:
        parser.error("--workers must be >= 0 and --rounds >= 1")

    runner = None
    if args.only != "pytorch":
        runner = find_runner(args.runner)

    batches_per_worker = (args.images // BATCH) / max(args.workers, 1)
    if batches_per_worker < 8:
        print(f"warning: {batches_per_worker:.1f} batches per worker; with so few, the pipeline fill after the "
              f"first batch inflates the rate. Use --images {8 * BATCH * max(args.workers, 1)} or more.",
              file=sys.stderr)

    folder = jpeg_folder(args.images, args.seed, max(1, min(args.workers, os.cpu_count())))
    read_all_files(folder)

    sides = [s for s in ("runner", "pytorch") if args.only in (None, s)]
    rounds = {size: {side: [] for side in sides} for size in SIZES}
    for size in SIZES:
        for round_index in range(args.rounds):
            for side in sides:
                if side == "runner":
                    result = measure_runner(runner, folder, size, args.workers, args.images)
                else:
                    result = measure_pytorch(folder, size, args.workers)
                rounds[size][side].append(result)
                print(f"  size {size:3d}  round {round_index + 1}/{args.rounds}  {side:7s}  "
                      f"{result['images_per_s']:8.0f} img/s", flush=True)

    summary = []
    for size in SIZES:
        medians = {side: statistics.median(r["images_per_s"] for r in rounds[size][side]) for side in sides}
        row = {"size": size, "workers": args.workers, "runner_images_per_s": medians.get("runner"),
               "pytorch_images_per_s": medians.get("pytorch"), "ratio": None}
        if len(sides) == 2:
            row["ratio"] = row["runner_images_per_s"] / row["pytorch_images_per_s"]
        summary.append(row)
    geomean = None
    if len(sides) == 2:
        geomean = math.exp(statistics.fmean(math.log(row["ratio"]) for row in summary))

    header = f"{'size':>5}  {'workers':>7}  {'runner img/s':>12}  {'pytorch img/s':>13}  {'ratio':>6}"
    print()
    print(header)
    for row in summary:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(f"{row['size']:>5}  {row['workers']:>7}  {format_rate(row['runner_images_per_s']):>12}  "
              f"{format_rate(row['pytorch_images_per_s']):>13}  {ratio:>6}")

    fields = {
        "settings": {"images": args.images, "workers": args.workers, "rounds": args.rounds, "batch": BATCH,
                     "sizes": list(SIZES), "seed": args.seed, "dataset": str(folder), "sides": sides,
                     "pipeline": "decode, resize shorter side to S, random crop S, random horizontal flip, "
                                 "to float, normalize to [-1, 1]",
                     "timed": "first batch received to last batch received of one epoch; images of the "
                              "batches after the first"},
        "rounds": {str(size): rounds[size] for size in SIZES},
        "medians": summary,
    }
    write_record("data_loading", machine_info(), versions(runner), fields, geomean, args.output)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
