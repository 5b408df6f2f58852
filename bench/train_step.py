# Benchmark: the full training step users run, runner's train:step against PyTorch eager and torch.compile.
"""Images per second of the whole DDPM training step: timestep and noise sampling, the forward process,
forward and backward under bf16 autocast (fp32 on the CPU), the loss of the official DDPM/DiT code (MSE, plus
the variational bound for DiT's learned sigma), clip 1.0, AdamW, an fp32 EMA (decay 0.9999).

    ~/.cache/runner/venv/bin/python bench/train_step.py [--device cuda|cpu] [--models quickstart,dit-s,unet,dit-b,dit-xl]
        [--steps 20] [--warmup 5] [--rounds 3] [--small] [--no-compile] [--runner build/runner]

- runner: `runner bench/train_step.lua` (runner.trainer with amp "auto", fused AdamW on CUDA, clip 1.0, EMA)
  as a subprocess; it prints a RESULT line. On CUDA also "graph": the same with `graph=true`, each step replayed
  from a CUDA graph (leave it out with --no-graph).
- PyTorch eager: tests/reference/models.py (the same UNet and DiT, same parameter names), the loss of
  tests/reference/diffusion.py (the official code's: its schedule in float64 NumPy, gathered per step),
  `torch.autocast(bfloat16)`, `clip_grad_norm_`, `torch.optim.AdamW(fused=True)` on CUDA, EMA by
  `torch._foreach_lerp_` over float32 copies.
- torch.compile: the same with the model wrapped in `torch.compile` (default mode); its warm-up includes
  the compilation.
- Models (batch): the main job's UNet on 16x16 images, experiments/quickstart.lua's (32); DiT-S/2 (64); the
  CIFAR-10 DDPM UNet, 35.7M (128); DiT-B/2 (128) and DiT-XL/2 (256); the DiTs on 32x32x4 latents with 1000
  classes. --small: a UNet of width 32 and DiT-S/2, all at batch 8, for a CPU run.
- Each measurement: --warmup untimed steps, a device sync, --steps timed steps, a sync. Rounds alternate the
  sides; medians are reported with MFU from FLOPs counted by torch's FlopCounterMode (3 x forward) against
  the device's dense bf16 peak (H100 SXM: 989 TFLOP/s; set --peak-tflops for another), and peak memory.

A model whose measurement fails (e.g. out of memory) is reported as failed and the others are kept.
The last line, `ratio X.XX`, is the geometric mean over models of runner images/s over PyTorch eager's, with
runner's steps replayed as CUDA graphs where they were measured.
"""

import argparse
import copy
import math
import statistics
import sys
import time
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT / "tests" / "reference"))
import diffusion as reference_diffusion  # noqa: E402
import models as reference  # noqa: E402
from bench_record import machine_info, runner_version, write_record  # noqa: E402
from runner_side import find_runner, run_runner_script  # noqa: E402

TIMESTEPS = 1000
UNET = {"channels": 128, "mults": (1, 2, 2, 2), "blocks": 2, "attention": (16,), "dropout": 0.1, "image": 32,
        "in_channels": 3, "classes": 0}
# experiments/quickstart.lua's UNet (the main job) on 16x16 images
QUICKSTART_UNET = {"channels": 32, "mults": (1, 2, 2), "blocks": 1, "attention": (8,), "dropout": 0.0, "image": 16,
                   "in_channels": 3, "classes": 0, "groups": 8}
DIT_SIZES = {"DiT-S/2": (12, 384, 6), "DiT-B/2": (12, 768, 12), "DiT-XL/2": (28, 1152, 16)}
# name -> (label, builder, lua overrides, batch, small batch)
MODELS = {
    "quickstart": ("main job UNet 16x16", "unet", {"model": "quickstart"}, 32),
    "dit-s": ("DiT-S/2 32x32x4", "dit", {"model": "dit", "size": "DiT-S/2"}, 64),
    "unet": ("DDPM UNet CIFAR-10", "unet", {"model": "unet"}, 128),
    "dit-b": ("DiT-B/2 32x32x4", "dit", {"model": "dit", "size": "DiT-B/2"}, 128),
    "dit-xl": ("DiT-XL/2 32x32x4", "dit", {"model": "dit", "size": "DiT-XL/2"}, 256),
}


