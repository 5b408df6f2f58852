# Benchmark: training-step throughput of runner's built-in UNet and DiT against PyTorch eager on the same models.
"""Images per second of forward + MSE loss + backward (no optimizer) for the CIFAR-10 DDPM UNet and DiT-XL/2,
runner (nn.UNet / nn.DiT from Lua) against PyTorch eager (tests/reference/models.py), same batch and dtype.

    ~/.cache/runner/venv/bin/python bench/model_throughput.py [--device cpu|cuda] [--dtype float32|bfloat16]
        [--models unet,dit] [--batch-unet N] [--batch-dit N] [--steps N] [--warmup N] [--rounds 3]
        [--small] [--threads N] [--pytorch-autocast] [--runner build/runner] [--only runner|pytorch]

One step, both sides: gradients dropped (set to none), forward on a fixed random batch (timesteps uniform in
0..999, random labels for the DiT), MSE against a fixed random target of the output's shape, backward. The
model is in training mode, so the UNet's dropout is active on both sides. Each measurement builds the model,
runs --warmup untimed steps, synchronizes the device, then times --steps steps and synchronizes again.
The runner side runs `build/runner bench/model_throughput.lua model=... key=value ...` as a subprocess and
parses its RESULT line; the PyTorch side runs in this process. Rounds alternate the sides (and which side
goes first); the medians are reported. The last line printed is `ratio X.XX`, the geometric mean over
models of runner images/s over PyTorch images/s.

bfloat16: the Lua API has no autocast yet, so both sides convert the parameters and the inputs to bfloat16
("bf16 weights"). --pytorch-autocast also measures PyTorch the usual way (float32 weights, autocast to
bfloat16), reported beside the ratio but not in it.
"""

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT / "tests" / "reference"))
import models as reference  # noqa: E402  (tests/reference/models.py: the same UNet and DiT in PyTorch)
from runner_side import find_runner, run_runner_script  # noqa: E402
from bench_record import machine_info, runner_version, write_record  # noqa: E402

TIMESTEPS = 1000

# name -> (label, reference builder name, options). Options use the Lua names of nn.UNet{} / nn.DiT{};
# both sides get exactly these (the DiT size is resolved to depth/hidden/heads/patch here).
FULL = {
    "unet": ("DDPM UNet CIFAR-10 (ch 128)", "unet",
             {"channels": 128, "mults": (1, 2, 2, 2), "blocks": 2, "attention": (16,), "dropout": 0.1,
              "image": 32, "in_channels": 3, "classes": 0}),
    "dit": ("DiT-XL/2 (32x32x4, 1000 classes)", "dit",
            {"depth": 28, "hidden": 1152, "heads": 16, "patch": 2, "image": 32, "in_channels": 4,
             "classes": 1000, "learn_sigma": True}),
}
SMALL = {
    "unet": ("DDPM UNet, ch 32 (small)", "unet",
             {"channels": 32, "mults": (1, 2, 2, 2), "blocks": 2, "attention": (16,), "dropout": 0.1,
              "image": 32, "in_channels": 3, "classes": 0}),
    "dit": ("DiT 4 blocks x 384, patch 2 (small)", "dit",
            {"depth": 4, "hidden": 384, "heads": 6, "patch": 2, "image": 32, "in_channels": 4,
             "classes": 1000, "learn_sigma": True}),
}
DEFAULTS = {  # (batch unet, batch dit, warmup, steps)
    "full": (128, 128, 10, 50),
    "small": (16, 8, 2, 6),
}


# The two sides -------------------------------------------------------------------------------------

def lua_values(options):
    """Model options as config override values: lists comma-separated, booleans as true/false."""
    values = {}
    for key, value in options.items():
        if isinstance(value, (tuple, list)):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        values[key] = value
    return values


