# Benchmark: the full training step users run, runner's train:step against PyTorch eager and torch.compile.
"""Images per second of the whole DDPM training step: timestep and noise sampling, the forward process,
forward and backward under bf16 autocast (fp32 on the CPU), the loss of the official DDPM/DiT code (MSE, plus
the variational bound for DiT's learned sigma), clip 1.0, AdamW, an fp32 EMA (decay 0.9999).

    ~/.cache/runner/venv/bin/python bench/train_step.py [--device cuda|cpu] [--models quickstart,dit-s,unet,dit-b,dit-xl]
        [--steps 20] [--warmup 5] [--rounds 3] [--small] [--no-compile] [--no-graph] [--no-fused] [--no-fp8]
        [--runner build/runner]

- runner: `runner bench/train_step.lua` (runner.trainer with amp "auto", fused AdamW on CUDA, clip 1.0, EMA)
  as a subprocess; it prints a RESULT line. On CUDA also "graph": the same with `graph=true`, each step replayed
  from a CUDA graph (leave it out with --no-graph).
- runner fused (DiT models): the same with `fused=true cast_weights_once=true` (nn.DiT's fused block, the weights
  cast to bf16 once per step), with `graph=true` where the graph side runs (--no-fused leaves it out).
- runner fp8 (DiT models): runner fused plus `amp=fp8` (the DiT blocks' Linear layers in FP8); on a device without
  FP8 (the CPU, GPUs under compute capability 8.9) recorded as skipped with the reason (--no-fp8 leaves it out).
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
  the device's dense bf16 peak (H100 SXM: 989 TFLOP/s; set --peak-tflops for another), the fp8 side's too (its
  MFU is against the bf16 peak, not the FP8 one).
- Peak memory of each side, the most over its rounds: on CUDA the caching allocator's peak
  (max_memory_allocated, from the model's creation through the warm-up and the timed steps; runner reports its
  own from bench/train_step.lua); on the CPU, which has no allocator peak, the peak RSS of the side's own process
  (VmHWM, which the process reads from /proc/self/status after its timed steps; getrusage's maxrss would start
  from the parent's size), so there the PyTorch sides run in a child process of this script as runner does. The
  table gives it per side and runner's over eager's.

Each side of each model is measured inside its own failure boundary: a side that fails (out of memory, say) is
recorded in the table and the JSON with its error text and is not tried again in later rounds; the other sides
and models still run, the JSON is written with everything measured, and the script then exits with status 1
naming what failed. The last line on success, `ratio X.XX`, is the geometric mean over models of runner
images/s over PyTorch eager's, with runner's steps replayed as CUDA graphs where they were measured. Before it,
`ratio fused/compile X.XX` and `ratio fp8/compile-bf16 X.XX`: the geometric means over the DiT models of the fused
and fp8 sides' images/s over torch.compile's (bf16 autocast), where both were measured.
"""

import argparse
import gc
import json
import math
import re
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
from runner_side import SideFailed, find_runner, run_result_command, run_runner_script  # noqa: E402

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
# runner's sides of bench/train_step.lua: name -> its overrides (graph=true is added where the graph side runs)
RUNNER_SIDES = {"runner": {}, "graph": {"graph": "true"},
                "fused": {"fused": "true", "cast_weights_once": "true"},
                "fp8": {"fused": "true", "cast_weights_once": "true", "amp": "fp8"}}
DIT_ONLY_SIDES = ("fused", "fp8")  # nn.DiT's fused block and FP8 layers
NOT_A_DIT = "not a DiT model (the fused block and the FP8 layers are nn.DiT's)"
# what "peak memory" is on each device type
MEMORY_MEASURES = {
    "cuda": "CUDA allocator peak (max_memory_allocated): model creation, warm-up and timed steps",
    "cpu": "peak RSS of the side's own process (VmHWM), libraries and interpreter included",
}
# lines of an error's text that say it ran out of memory (CUDA, the CPU allocator, cuBLAS's workspace)
OUT_OF_MEMORY_SIGNS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory",
                       "std::bad_alloc", "cublas_status_alloc_failed")


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


def fp8_unavailable(device):
    """Why runner's amp=fp8 cannot run on `device` (a torch.device), or None when it can (CUDA, compute capability
    8.9 or later)."""
    if device.type != "cuda":
        return "amp=fp8 needs a CUDA device of compute capability 8.9 or later (FP8 tensor cores); this is the CPU"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return (f"amp=fp8 needs a CUDA device of compute capability 8.9 or later (FP8 tensor cores); "
                f"{torch.cuda.get_device_name(device)} is {major}.{minor}")
    return None