def forward_flops(net, x, t, y):
    """FLOPs of one forward pass at batch 1, counted by torch's FlopCounterMode (matmuls, convolutions,
    attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        net(x[:1], t[:1], None if y is None else y[:1])
    return counter.get_total_flops()


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


def spread(values):
    """(max - min) / median in percent."""
    if len(values) < 2:
        return 0.0
    return 100 * (max(values) - min(values)) / statistics.median(values)


def model_options(builder, lua, small):
    if lua["model"] == "quickstart":
        return dict(QUICKSTART_UNET)
    if builder == "unet":
        return {**UNET, "channels": 32} if small else dict(UNET)
    depth, hidden, heads = DIT_SIZES["DiT-S/2" if small else lua["size"]]
    return {"depth": depth, "hidden": hidden, "heads": heads, "patch": 2, "image": 32, "in_channels": 4,
            "classes": 1000, "learn_sigma": True}


def measure_runner(runner, lua, settings, graph=False):
    overrides = {**lua, **{k: settings[k] for k in ("device", "batch", "steps", "warmup")}}
    if graph:
        overrides["graph"] = "true"
    if settings["small"] and lua["model"] == "unet":
        overrides["channels"] = 32
    elif settings["small"] and lua["model"] == "dit":
        overrides["size"] = "DiT-S/2"
    return run_runner_script(runner, "train_step.lua", overrides)


def pytorch_step(builder, options, settings, compiled):
    """The PyTorch side's training step as a function, and the model it trains."""
    device = torch.device(settings["device"])
    on_cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = reference.build(builder, options).to(device).train()
    ema = [p.detach().clone().float() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0, fused=on_cuda)
    forward = torch.compile(model) if compiled else model
    schedule = reference_diffusion.make_schedule("linear", TIMESTEPS)
    batch = settings["batch"]
    x0 = torch.randn(batch, options["in_channels"], options["image"], options["image"], device=device)
    labels = torch.randint(0, 1000, (batch,), device=device) if options.get("classes", 0) > 0 else None

    def step():
        optimizer.zero_grad(set_to_none=True)
        t = torch.randint(0, TIMESTEPS, (batch,), device=device)
        noise = torch.randn_like(x0)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_cuda):
            loss, _, _ = reference_diffusion.training_loss(schedule, forward, x0, t, noise, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema, [p.float() for p in model.parameters()], 1 - 0.9999)
        return loss

    return step, model