def measure_runner(runner, model, options, settings):
    overrides = {"model": model, **{key: settings[key] for key in
                                    ("device", "dtype", "batch", "warmup", "steps", "threads", "seed")}}
    return run_runner_script(runner, "model_throughput.lua", {**overrides, **lua_values(options)})


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_flops(net, x, t, y):
    """FLOPs of one forward pass at batch 1, counted by torch's FlopCounterMode (matmuls, convolutions,
    attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        net(x[:1], t[:1], None if y is None else y[:1])
    return counter.get_total_flops()


def measure_pytorch(builder, options, settings, autocast=False, count_flops=False):
    """One measurement of PyTorch eager; autocast: float32 weights, forward and loss under autocast to bfloat16."""
    device = torch.device(settings["device"])
    torch.manual_seed(settings["seed"])
    start = time.perf_counter()
    net = reference.build(builder, options).to(device)
    dtype = torch.float32
    if settings["dtype"] == "bfloat16" and not autocast:
        dtype = torch.bfloat16
        net.to(dtype)
    net.train()
    batch, image = settings["batch"], net.image if builder == "unet" else options["image"]
    x = torch.randn(batch, net.in_channels, image, image, device=device, dtype=dtype)
    target = torch.randn(batch, net.out_channels, image, image, device=device, dtype=dtype)
    t = torch.randint(0, TIMESTEPS, (batch,), device=device)
    y = torch.randint(0, net.classes, (batch,), device=device) if net.classes > 0 else None
    parameters = reference.parameter_count(net)
    flops = forward_flops(net, x, t, y) if count_flops else None
    synchronize(device)
    build_s = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        net.zero_grad(set_to_none=True)
        if autocast:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.mse_loss(net(x, t, y), target)
        else:
            loss = F.mse_loss(net(x, t, y), target)
        loss.backward()
        return loss

    warmup_start = time.perf_counter()
    for _ in range(settings["warmup"]):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(settings["steps"]):
        loss = step()
    synchronize(device)
    seconds = time.perf_counter() - start
    result = {"images_per_s": settings["steps"] * batch / seconds, "steps_per_s": settings["steps"] / seconds,
              "seconds": seconds, "steps": settings["steps"], "warmup": settings["warmup"],
              "warmup_s": start - warmup_start, "build_s": build_s, "batch": batch, "parameters": parameters,
              "loss": loss.item(), "threads": torch.get_num_threads(), "device": str(device),
              "dtype": "bfloat16 autocast, float32 weights" if autocast else settings["dtype"]}
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if flops is not None:
        result["forward_flops_per_image"] = flops
    del net, x, target, t, y, loss
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


# Report --------------------------------------------------------------------------------------------

def machine_info_with_gpu(device):
    """bench_record's machine entries plus "gpu": None, or the CUDA device's name, memory, SMs and capability."""
    info = machine_info()
    info["gpu"] = None
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": properties.name, "memory_gib": round(properties.total_memory / 2**30, 1),
                       "multiprocessors": properties.multi_processor_count,
                       "capability": f"{properties.major}.{properties.minor}"}
    return info


def versions(runner):
    import numpy

    found = {"torch": torch.__version__, "numpy": numpy.__version__, "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    if runner is not None:
        found["runner"] = runner_version(runner)
    return found


def spread(values):
    """(max - min) / median in percent."""
    if len(values) < 2:
        return 0.0
    return 100 * (max(values) - min(values)) / statistics.median(values)


def format_rate(value):
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def format_parameters(count):
    return f"{count / 1e6:.1f}M" if count < 1e9 else f"{count / 1e9:.2f}B"


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="float32, or bfloat16 as bf16 weights and inputs on both sides")
    parser.add_argument("--models", default="unet,dit", help="comma-separated: unet, dit (default both)")
    parser.add_argument("--small", action="store_true",
                        help="reduced models for a CPU run: UNet channels 32, DiT with 4 blocks of width 384")
    parser.add_argument("--batch-unet", type=int, help="UNet batch (default 128, 16 with --small)")
    parser.add_argument("--batch-dit", type=int, help="DiT batch (default 128, 8 with --small)")
    parser.add_argument("--warmup", type=int, help="untimed steps per measurement (default 10, 2 with --small)")
    parser.add_argument("--steps", type=int, help="timed steps per measurement (default 50, 6 with --small)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="intra-op CPU threads, both sides (default: torch's, here %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pytorch-autocast", action="store_true",
                        help="with --dtype bfloat16: also measure PyTorch with float32 weights under autocast")
    parser.add_argument("--runner", default="build/runner", help="the runner binary (relative to the checkout)")
    parser.add_argument("--only", choices=("runner", "pytorch"), help="measure one side only (no ratio)")
    parser.add_argument("--output", help="results JSON (default bench/results/model_throughput-<date>-<host>.json)")
    args = parser.parse_args()

    scale = "small" if args.small else "full"
    batch_unet, batch_dit, warmup, steps = DEFAULTS[scale]
    args.batch_unet = args.batch_unet or batch_unet
    args.batch_dit = args.batch_dit or batch_dit
    args.warmup = warmup if args.warmup is None else args.warmup
    args.steps = args.steps or steps
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if not names or any(m not in FULL for m in names):
        parser.error("--models takes a comma-separated list of: unet, dit")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--rounds, --steps and --threads must be >= 1, --warmup >= 0")
    if args.pytorch_autocast and args.dtype != "bfloat16":
        parser.error("--pytorch-autocast goes with --dtype bfloat16")
    if args.pytorch_autocast and args.only == "runner":
        parser.error("--pytorch-autocast measures PyTorch: not with --only runner")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda, but torch sees no CUDA device")
    torch.set_num_threads(args.threads)

    runner = None
    if args.only != "pytorch":
        runner = find_runner(args.runner)

    configs = SMALL if args.small else FULL
    sides = [s for s in ("runner", "pytorch") if args.only in (None, s)]
    all_sides = sides + (["pytorch_autocast"] if args.pytorch_autocast else [])
    precision = {"float32": "float32",
                 "bfloat16": "bf16 weights (model and inputs in bfloat16, both sides; no autocast in Lua)"}
    print(f"{'small' if args.small else 'full'} models on {args.device}, {precision[args.dtype]}; "
          f"{args.warmup} warm-up + {args.steps} timed steps, {args.rounds} rounds, {args.threads} CPU threads",
          flush=True)

    rounds = {name: {side: [] for side in all_sides} for name in names}
    errors = {}
    for name in names:
        label, builder, options = configs[name]
        batch = args.batch_unet if name == "unet" else args.batch_dit
        settings = {"device": args.device, "dtype": args.dtype, "batch": batch, "warmup": args.warmup,
                    "steps": args.steps, "threads": args.threads, "seed": args.seed}
        for round_index in range(args.rounds):
            order = all_sides if round_index % 2 == 0 else sides[::-1] + all_sides[len(sides):]
            for side in order:
                try:
                    if side == "runner":
                        result = measure_runner(runner, builder, options, settings)
                    else:
                        result = measure_pytorch(builder, options, settings, autocast=side == "pytorch_autocast",
                                                 count_flops=round_index == 0 and side == "pytorch")
                except torch.cuda.OutOfMemoryError as error:
                    if side != "pytorch_autocast":
                        raise
                    errors[f"{name}/{side}"] = str(error).splitlines()[0]
                    print(f"  {name}  {side}: out of memory, skipped", flush=True)
                    gc.collect()
                    torch.cuda.empty_cache()
                    continue
                rounds[name][side].append(result)
                print(f"  {name:4s}  round {round_index + 1}/{args.rounds}  {side:16s}  "
                      f"{result['images_per_s']:9.2f} img/s  ({result['steps']} steps in {result['seconds']:.2f} s, "
                      f"loss {result['loss']:.4f})", flush=True)

    summary = []
    for name in names:
        label, builder, options = configs[name]
        row = {"model": name, "label": label, "options": options,
               "batch": args.batch_unet if name == "unet" else args.batch_dit, "ratio": None}
        for side in all_sides:
            rates = [r["images_per_s"] for r in rounds[name][side]]
            row[f"{side}_images_per_s"] = statistics.median(rates) if rates else None
            row[f"{side}_spread_pct"] = spread(rates) if rates else None
        counts = sorted({r["parameters"] for side in sides for r in rounds[name][side]})
        row["parameters"] = counts[0] if len(counts) == 1 else counts
        if len(counts) > 1:
            print(f"warning: {name}: parameter counts differ between the sides: {counts}", file=sys.stderr)
        flops = [r["forward_flops_per_image"] for r in rounds[name].get("pytorch", []) if "forward_flops_per_image" in r]
        row["train_gflop_per_image"] = 3 * flops[0] / 1e9 if flops else None
        if len(sides) == 2:
            row["ratio"] = row["runner_images_per_s"] / row["pytorch_images_per_s"]
        if row["train_gflop_per_image"] is not None:
            for side in all_sides:
                rate = row[f"{side}_images_per_s"]
                row[f"{side}_tflops"] = None if rate is None else rate * row["train_gflop_per_image"] / 1e3
        summary.append(row)
    geomean = None
    if len(sides) == 2:
        geomean = math.exp(statistics.fmean(math.log(row["ratio"]) for row in summary))

    dtype_label = "bf16 weights" if args.dtype == "bfloat16" else "float32"
    print()
    header = (f"{'model':<36} {'params':>7} {'batch':>5} {'dtype':>12} {'runner img/s':>13} "
              f"{'pytorch img/s':>14} {'ratio':>6}")
    if args.pytorch_autocast:
        header += f" {'pytorch autocast img/s':>23}"
    print(header)
    for row in summary:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        params = format_parameters(row["parameters"]) if isinstance(row["parameters"], int) else "?"
        line = (f"{row['label']:<36} {params:>7} {row['batch']:>5} {dtype_label:>12} "
                f"{format_rate(row.get('runner_images_per_s')):>13} {format_rate(row.get('pytorch_images_per_s')):>14} "
                f"{ratio:>6}")
        if args.pytorch_autocast:
            line += f" {format_rate(row.get('pytorch_autocast_images_per_s')):>23}"
        print(line)
    print("spread over rounds, (max - min) / median: " + "; ".join(
        f"{row['model']} " + ", ".join(f"{side} {row[f'{side}_spread_pct']:.0f}%" for side in all_sides
                                       if row[f"{side}_spread_pct"] is not None) for row in summary))
    if device.type == "cuda":
        for row in summary:
            if row["train_gflop_per_image"] is not None:
                print(f"{row['model']}: {row['train_gflop_per_image']:.1f} GFLOP per training image (3 x forward); " +
                      ", ".join(f"{side} {row[f'{side}_tflops']:.0f} TFLOP/s" for side in all_sides
                                if row.get(f"{side}_tflops") is not None))

    fields = {
        "settings": {"device": args.device, "dtype": args.dtype, "precision": precision[args.dtype],
                     "models": names, "small": args.small, "batch_unet": args.batch_unet, "batch_dit": args.batch_dit,
                     "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds, "threads": args.threads,
                     "seed": args.seed, "sides": all_sides, "runner": None if runner is None else str(runner),
                     "step": "zero_grad (set to none), forward on a fixed random batch (timesteps uniform in 0..999, "
                             "random labels for the DiT), MSE against a fixed random target, backward; no "
                             "optimizer; training mode (UNet dropout active)",
                     "timed": "steps after the warm-up, device synchronized before both clock readings; "
                              "images/s = steps x batch / seconds",
                     "pytorch_peer": "tests/reference/models.py, eager"},
        "rounds": rounds,
        "medians": summary,
        "errors": errors,
    }
    write_record("model_throughput", machine_info_with_gpu(device), versions(runner), fields, geomean, args.output)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
