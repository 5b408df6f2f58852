# Profile: CUDA kernel time per training step, runner's step against PyTorch eager's, kernel by kernel.
"""Where the GPU time of a training step goes: the CUDA kernels of runner's step (`runner --profile` over
bench/train_step.lua) and of the PyTorch eager reference of bench/train_step.py (torch.profiler), for one model,
each as a table of the kernels with the most time per step, then the kernel time per step of each side.

    ~/.cache/runner/venv/bin/python bench/step_profile.py --model dit-b [--steps 3] [--warmup 5] [--graph]
        [--runner build/runner]

--graph profiles runner's steps replayed from a CUDA graph. The last line, `ratio X.XX`, is PyTorch eager's kernel
time per step over runner's (above 1: runner's kernels take less time).
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_record import runner_version, write_record  # noqa: E402
from runner_side import REPO_ROOT, find_runner  # noqa: E402
from train_step import MODELS, machine_info_with_gpu, model_options, pytorch_step  # noqa: E402

ROWS = 20


def runner_profile(runner, lua, batch, warmup, steps, graph):
    first, last = warmup + 1, warmup + steps
    command = [str(runner), "--profile", f"{first}:{last}", str(REPO_ROOT / "bench" / "train_step.lua"),
               *[f"{k}={v}" for k, v in lua.items()], f"batch={batch}", f"warmup={warmup}", f"steps={steps}",
               f"graph={'true' if graph else 'false'}"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"runner failed ({done.returncode}): {' '.join(command)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    text = done.stdout + done.stderr
    total = re.search(r"CUDA kernel time: ([0-9.]+) ms", text)
    if not total:
        sys.exit(f"runner printed no kernel time: {' '.join(command)}\n{text[-3000:]}")
    table = text[text.index("CUDA kernel"):total.end()]
    return float(total.group(1)) / steps, table


def pytorch_profile(builder, options, batch, warmup, steps):
    step, _ = pytorch_step(builder, options, {"device": "cuda", "batch": batch}, compiled=False)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = []
    for event in prof.key_averages():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        micros = getattr(event, "self_device_time_total", None)
        if micros is None:
            micros = event.self_cuda_time_total
        kernels.append((event.key, micros / 1000.0, event.count))
    kernels.sort(key=lambda k: -k[1])
    total = sum(k[1] for k in kernels)
    lines = [f"{'CUDA kernel':<48} {'ms':>11} {'%':>7} {'calls':>7}"]
    for name, ms, calls in kernels[:ROWS]:
        name = name if len(name) <= 48 else name[:45] + "..."
        lines.append(f"{name:<48} {ms:11.3f} {100 * ms / total:6.1f}% {calls:7d}")
    lines.append(f"CUDA kernel time: {total:.3f} ms")
    return total / steps, "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="dit-b", choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--graph", action="store_true")
    parser.add_argument("--runner", default="build/runner")
    parser.add_argument("--output")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_profile: needs a CUDA device (it compares CUDA kernel time)")
    runner = find_runner(args.runner)
    label, builder, lua, batch = MODELS[args.model]
    options = model_options(builder, lua, small=False)
    runner_ms, runner_table = runner_profile(runner, lua, batch, args.warmup, args.steps, args.graph)
    eager_ms, eager_table = pytorch_profile(builder, options, batch, args.warmup, args.steps)
    print(f"{label}, batch {batch}: {args.steps} profiled steps after {args.warmup}\n")
    print(f"runner{' (CUDA graph)' if args.graph else ''}, over {args.steps} steps:\n{runner_table}\n")
    print(f"PyTorch eager, over {args.steps} steps:\n{eager_table}\n")
    print(f"{'side':<14} {'kernel ms/step':>15}")
    print(f"{'runner':<14} {runner_ms:15.3f}")
    print(f"{'eager':<14} {eager_ms:15.3f}")
    ratio = eager_ms / runner_ms
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "runner": runner_version(runner)}
    write_record("step_profile", machine_info_with_gpu(torch.device("cuda")), versions,
                 {"settings": vars(args), "model": args.model, "batch": batch, "runner_kernel_ms_per_step": runner_ms,
                  "eager_kernel_ms_per_step": eager_ms, "runner_table": runner_table, "eager_table": eager_table},
                 ratio, args.output)


if __name__ == "__main__":
    main()