def measure_pytorch(builder, options, settings, compiled):
    device = torch.device(settings["device"])
    on_cuda = device.type == "cuda"
    batch = settings["batch"]
    step, model = pytorch_step(builder, options, settings, compiled)

    def sync():
        if on_cuda:
            torch.cuda.synchronize(device)

    warmup_start = time.perf_counter()
    for _ in range(settings["warmup"] + (3 if compiled else 0)):
        step()
    sync()
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(settings["steps"]):
        loss = step()
    last = loss.item()
    sync()
    seconds = time.perf_counter() - start
    result = {"images_per_s": settings["steps"] * batch / seconds, "step_ms": 1000 * seconds / settings["steps"],
              "seconds": seconds, "warmup_s": start - warmup_start, "loss": last,
              "parameters": sum(p.numel() for p in model.parameters()),
              "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if on_cuda else None}
    del model, step
    if on_cuda:
        torch.cuda.empty_cache()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="quickstart,dit-s,unet,dit-b,dit-xl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--no-graph", action="store_true", help="leave runner's CUDA-graph steps out")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak for MFU")
    parser.add_argument("--runner", default="build/runner")
    parser.add_argument("--output")
    args = parser.parse_args()
    names = args.models.split(",")
    for name in names:
        if name not in MODELS:
            parser.error(f"unknown model '{name}' ({', '.join(MODELS)})")
    runner = find_runner(args.runner)
    device = torch.device(args.device)
    graph = args.device == "cuda" and not args.no_graph
    sides = ["runner"] + (["graph"] if graph else []) + ["eager"] + ([] if args.no_compile else ["compile"])
    print(f"{'small' if args.small else 'full'} models on {args.device}; {args.warmup} + {args.steps} steps, "
          f"{args.rounds} rounds", flush=True)
    rows = []
    for name in names:
        label, builder, lua, batch = MODELS[name]
        options = model_options(builder, lua, args.small)
        settings = {"device": args.device, "batch": 8 if args.small else batch, "steps": args.steps,
                    "warmup": args.warmup, "small": args.small}
        measured = {side: [] for side in sides}
        try:
            for round_index in range(args.rounds):
                order = sides if round_index % 2 == 0 else list(reversed(sides))
                for side in order:
                    if side in ("runner", "graph"):
                        result = measure_runner(runner, lua, settings, graph=side == "graph")
                    else:
                        result = measure_pytorch(builder, options, settings, compiled=side == "compile")
                    measured[side].append(result)
                    print(f"  {name:6s} round {round_index + 1}/{args.rounds}  {side:8s} "
                          f"{result['images_per_s']:9.1f} img/s", flush=True)
        except (Exception, SystemExit) as error:  # noqa: BLE001 - reported, and the other models still run
            print(f"  {name:6s} FAILED: {str(error).strip().splitlines()[-1] if str(error).strip() else error!r}",
                  flush=True)
            rows.append({"model": name, "label": label, "batch": settings["batch"], "error": str(error),
                         "measurements": measured})
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        net = reference.build(builder, options).to(device)
        x = torch.randn(1, options["in_channels"], options["image"], options["image"], device=device)
        t = torch.zeros(1, dtype=torch.long, device=device)
        y = torch.zeros(1, dtype=torch.long, device=device) if options.get("classes", 0) > 0 else None
        train_flops = 3 * forward_flops(net, x, t, y)
        del net
        row = {"model": name, "label": label, "batch": settings["batch"], "train_flops_per_image": train_flops,
               "measurements": measured}
        for side in sides:
            rate = statistics.median(r["images_per_s"] for r in measured[side])
            memory = [r.get("peak_memory_gib") for r in measured[side] if r.get("peak_memory_gib") is not None]
            row[side] = {"images_per_s": rate, "spread_percent": spread([r["images_per_s"] for r in measured[side]]),
                         "mfu_percent": 100 * rate * train_flops / (args.peak_tflops * 1e12) if args.device == "cuda" else None,
                         "peak_memory_gib": max(memory) if memory else None}
        rows.append(row)
    print()
    best = "graph" if graph else "runner"
    header = f"{'model':10s} {'batch':>5s}" + "".join(f" {side + ' img/s':>14s}" for side in sides) + \
        f" {'vs eager':>9s}" + ("" if args.no_compile else f" {'vs compile':>10s}") + \
        "".join(f" {'MFU ' + side:>11s}" for side in sides) + f" {'mem GiB r/e':>12s}"
    print(header)
    ratios = []
    for row in rows:
        if "error" in row:
            print(f"{row['model']:10s} {row['batch']:5d} failed: {row['error'].strip().splitlines()[-1:]}")
            continue
        ratio = row[best]["images_per_s"] / row["eager"]["images_per_s"]
        ratios.append(ratio)
        line = f"{row['model']:10s} {row['batch']:5d}" + "".join(f" {row[side]['images_per_s']:14.1f}" for side in sides)
        line += f" {ratio:9.2f}"
        if not args.no_compile:
            line += f" {row[best]['images_per_s'] / row['compile']['images_per_s']:10.2f}"
        for side in sides:
            mfu = row[side]["mfu_percent"]
            line += f" {'-' if mfu is None else f'{mfu:.1f}%':>11s}"
        mem = (row["runner"]["peak_memory_gib"], row["eager"]["peak_memory_gib"])
        line += f" {'-' if mem[0] is None else f'{mem[0]:.1f}/{mem[1]:.1f}':>12s}"
        print(line)
    print(f"(vs eager, vs compile: runner's {'CUDA-graph' if best == 'graph' else 'eager'} steps)")
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else float("nan")
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "runner": runner_version(runner)}
    write_record("train_step", machine_info_with_gpu(device), versions,
                 {"settings": vars(args), "models": rows}, geomean, args.output)


if __name__ == "__main__":
    main()
