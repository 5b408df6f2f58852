# Check: FP8 training's loss against bf16's on a real task; an FP8 run resumed half-way against an uninterrupted one.
"""Runs bench/fp8_curve.lua (a DiT, DiT-S/2 by default, trained on 32x32x4 latents of the built-in shapes images,
made by a fixed random projection) three ways from the same seed: amp=bf16, amp=fp8, and amp=fp8 stopped at
--resume-at (run:stop: a checkpoint, the run interrupted) and continued to the end by the same command again.

    ~/.cache/runner/venv/bin/python bench/fp8_curve.py [--steps 1000] [--resume-at 500] [--size DiT-S/2]
        [--batch 128] [--amps bf16,fp8] [--resume-amp fp8] [--deterministic auto|on|off] [--fused]
        [--device cuda|cpu] [--runner build/runner] [--output FILE] [--keep-runs DIR]
    scripts/gpu-check fp8                                     # on the GPU host (RUNNER_FP8_STEPS=N)

Checks, each printed with its numbers:
- FP8 against bf16: the final loss (the mean over the last --last steps, 100 by default) of the fp8 run within
  --tolerance percent (2) of the bf16 run's. Both runs draw the same batches, timesteps, noise and label dropout,
  so the difference is the precision's. The curves (mean loss per --every steps) are printed side by side.
- Resume: the resumed run's loss at every step, its final loss and its final checkpoint (model, EMA, optimizer
  and trainer state) equal to the uninterrupted run's of the same amp, bit for bit.
amp=fp8 needs a CUDA device of compute capability 8.9 or later; elsewhere the fp8 runs are recorded as skipped with
the reason and the resume check runs with bf16 (--resume-amp defaults to fp8 where the device has it, else bf16).
--deterministic auto runs the trainer with deterministic algorithms (bit-identical repeats on CUDA) and, if an op
refuses for want of one, runs everything again without them, recording why.

Output: a line per run, the curves, a table of the runs (final loss, fp8 / bf16, images/s, seconds), the checks
and JSON in bench/results/fp8_curve-<YYYYMMDD-HHMMSS>-<hostname>.json (--output overrides) with every run's
curve and per-step losses; the last line `ratio X.XX` is fp8's final loss over bf16's. Exit status 1 when a run
failed or a check was missed (after the JSON is written). The runs' checkpoints go to a temporary RUNNER_HOME,
deleted at the end unless --keep-runs names a folder.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from bench_record import runner_version, write_record  # noqa: E402
from runner_side import REPO_ROOT, SideFailed, exit_status_text, find_runner  # noqa: E402
from train_step import failure_text, fp8_unavailable, machine_info_with_gpu  # noqa: E402

CHECKPOINT_FILES = ("model.safetensors", "ema.safetensors", "optimizer.safetensors", "trainer.safetensors")
# what PyTorch says when an op has no deterministic implementation, or cuBLAS lacks its workspace setting
DETERMINISM_REFUSED = re.compile(r"does not have a deterministic implementation|use_deterministic_algorithms",
                                 re.IGNORECASE)


def run_lua(runner, overrides, env, timeout):
    """One invocation of bench/fp8_curve.lua: (its RESULT object or None, its stdout). Raises SideFailed when it
    exits with an error or runs past `timeout` seconds."""
    command = [str(runner), str(BENCH_DIR / "fp8_curve.lua"), *[f"{k}={v}" for k, v in overrides.items()]]
    shown = f"RUNNER_HOME={env['RUNNER_HOME']} {' '.join(command)}"
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=dict(os.environ, **env), capture_output=True, text=True,
                              errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as error:
        output = f"{(error.stdout or '')[-3000:]}{(error.stderr or '')[-3000:]}"
        raise SideFailed(f"fp8_curve.lua ran past {timeout} s", shown, output) from None
    output = f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
    if done.returncode != 0:
        raise SideFailed(f"fp8_curve.lua failed ({exit_status_text(done.returncode)})", shown, output)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), done.stdout
    return None, done.stdout


def train(runner, name, amp, resume_at, settings, env, timeout):
    """One training run of bench/fp8_curve.lua to the end: its RESULT. With resume_at, the first invocation must
    stop at that step (exit 0, no RESULT) and the same command again continues the run to the end."""
    overrides = {**settings["lua"], "amp": amp, "run_name": name,
                 "deterministic": "true" if settings["deterministic"] else "false"}
    start = time.perf_counter()
    if resume_at:
        overrides["resume_at"] = resume_at
        result, stdout = run_lua(runner, overrides, env, timeout)
        if result is not None or f"stopping at step {resume_at}" not in stdout:
            raise SideFailed(f"fp8_curve.lua did not stop at resume_at={resume_at}", name, stdout[-3000:])
    result, stdout = run_lua(runner, overrides, env, timeout)
    if result is None:
        raise SideFailed("fp8_curve.lua printed no RESULT line", name, stdout[-3000:])
    if resume_at and (result["start_step"] != resume_at or not result["resumed"]):
        raise SideFailed(f"the second invocation did not continue the run from step {resume_at} "
                         f"(it started at step {result['start_step']})", name, stdout[-3000:])
    if result["final_loss"] is None:
        raise SideFailed("the final loss is NaN (a NaN loss in the last steps)", name, stdout[-3000:])
    result["wall_seconds"] = time.perf_counter() - start
    return result


def compare_checkpoints(a, b):
    """{file: True/False/"missing"}: whether each file of the final checkpoints a and b (folders) is the same byte
    for byte (runner writes the same bytes for the same tensors), and {file: [names]} of the tensors that differ
    where safetensors can be imported to say."""
    same, differing = {}, {}
    for name in CHECKPOINT_FILES:
        x, y = Path(a) / name, Path(b) / name
        if not x.is_file() or not y.is_file():
            same[name] = "missing"
            continue
        same[name] = x.read_bytes() == y.read_bytes()
        if not same[name]:
            try:
                from safetensors.torch import load_file
            except ImportError:
                continue
            tx, ty = load_file(x), load_file(y)
            differing[name] = sorted(k for k in tx.keys() | ty.keys()
                                     if k not in tx or k not in ty or not torch.equal(tx[k], ty[k]))
    return same, differing


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--resume-at", type=int, help="the step the resumed run stops at (default steps / 2)")
    parser.add_argument("--size", default="DiT-S/2")
    parser.add_argument("--depth", type=int, default=0, help="override the size's depth (with --hidden, --heads)")
    parser.add_argument("--hidden", type=int, default=0)
    parser.add_argument("--heads", type=int, default=0)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--every", type=int, default=50, help="the curve: mean loss per this many steps")
    parser.add_argument("--last", type=int, default=100, help="the final loss: mean over the last this many steps")
    parser.add_argument("--amps", default="bf16,fp8", help="the uninterrupted runs (bf16 is the reference)")
    parser.add_argument("--resume-amp", help="the amp of the resumed run (default fp8 where the device has it, "
                                              "else bf16; 'none' leaves the resume out)")
    parser.add_argument("--tolerance", type=float, default=2.0, help="fp8's final loss within this %% of bf16's")
    parser.add_argument("--deterministic", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--fused", action="store_true", help="nn.DiT { fused = true } and cast_weights_once = true")
    parser.add_argument("--no-graph", action="store_true", help="no CUDA graphs (graph=false)")
    parser.add_argument("--workers", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=900, help="seconds one invocation may take")
    parser.add_argument("--runner", default="build/runner")
    parser.add_argument("--output")
    parser.add_argument("--keep-runs", help="RUNNER_HOME for the runs, kept (default: a temporary folder, deleted)")
    args = parser.parse_args()
    resume_at = args.steps // 2 if args.resume_at is None else args.resume_at
    if not 0 < resume_at < args.steps:
        parser.error(f"--resume-at must be between 1 and {args.steps - 1}")
    amps = [amp for amp in args.amps.split(",") if amp]
    if "bf16" not in amps:
        parser.error("--amps must include bf16, the reference")
    runner = find_runner(args.runner)
    device = torch.device(args.device)
    no_fp8 = fp8_unavailable(device)
    resume_amp = args.resume_amp or ("bf16" if no_fp8 else "fp8")
    lua = {"device": args.device, "steps": args.steps, "size": args.size, "depth": args.depth,
           "hidden": args.hidden, "heads": args.heads, "batch": args.batch, "lr": args.lr, "every": args.every,
           "last": args.last, "seed": args.seed, "workers": args.workers,
           "graph": "false" if args.no_graph else "true",
           "fused": "true" if args.fused else "false", "cast_weights_once": "true" if args.fused else "false"}
    plan = [(amp, amp, 0) for amp in amps]
    if resume_amp != "none":
        plan.append((f"{resume_amp}-resumed", resume_amp, resume_at))
    skipped = {}
    for name, amp, _ in plan:
        if amp == "fp8" and no_fp8:
            skipped[name] = no_fp8
    print(f"{args.size if not args.depth else f'DiT depth {args.depth} hidden {args.hidden} heads {args.heads}'} on "
          f"{args.device}, {args.steps} steps of batch {args.batch}; runs: "
          + ", ".join(f"{name} (skipped)" if name in skipped else name for name, _, _ in plan), flush=True)
    for name, reason in skipped.items():
        print(f"  {name:14s} skipped: {reason}", flush=True)

    home = Path(args.keep_runs) if args.keep_runs else Path(tempfile.mkdtemp(prefix="fp8_curve-"))
    deterministic_modes = {"auto": [True, False], "on": [True], "off": [False]}[args.deterministic]
    fallback = None
    try:
        for mode_index, deterministic in enumerate(deterministic_modes):
            results, failures = {}, []
            home_now = home / ("deterministic" if deterministic else "default")
            home_now.mkdir(parents=True, exist_ok=True)
            settings = {"lua": lua, "deterministic": deterministic}
            retry = False
            for name, amp, stop in plan:
                if name in skipped:
                    continue
                if stop and any(f["run"] == amp for f in failures):
                    failures.append({"run": name, "error": f"not run: the uninterrupted {amp} run failed"})
                    print(f"  {name:14s} not run: the uninterrupted {amp} run failed", flush=True)
                    continue
                try:
                    result = train(runner, name, amp, stop, settings, {"RUNNER_HOME": str(home_now)}, args.timeout)
                except SideFailed as error:
                    text = failure_text(error)
                    refused = DETERMINISM_REFUSED.search(error.output) is not None
                    if deterministic and mode_index + 1 < len(deterministic_modes) and refused:
                        fallback = f"{name}: {text}"
                        print(f"  {name:14s} refused deterministic algorithms ({text}): all runs again without them",
                              flush=True)
                        retry = True
                        break
                    failures.append({"run": name, "error": text, "error_output": str(error).strip()[-6000:]})
                    print(f"  {name:14s} FAILED: {text}", flush=True)
                    continue
                if name.endswith("-resumed"):
                    uninterrupted = results.get(amp)
                    if uninterrupted is not None:
                        result["checkpoint_equal"], result["checkpoint_differing_tensors"] = compare_checkpoints(
                            uninterrupted["checkpoint"], result["checkpoint"])
                results[name] = result
                print(f"  {name:14s} final loss {result['final_loss']:.5f}  {result['images_per_s']:8.1f} img/s "
                      f"(last attempt)  {result['wall_seconds']:6.1f} s", flush=True)
            if not retry:
                break
    finally:
        if not args.keep_runs:
            shutil.rmtree(home, ignore_errors=True)

    names = [name for name, _, _ in plan if name in results]
    if names:
        every = args.every
        print()
        print(f"{'steps':>11s}" + "".join(f" {name:>14s}" for name in names))
        windows = results[names[0]]["curve"]
        for index, window in enumerate(windows):
            first, last = window["steps"]
            line = f"{first:5d}-{last:5d}"
            for name in names:
                value = results[name]["curve"][index]["loss"]
                line += f" {'nan' if value is None else f'{value:.5f}':>14s}"
            print(line)
        print(f"(mean loss per {every} steps)")

    reference = results.get("bf16")
    checks = {}
    if "fp8" in results and reference is not None:
        ratio = results["fp8"]["final_loss"] / reference["final_loss"]
        checks["fp8_over_bf16"] = {"ratio": ratio, "tolerance_percent": args.tolerance,
                                   "met": abs(ratio - 1) * 100 <= args.tolerance}
    resumed_name = f"{resume_amp}-resumed"
    if resumed_name in results and resume_amp in results:
        a, b = results[resume_amp], results[resumed_name]
        differing = [step for step, (x, y) in enumerate(zip(a["losses"], b["losses"]), 1) if x != y]
        equal_files = b.get("checkpoint_equal", {})
        checks["resume"] = {"amp": resume_amp, "resume_at": resume_at,
                            "final_loss_equal": a["final_loss"] == b["final_loss"],
                            "final_loss_difference": b["final_loss"] - a["final_loss"],
                            "losses_equal": not differing and len(a["losses"]) == len(b["losses"]),
                            "first_differing_step": differing[0] if differing else None,
                            "differing_steps": len(differing), "checkpoint_equal": equal_files,
                            "checkpoint_differing_tensors": b.get("checkpoint_differing_tensors", {}),
                            "met": not differing and a["final_loss"] == b["final_loss"]
                            and all(v is True for v in equal_files.values()) and bool(equal_files)}

    print()
    print(f"{'run':16s} {'amp':>5s} {'start':>6s} {'final loss':>11s} {'vs bf16':>8s} {'img/s':>9s} {'seconds':>8s}")
    for name, amp, stop in plan:
        if name in skipped:
            print(f"{name:16s} {amp:>5s} {'-':>6s} {'skipped':>11s}")
            continue
        if name not in results:
            print(f"{name:16s} {amp:>5s} {'-':>6s} {'failed':>11s}")
            continue
        r = results[name]
        versus = f"{r['final_loss'] / reference['final_loss']:.4f}" if reference else "-"
        print(f"{name:16s} {amp:>5s} {r['start_step']:6d} {r['final_loss']:11.5f} {versus:>8s} "
              f"{r['images_per_s']:9.1f} {r['wall_seconds']:8.1f}")
    print(f"(final loss: mean over the last {min(args.last, args.steps)} of {args.steps} steps; img/s: the run's last "
          f"attempt; seconds: every invocation of the run, start-up included"
          f"{'; deterministic algorithms' if results and next(iter(results.values()))['deterministic'] else ''})")
    if fallback:
        print(f"deterministic algorithms refused ({fallback}): the runs above ran without them")
    for name, reason in skipped.items():
        print(f"skipped: {name}: {reason}")
    if "fp8_over_bf16" in checks:
        c = checks["fp8_over_bf16"]
        print(f"fp8 / bf16 final loss {c['ratio']:.4f}: target within {args.tolerance:g}% "
              f"{'met' if c['met'] else 'MISSED'}")
    else:
        print("fp8 / bf16 final loss: not measured" + (f" ({skipped['fp8']})" if "fp8" in skipped else ""))
    if "resume" in checks:
        c = checks["resume"]
        files = ", ".join(f"{k.split('.')[0]} {'equal' if v is True else 'DIFFERS' if v is False else v}"
                          for k, v in c["checkpoint_equal"].items())
        final = ("equal bit for bit" if c["final_loss_equal"]
                 else f"DIFFERS by {c['final_loss_difference']:.3g}")
        steps = ("equal" if c["losses_equal"]
                 else f"DIFFER from step {c['first_differing_step']} ({c['differing_steps']} steps)")
        print(f"{resume_amp} resumed at step {resume_at} against uninterrupted: final loss {final}; losses of every "
              f"step {steps}; final checkpoint: {files or 'not compared'}: {'met' if c['met'] else 'MISSED'}")
        for file, tensors in c["checkpoint_differing_tensors"].items():
            shown = ", ".join(tensors[:6]) + (", ..." if len(tensors) > 6 else "")
            print(f"  {file}: {len(tensors)} tensors differ: {shown}")
    else:
        print("resume check: not measured")
    for failure in failures:
        print(f"failed: {failure['run']}: {failure['error']}")

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "runner": runner_version(runner)}
    record_runs = {}
    for name, amp, stop in plan:
        if name in results:
            record_runs[name] = results[name]
        elif name in skipped:
            record_runs[name] = {"amp": amp, "skipped": skipped[name]}
        else:
            record_runs[name] = {"amp": amp, **next((f for f in failures if f["run"] == name), {"error": "not run"})}
    write_record("fp8_curve", machine_info_with_gpu(device), versions,
                 {"settings": {**vars(args), "resume_at": resume_at, "resume_amp": resume_amp},
                  "deterministic_fallback": fallback, "runs": record_runs, "skipped": skipped, "checks": checks,
                  "failures": failures},
                 checks.get("fp8_over_bf16", {}).get("ratio"), args.output)
    missed = [name for name, check in checks.items() if not check["met"]]
    if failures or missed:
        sys.exit("fp8_curve: " + "; ".join([f"{f['run']} failed ({f['error']})" for f in failures] +
                                           [f"{name} check missed" for name in missed]))


if __name__ == "__main__":
    main()