def geometric_mean(values):
    values = [value for value in values if value is not None]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


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


def process_memory_gib(field):
    """This process's resident set size in GiB from /proc/self/status: "VmRSS" now, "VmHWM" its peak since the
    program started (its own: getrusage's maxrss starts from the parent's size at the fork); None without /proc."""
    try:
        match = re.search(rf"^{field}:\s*(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) / 2**20 if match else None


def failure_text(error):
    """The error of a failed side in one line: "out of memory: <the line saying so>" when it ran out of memory;
    else for a process (SideFailed) the error in its output (a Lua error, the line before "stack traceback:"; a
    "runner: " line; a Python exception's last line) or what failed and how (with its output's last line unless a
    signal ended it); else the exception's first line."""
    output = error.output if isinstance(error, SideFailed) else (str(error).strip() or repr(error))
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if any(sign in line.lower() for sign in OUT_OF_MEMORY_SIGNS):
            return f"out of memory: {line}"
    if not isinstance(error, SideFailed):
        return lines[0]
    lua_errors = [before for before, line in zip(lines, lines[1:]) if line == "stack traceback:"]
    runner_errors = [line for line in lines if line.startswith("runner: ")]
    python_errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)]
    found = lua_errors[:1] or runner_errors[:1] or python_errors[-1:]
    if found:
        return found[0]
    return error.reason + (f": {lines[-1]}" if lines and "killed by" not in error.reason else "")


def release_memory(device, compiled):
    """Frees what a PyTorch side left in this process (after an error too, once its traceback is gone): the
    compiled graphs, unreachable cycles and the CUDA allocator's cached blocks."""
    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        except Exception as error:  # noqa: BLE001 - a broken CUDA context fails the later in-process sides on its own
            print(f"  (freeing CUDA memory failed: {failure_text(error)})", flush=True)


def measure_runner(runner, lua, settings, side="runner"):
    """One measurement of runner side `side` (RUNNER_SIDES; fused and fp8 with graph=true where the graph side
    runs): bench/train_step.lua's RESULT (with its CUDA peaks and its process's peak RSS); raises SideFailed when
    runner fails."""
    overrides = {**lua, **{k: settings[k] for k in ("device", "batch", "steps", "warmup")}, **RUNNER_SIDES[side]}
    if side in DIT_ONLY_SIDES and settings.get("graph"):
        overrides["graph"] = "true"
    if settings["small"] and lua["model"] == "unet":
        overrides["channels"] = 32
    elif settings["small"] and lua["model"] == "dit":
        overrides["size"] = "DiT-S/2"
    return run_runner_script(runner, "train_step.lua", overrides, exit_on_failure=False)


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
    """One PyTorch measurement in this process; on CUDA with the allocator's peaks (whole measurement, timed steps)."""
    device = torch.device(settings["device"])
    on_cuda = device.type == "cuda"
    batch = settings["batch"]
    start_rss = process_memory_gib("VmRSS")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    step, model = pytorch_step(builder, options, settings, compiled)

    def sync():
        if on_cuda:
            torch.cuda.synchronize(device)

    warmup_start = time.perf_counter()
    for _ in range(settings["warmup"] + (3 if compiled else 0)):
        step()
    sync()
    warmup_peak_bytes = torch.cuda.max_memory_allocated(device) if on_cuda else None
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(settings["steps"]):
        loss = step()
    last = loss.item()
    sync()
    seconds = time.perf_counter() - start
    timed_peak_bytes = torch.cuda.max_memory_allocated(device) if on_cuda else None
    result = {"images_per_s": settings["steps"] * batch / seconds, "step_ms": 1000 * seconds / settings["steps"],
              "seconds": seconds, "warmup_s": start - warmup_start, "loss": last,
              "parameters": sum(p.numel() for p in model.parameters()),
              "peak_memory_gib": max(warmup_peak_bytes, timed_peak_bytes) / 2**30 if on_cuda else None,
              "timed_peak_memory_gib": timed_peak_bytes / 2**30 if on_cuda else None, "start_rss_gib": start_rss,
              "threads": torch.get_num_threads()}
    del model, step
    return result


