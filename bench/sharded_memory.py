# Benchmark: per-rank model-state memory of runner's sharded data parallel (ZeRO-1, -2, -3) against the formulas.
"""Bytes of model state each rank holds (`train:state_bytes()`: weights, gradients, AdamW moments, fp32 EMA) and
each rank's peak RSS, for DiT-S/2 and DiT-B/2 trained with `runner.trainer { shard = ... }` at 1, 2 and 4 ranks,
against the ZeRO formulas for runner's state (P parameters, N ranks):

    shard = "none"       20 B/param (4 weights + 4 gradients + 8 AdamW + 4 EMA) on every rank
    shard = "optimizer"  8 + 12/N   (ZeRO-1: full weights and gradients, the rank's rows of AdamW and the EMA)
    shard = "gradients"  4 + 16/N   (ZeRO-2: the averaged gradients kept as the rank's rows too)
    shard = "weights"    20/N, plus 4 B for each parameter of the root group (ZeRO-3: the blocks' weights kept as
                         the rank's rows between their uses; the root group, every parameter outside `blocks.*`,
                         stays whole). The blocks gathered during a step are not model state: the peak RSS shows them.

    ~/.cache/runner/venv/bin/python bench/sharded_memory.py [--models S,B] [--ranks 1,2,4]
        [--shards none,optimizer,gradients] [--batch 2] [--steps 1] [--runner build/runner] [--output FILE]

- Each setting is one `OMP_NUM_THREADS=1 runner --nproc N bench/sharded_memory.lua model=S shard=... batch=2
  steps=1` (no --nproc for 1 rank; `--oversubscribe` when there are more ranks than cores): the DiT (32x32x4
  latents, 1000 classes, learned sigma) on random latents and labels, `batch` per rank, the DDPM objective
  (`runner.diffusion.gaussian{timesteps=1000}:objective(model)`), AdamW, clip 1.0, amp "fp32", an fp32 EMA
  (0.9999), on the CPU over Gloo. After the steps every rank reads its `train:state_bytes()` and its peak RSS
  (VmHWM in /proc/self/status; and VmRSS before the model was built, the libraries' share), and rank 0 gathers
  them (`runner.dist.all_gather`) and prints `RESULT {json}`.
- A single process ignores `shard`: at 1 rank the three modes are the same unsharded state, and the formulas all
  give 20 B/param there.
- The table gives, per setting, the largest value over the ranks of each part in MB (10^6 bytes), the formula's
  total MB (P = all the model's parameters, including DiT's fixed positional embedding, which has no gradient
  or AdamW state), measured total / formula, the peak RSS (largest over the ranks) and that peak less the RSS at
  start (the model's, the state's and the step's memory).
- The last line gives the worst |measured / formula - 1| over all rows (target: within 5%); the `ratio X.XX` line
  before it is that row's measured / formula. JSON in `bench/results/sharded_memory-<YYYYMMDD-HHMMSS>-<host>.json`.
- Time: on 2 CPU cores, about 5 minutes with the defaults (DiT-B/2 at 4 ranks, the slowest settings, 30-45 s
  each). Memory: DiT-B/2 unsharded at 4 ranks needs about 4 x 3.6 GB.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
from runner_side import find_runner  # noqa: E402
from bench_record import build_info, machine_info, runner_version, write_record  # noqa: E402

MODELS = {"S": "DiT-S/2", "B": "DiT-B/2"}
SHARDS = ("none", "optimizer", "gradients", "weights")
PARTS = ("weights", "gradients", "optimizer", "ema", "total")
TARGET = 0.05


def bytes_per_parameter(shard, world, root_share):
    """The formula for runner's per-rank state (AdamW, one fp32 EMA), in bytes per parameter; `root_share`: the
    fraction of the parameters in the root group (kept whole by shard = "weights")."""
    if world == 1 or shard == "none":
        return 20.0
    if shard == "optimizer":
        return 8 + 12 / world
    if shard == "gradients":
        return 4 + 16 / world
    if shard == "weights":
        return 20 / world + 4 * root_share
    raise ValueError(f"no formula for shard={shard}")


def measure(runner, model, shard, world, batch, steps):
    cores = len(os.sched_getaffinity(0))
    command = [str(runner)] + (["--nproc", str(world)] if world > 1 else []) + (
        ["--oversubscribe"] if world > cores else []) + [str(BENCH_DIR / "sharded_memory.lua"), f"model={model}", f"shard={shard}", f"batch={batch}",
        f"steps={steps}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    began = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"runner failed (exit status {done.returncode}): {' '.join(command)}\n"
                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["wall_s"] = wall
            result["command"] = " ".join(["OMP_NUM_THREADS=1"] + command)
            return result
    sys.exit(f"runner printed no RESULT line: {' '.join(command)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def summarize(result, shard, world):
    ranks = result["ranks"]
    worst = {part: max(r[part] for r in ranks) for part in PARTS}
    per_parameter = bytes_per_parameter(shard, world, result["root"] / result["parameters"])
    formula = result["parameters"] * per_parameter
    return {"model": result["model"], "shard": shard, "world_size": world, "parameters": result["parameters"],
            "trainable": result["trainable"], "root": result["root"], **{f"{part}_bytes": worst[part] for part in PARTS},
            "formula_bytes_per_parameter": per_parameter, "formula_bytes": formula,
            "ratio": worst["total"] / formula,
            "measured_bytes_per_parameter": worst["total"] / result["parameters"],
            "peak_rss_bytes": max(r["peak_rss"] for r in ranks),
            "peak_rss_over_start_bytes": max(r["peak_rss"] - r["start_rss"] for r in ranks),
            "wall_s": result["wall_s"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="S,B", help="comma-separated: S (DiT-S/2), B (DiT-B/2)")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    parser.add_argument("--shards", default=",".join(SHARDS), help="comma-separated: none, optimizer, gradients, weights")
    parser.add_argument("--batch", type=int, default=2, help="latents per rank")
    parser.add_argument("--steps", type=int, default=1, help="training steps before measuring")
    parser.add_argument("--runner", default="build/runner")
    parser.add_argument("--output")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for model in models:
        if model not in MODELS:
            parser.error(f"--models: unknown model {model!r} (known: {', '.join(MODELS)})")
    ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    if any(r < 1 for r in ranks):
        parser.error("--ranks: rank counts are at least 1")
    shards = [s.strip() for s in args.shards.split(",") if s.strip()]
    for shard in shards:
        if shard not in SHARDS:
            parser.error(f"--shards: unknown mode {shard!r} (known: {', '.join(SHARDS)})")
    runner = find_runner(args.runner)
    print(f"runner per-rank model state: {', '.join(MODELS[m] for m in models)}; shards {', '.join(shards)}; "
          f"ranks {', '.join(map(str, ranks))}; batch {args.batch} per rank, {args.steps} step(s), fp32, "
          f"AdamW + fp32 EMA, 1 thread per rank", flush=True)

    rows, results = [], []
    for model in models:
        for world in ranks:
            for shard in shards:
                result = measure(runner, model, shard, world, args.batch, args.steps)
                results.append(result)
                row = summarize(result, shard, world)
                rows.append(row)
                print(f"  {row['model']:8s} {shard:10s} {world} rank(s): total {row['total_bytes'] / 1e6:8.1f} MB, "
                      f"formula {row['formula_bytes'] / 1e6:8.1f} MB, peak RSS {row['peak_rss_bytes'] / 1e6:7.0f} MB"
                      f"  ({row['wall_s']:.0f} s)", flush=True)

    print()
    print("per-rank MB (10^6 bytes), the largest over the ranks; formula = parameters x bytes/param")
    header = (f"{'model':8s} {'shard':10s} {'ranks':>5s} {'weights':>8s} {'grads':>8s} {'optim':>8s} {'EMA':>8s} "
              f"{'total':>8s} {'B/param':>7s} {'formula':>8s} {'ratio':>6s} {'peak RSS':>8s} {'RSS-start':>9s}")
    print(header)
    for row in rows:
        print(f"{row['model']:8s} {row['shard']:10s} {row['world_size']:5d} "
              + " ".join(f"{row[f'{part}_bytes'] / 1e6:8.1f}" for part in PARTS)
              + f" {row['formula_bytes_per_parameter']:7.2f} {row['formula_bytes'] / 1e6:8.1f} {row['ratio']:6.3f}"
              f" {row['peak_rss_bytes'] / 1e6:8.0f} {row['peak_rss_over_start_bytes'] / 1e6:9.0f}")
    worst = max(rows, key=lambda row: abs(row["ratio"] - 1))
    deviation = abs(worst["ratio"] - 1)
    print()
    write_record("sharded_memory", machine_info(), {"runner": runner_version(runner), **build_info(runner)},
                 {"settings": {"models": [MODELS[m] for m in models], "ranks": ranks, "shards": shards,
                               "batch_per_rank": args.batch, "steps": args.steps, "threads_per_rank": 1,
                               "amp": "fp32"},
                  "summary": rows, "measurements": results, "worst_deviation": deviation,
                  "worst_setting": {k: worst[k] for k in ("model", "shard", "world_size")}},
                 worst["ratio"], args.output)
    print(f"worst |measured/formula - 1| {100 * deviation:.2f}% ({worst['model']}, shard {worst['shard']}, "
          f"{worst['world_size']} rank(s)): {'within' if deviation <= TARGET else 'outside'} the 5% target")


if __name__ == "__main__":
    main()