def measure_pytorch_in_child(name, side, settings):
    """One PyTorch measurement in a child process running this script with --pytorch-child (on the CPU, so that
    the peak RSS it reports, "process_peak_rss_gib", is the side's own); raises SideFailed when it fails."""
    command = [sys.executable, str(Path(__file__).resolve()), "--pytorch-child", side, "--models", name,
               "--device", settings["device"], "--steps", str(settings["steps"]), "--warmup", str(settings["warmup"])]
    if settings["small"]:
        command.append("--small")
    return run_result_command(command, what=f"PyTorch {side}")


def measure_side(side, name, runner, settings):
    """One measurement of one side of model `name`: runner, graph, fused or fp8 (a runner process), eager or compile
    (in this process on CUDA, in a child process on the CPU)."""
    label, builder, lua, batch = MODELS[name]
    if side in RUNNER_SIDES:
        return measure_runner(runner, lua, settings, side)
    if settings["device"] == "cpu":
        return measure_pytorch_in_child(name, side, settings)
    options = model_options(builder, lua, settings["small"])
    return measure_pytorch(builder, options, settings, compiled=side == "compile")


def peak_memory_gib(result, device_type):
    """A measurement's peak memory by the device's measure (MEMORY_MEASURES); None when it was not measured."""
    return result.get("peak_memory_gib") if device_type == "cuda" else result.get("process_peak_rss_gib")


def train_flops_per_image(builder, options, device):
    """3 x the FLOPs of one forward pass at batch 1 (forward, and backward as twice the forward)."""
    net = reference.build(builder, options).to(device)
    x = torch.randn(1, options["in_channels"], options["image"], options["image"], device=device)
    t = torch.zeros(1, dtype=torch.long, device=device)
    y = torch.zeros(1, dtype=torch.long, device=device) if options.get("classes", 0) > 0 else None
    flops = 3 * forward_flops(net, x, t, y)
    del net
    return flops


def run_pytorch_child(args):
    """--pytorch-child SIDE: one measurement of one model's PyTorch side, printed as `RESULT {json}`."""
    label, builder, lua, batch = MODELS[args.models]
    settings = {"device": args.device, "batch": 8 if args.small else batch, "steps": args.steps,
                "warmup": args.warmup, "small": args.small}
    result = measure_pytorch(builder, model_options(builder, lua, args.small), settings,
                             compiled=args.pytorch_child == "compile")
    result["process_peak_rss_gib"] = process_memory_gib("VmHWM")
    print("RESULT " + json.dumps(result), flush=True)


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
    parser.add_argument("--no-fused", action="store_true", help="leave runner's fused DiT side out")
    parser.add_argument("--no-fp8", action="store_true", help="leave runner's fp8 DiT side out")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the device's dense bf16 peak for MFU (the fp8 side's too)")
    parser.add_argument("--runner", default="build/runner")
    parser.add_argument("--output")
    parser.add_argument("--pytorch-child", choices=("eager", "compile"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.models.split(",")
    for name in names:
        if name not in MODELS:
            parser.error(f"unknown model '{name}' ({', '.join(MODELS)})")
    if args.pytorch_child:
        return run_pytorch_child(args)
    runner = find_runner(args.runner)
    device = torch.device(args.device)
    graph = args.device == "cuda" and not args.no_graph
    any_dit = any(MODELS[name][1] == "dit" for name in names)
    extra = [side for side, off in (("fused", args.no_fused), ("fp8", args.no_fp8)) if any_dit and not off]
    sides = ["runner"] + (["graph"] if graph else []) + extra + ["eager"] + ([] if args.no_compile else ["compile"])
    best = "graph" if graph else "runner"  # runner's side in the ratios of images/s
    # sides left out of every model with the reason (recorded as skipped, not failed)
    device_skips = {"fp8": fp8_unavailable(device)} if "fp8" in sides else {}
    device_skips = {side: reason for side, reason in device_skips.items() if reason}
    memory_measure = MEMORY_MEASURES[device.type]
    print(f"{'small' if args.small else 'full'} models on {args.device}; {args.warmup} + {args.steps} steps, "
          f"{args.rounds} rounds; peak memory: {memory_measure}", flush=True)
    for side, reason in device_skips.items():
        print(f"  runner {side} skipped: {reason}", flush=True)
    rows = []
    failures = []
    for name in names:
        label, builder, lua, batch = MODELS[name]
        options = model_options(builder, lua, args.small)
        settings = {"device": args.device, "batch": 8 if args.small else batch, "steps": args.steps,
                    "warmup": args.warmup, "small": args.small, "graph": graph}
        skips = {side: NOT_A_DIT for side in DIT_ONLY_SIDES if side in sides and builder != "dit"}
        skips.update({side: reason for side, reason in device_skips.items() if side not in skips})
        measured = {side: [] for side in sides if side not in skips}
        errors = {}
        for round_index in range(args.rounds):
            order = sides if round_index % 2 == 0 else list(reversed(sides))
            for side in order:
                if side in errors or side in skips:
                    continue
                where = f"  {name:6s} round {round_index + 1}/{args.rounds}  {side:8s}"
                try:
                    result = measure_side(side, name, runner, settings)
                except Exception as error:  # noqa: BLE001 - recorded, and the other sides and models still run
                    errors[side] = {"error": failure_text(error), "error_output": str(error).strip()[-6000:],
                                    "round": round_index + 1}
                    print(f"{where} FAILED: {errors[side]['error']}", flush=True)
                else:
                    measured[side].append(result)
                    peak = peak_memory_gib(result, device.type)
                    print(f"{where} {result['images_per_s']:9.1f} img/s"
                          f"{'' if peak is None else f'  peak {peak:.3f} GiB'}", flush=True)
                # the exception and its traceback (which held the side's tensors) are gone here
                release_memory(device, compiled=side == "compile")
        row = {"model": name, "label": label, "batch": settings["batch"], "train_flops_per_image": None,
               "memory_measure": memory_measure, "measurements": measured}
        try:
            row["train_flops_per_image"] = train_flops_per_image(builder, options, device)
        except Exception as error:  # noqa: BLE001 - MFU is left out, the rates are kept
            row["flops_error"] = failure_text(error)
            print(f"  {name:6s} FLOP count failed: {row['flops_error']}", flush=True)
        release_memory(device, compiled=False)
        train_flops = row["train_flops_per_image"]
        for side in sides:
            if side in skips:
                row[side] = {"skipped": skips[side]}
                continue
            if side in errors:
                row[side] = {**errors[side], "rounds_measured": len(measured[side])}
                failures.append({"model": name, "side": side, "error": errors[side]["error"]})
                continue
            rates = [r["images_per_s"] for r in measured[side]]
            rate = statistics.median(rates)
            peaks = [peak_memory_gib(r, device.type) for r in measured[side]]
            peaks = [peak for peak in peaks if peak is not None]
            row[side] = {"images_per_s": rate, "spread_percent": spread(rates),
                         "mfu_percent": 100 * rate * train_flops / (args.peak_tflops * 1e12)
                         if args.device == "cuda" and train_flops else None,
                         "peak_memory_gib": max(peaks) if peaks else None}

        def rate_ratio(numerator, denominator):
            if "images_per_s" not in row[numerator] or "images_per_s" not in row[denominator]:
                return None
            return row[numerator]["images_per_s"] / row[denominator]["images_per_s"]

        def memory_ratio(numerator, denominator):
            memory = (row[numerator].get("peak_memory_gib"), row[denominator].get("peak_memory_gib"))
            return memory[0] / memory[1] if None not in memory and memory[1] else None

        row["runner_over_eager"] = rate_ratio(best, "eager")
        row["runner_over_compile"] = None if args.no_compile else rate_ratio(best, "compile")
        row["peak_memory_runner_over_eager"] = memory_ratio("runner", "eager")
        for side in extra:  # the fused and fp8 sides against eager, compile (bf16) and, fp8, the fused side
            row[f"{side}_over_eager"] = rate_ratio(side, "eager")
            row[f"{side}_over_compile"] = None if args.no_compile else rate_ratio(side, "compile")
            row[f"peak_memory_{side}_over_eager"] = memory_ratio(side, "eager")
        if "fused" in extra and "fp8" in extra:
            row["fp8_over_fused"] = rate_ratio("fp8", "fused")
            row["peak_memory_fp8_over_fused"] = memory_ratio("fp8", "fused")
        rows.append(row)
    print()
    to_compile = [] if args.no_compile else [side for side in extra]  # "fused/comp", "fp8/comp" columns
    header = f"{'model':10s} {'batch':>5s}" + "".join(f" {side + ' img/s':>14s}" for side in sides) + \
        f" {'vs eager':>9s}" + ("" if args.no_compile else f" {'vs compile':>10s}") + \
        "".join(f" {side + '/comp':>10s}" for side in to_compile) + \
        "".join(f" {'MFU ' + side:>11s}" for side in sides) + \
        "".join(f" {side + ' GiB':>12s}" for side in sides) + f" {'mem r/e':>8s}" + \
        "".join(f" {'mem ' + side[:2] + '/e':>8s}" for side in extra)
    print(header)

    def cell(value, width, text):
        return f" {'-' if value is None else text.format(value):>{width}s}"

    def side_cell(side_row, key, width, text):
        """A side's value, or what stands in for it: failed, skipped (for this device), n/a (not a DiT)."""
        if "error" in side_row:
            return f" {'failed':>{width}s}"
        if "skipped" in side_row:
            return f" {'n/a' if side_row['skipped'] == NOT_A_DIT else 'skipped':>{width}s}"
        return cell(side_row.get(key), width, text)

    for row in rows:
        line = f"{row['model']:10s} {row['batch']:5d}"
        line += "".join(side_cell(row[side], "images_per_s", 14, "{:.1f}") for side in sides)
        line += cell(row["runner_over_eager"], 9, "{:.2f}")
        if not args.no_compile:
            line += cell(row["runner_over_compile"], 10, "{:.2f}")
        line += "".join(side_cell(row[side], None, 10, "") if "skipped" in row[side]
                        else cell(row.get(f"{side}_over_compile"), 10, "{:.2f}") for side in to_compile)
        line += "".join(side_cell(row[side], "mfu_percent", 11, "{:.1f}%") for side in sides)
        line += "".join(side_cell(row[side], "peak_memory_gib", 12, "{:.3f}") for side in sides)
        line += cell(row["peak_memory_runner_over_eager"], 8, "{:.2f}")
        line += "".join(side_cell(row[side], None, 8, "") if "skipped" in row[side]
                        else cell(row.get(f"peak_memory_{side}_over_eager"), 8, "{:.2f}") for side in extra)
        print(line)
    print(f"(vs eager, vs compile: runner's {'CUDA-graph' if best == 'graph' else 'eager'} steps; "
          + ("fused: fused=true cast_weights_once=true" + (" graph=true" if graph else "") + "; " if "fused" in extra
             else "")
          + ("fp8: the same with amp=fp8; " if "fp8" in extra else "")
          + ("side/comp: over torch.compile (bf16 autocast on CUDA); " if to_compile else "")
          + (f"MFU: against the bf16 peak{', fp8' + chr(39) + 's too' if 'fp8' in extra else ''}; "
             if args.device == "cuda" else "")
          + f"GiB: {memory_measure}; mem r/e: runner's peak over eager's"
          + "".join(f"; mem {side[:2]}/e: the {side} side's over eager's" for side in extra) + ")")
    skipped = [{"model": row["model"], "side": side, "reason": row[side]["skipped"]}
               for row in rows for side in sides if "skipped" in row[side] and row[side]["skipped"] != NOT_A_DIT]
    for skip in skipped:
        print(f"skipped: {skip['model']} {skip['side']}: {skip['reason']}")
    for failure in failures:
        print(f"failed: {failure['model']} {failure['side']}: {failure['error']}")
    # the fused and fp8 sides over torch.compile, geometric means over the DiT models where both were measured
    extra_geomeans = {}
    for side, line_name in (("fused", "fused/compile"), ("fp8", "fp8/compile-bf16")):
        if side not in extra:
            continue
        value = geometric_mean([row.get(f"{side}_over_compile") for row in rows])
        extra_geomeans[f"ratio_{side}_over_compile_geomean"] = value
        reason = device_skips.get(side) or ("--no-compile" if args.no_compile
                                            else "no DiT model measured on both sides")
        print(f"ratio {line_name} " + (f"{value:.2f}" if value is not None else f"- ({reason})"))
    geomean = geometric_mean([row["runner_over_eager"] for row in rows])
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "runner": runner_version(runner)}
    write_record("train_step", machine_info_with_gpu(device), versions,
                 {"settings": vars(args), "memory_measure": memory_measure, "models": rows, "skipped": skipped,
                  "failures": failures, **extra_geomeans},
                 geomean, args.output)
    if failures:
        sys.exit(f"train_step: {len(failures)} side(s) failed, the rest recorded: " +
                 "; ".join(f"{f['model']} {f['side']} ({f['error']})" for f in failures))


if __name__ == "__main__":
    main()
