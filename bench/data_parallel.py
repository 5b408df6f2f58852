# Benchmark: data-parallel training steps, runner's ranks against PyTorch DistributedDataParallel and FSDP2 on the same UNet.
"""Images per second and per-rank peak RSS of full DDPM training steps (noise and timestep sampling, forward, MSE,
backward, gradient averaging, clip 1.0, AdamW) of the CIFAR-10 DDPM UNet, in one process and in W ranks,
unsharded and sharded, runner against PyTorch.

    ~/.cache/runner/venv/bin/python bench/data_parallel.py [--world 2] [--batch 16] [--channels 32]
        [--steps 10] [--warmup 3] [--rounds 3] [--device cpu|cuda] [--runner build/runner] [--only runner|pytorch]
        [--no-sharded]

- runner: `runner bench/data_parallel.lua` (one process) and `runner --nproc W bench/data_parallel.lua`
  (W ranks over Gloo on the CPU, NCCL on GPUs), gradients averaged during the backward pass (the default) and,
  as a third row, after it (`overlap=false`). Sharded rows (left out with --no-sharded): `shard=optimizer`
  (ZeRO-1: AdamW's moments per rank's rows), `shard=gradients` (ZeRO-2: the averaged gradients too) and
  `shard=weights` (ZeRO-3: each level's weights too, gathered for its forward and its backward), W ranks.
- PyTorch: the same model (tests/reference/models.py) in one process, and W processes started with
  torch.multiprocessing, `torch.distributed` on Gloo / NCCL and `DistributedDataParallel` with its defaults
  (25 MB buckets, all-reduce overlapped with backward); `clip_grad_norm_` and `torch.optim.AdamW`. The sharded
  peer (left out with --no-sharded) is FSDP2 on the same world: `torch.distributed.fsdp.fully_shard` on each
  level of `down` and `up` (the level's blocks, attention blocks and down/upsampling as one group, as runner's
  `down.N` / `up.N` groups), then on the root, `reshard_after_forward=False` (ZeRO-2, SHARD_GRAD_OP) against
  runner's gradients and `reshard_after_forward=True` on the levels (ZeRO-3, FULL_SHARD; the root unsharded after
  the forward, as runner keeps its root group whole) against runner's weights, the mesh from
  `init_device_mesh(device, (W,))`, AdamW and `clip_grad_norm_` on the sharded (DTensor) parameters.
- Both sides: the batch is the global batch (each rank takes batch / W), float32 on the CPU (bf16 autocast
  on CUDA), one process gets all the cores' threads and each of W ranks cores / W. --warmup untimed steps,
  a barrier, --steps timed steps, a barrier. Rounds alternate the sides; medians are reported. Each rank reads
  its peak RSS (VmHWM in /proc/self/status) after the timed steps; the table shows the largest over the ranks
  (its largest over the rounds).

The table gives images/s for each setting, per side the W-rank scaling efficiency (W-rank images/s over one
process's, the same cores in both), and the per-rank peak RSS. `ratio sharded X.XX` is runner shard=gradients'
W-rank images/s over FSDP2's (ZeRO-2), `ratio sharded weights X.XX` runner shard=weights' over FSDP2's full shard. The last line, `ratio X.XX`, is runner's (unsharded) W-rank images/s over PyTorch
DDP's.
"""

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
import torch.nn.functional as F

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT / "tests" / "reference"))
import models as reference  # noqa: E402  (tests/reference/models.py: the same UNet in PyTorch)
from runner_side import find_runner  # noqa: E402
from bench_record import build_info, machine_info, runner_version, write_record  # noqa: E402

TIMESTEPS = 1000


def unet_options(channels):
    return {"channels": channels, "mults": (1, 2, 2, 2), "blocks": 2, "attention": (16,), "dropout": 0.1,
            "image": 32, "in_channels": 3, "classes": 0}


def peak_rss_bytes():
    """This process's peak resident set size (VmHWM in /proc/self/status) in bytes, 0 without /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MeasurementFailed(RuntimeError):
    """A measured side failed; the message says how."""


def measure_runner(runner, settings, world, overlap, shard="none"):
    oversubscribe = settings["device"] == "cpu" and world > settings["cores"]  # more CPU ranks than cores
    command = [str(runner)] + (["--nproc", str(world)] if world > 1 else []) + (
        ["--oversubscribe"] if oversubscribe else []) + [
        str(BENCH_DIR / "data_parallel.lua"), f"device={'auto' if settings['device'] == 'cuda' else 'cpu'}",
        f"batch={settings['batch']}", f"channels={settings['channels']}", f"steps={settings['steps']}",
        f"warmup={settings['warmup']}", f"overlap={'true' if overlap else 'false'}"] + (
        [f"shard={shard}"] if shard != "none" else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, settings["cores"] // world)))
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise MeasurementFailed(f"runner failed (exit status {done.returncode}): {' '.join(command)}\n"
                                f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise MeasurementFailed(f"runner printed no RESULT line: {' '.join(command)}\n"
                            f"{done.stdout[-3000:]}{done.stderr[-3000:]}")


def fsdp2_shard(model, world, device, reshard=False):
    """FSDP2 on the reference UNet: one fully_shard group per level of `down` and `up` (the modules its forward
    calls: blocks, attention blocks, down/upsampling), then the root (the rest); the levels resharded after the
    forward with `reshard` (ZeRO-3), else not (ZeRO-2)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world,))
    for levels in (model.down, model.up):
        for level in levels:
            modules = list(level.block) + list(level.attn) + [getattr(level, name) for name in ("downsample", "upsample")
                                                             if hasattr(level, name)]
            fully_shard(modules, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def pytorch_rank(rank, world, port, settings, results, mode="ddp"):
    """One PyTorch process: rank `rank` of `world` (world 1: no process group, no DDP), DDP or FSDP2 (mode "fsdp2").
    Rank 0 puts the result on `results`, or any rank {"error": ...} when it fails."""
    try:
        pytorch_rank_steps(rank, world, port, settings, results, mode)
    except BaseException as error:  # noqa: BLE001  (reported to the parent, which prints it)
        results.put({"error": f"rank {rank}: {type(error).__name__}: {error}", "traceback": traceback.format_exc()})
        raise


def pytorch_rank_steps(rank, world, port, settings, results, mode):
    torch.set_num_threads(max(1, settings["cores"] // world))
    on_cuda = settings["device"] == "cuda"
    device = torch.device(f"cuda:{rank}" if on_cuda else "cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        torch_dist.init_process_group("nccl" if on_cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                      rank=rank, world_size=world)
    torch.manual_seed(settings["seed"])
    model = reference.build("unet", unet_options(settings["channels"])).to(device)
    model.train()
    if mode in ("fsdp2", "fsdp2-full"):
        net = fsdp2_shard(model, world, device, reshard=mode == "fsdp2-full")
    else:
        net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    betas = torch.linspace(1e-4, 0.02, TIMESTEPS, dtype=torch.float64)
    alphas_cumprod = torch.cumprod(1 - betas, 0).float().to(device)
    torch.manual_seed(settings["seed"] + rank)
    images = torch.randn(settings["batch"] // world, 3, 32, 32, device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        t = torch.randint(0, TIMESTEPS, (images.shape[0],), device=device)
        noise = torch.randn_like(images)
        a = alphas_cumprod[t].view(-1, 1, 1, 1)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_cuda):
            loss = F.mse_loss(net(a.sqrt() * images + (1 - a).sqrt() * noise, t), noise)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    for _ in range(settings["warmup"]):
        step()

    def barrier():
        if on_cuda:
            torch.cuda.synchronize(device)
        if world > 1:
            torch_dist.barrier()

    barrier()
    start = time.perf_counter()
    for _ in range(settings["steps"]):
        loss = step()
    last = loss.item()
    barrier()
    seconds = time.perf_counter() - start
    peaks = [peak_rss_bytes()]
    if world > 1:  # every rank's peak RSS to rank 0
        mine = torch.tensor([float(peaks[0])], dtype=torch.float64, device=device)
        every = [torch.zeros_like(mine) for _ in range(world)]
        torch_dist.all_gather(every, mine)
        peaks = [int(t.item()) for t in every]
    if rank == 0:
        results.put({"world_size": world, "mode": mode, "batch": settings["batch"], "steps": settings["steps"],
                     "seconds": seconds, "step_s": seconds / settings["steps"],
                     "images_per_s": settings["batch"] * settings["steps"] / seconds,
                     "parameters": sum(p.numel() for p in model.parameters()), "loss": last,
                     "threads": torch.get_num_threads(), "device": str(device), "peak_rss_bytes": peaks})
    if world > 1:
        torch_dist.destroy_process_group()


def measure_pytorch(settings, world, mode="ddp"):
    """Runs `world` PyTorch ranks and returns rank 0's result; raises MeasurementFailed when a rank fails."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + os.getpid() % 1000
    processes = [context.Process(target=pytorch_rank, args=(rank, world, port, settings, results, mode))
                 for rank in range(world)]
    for process in processes:
        process.start()
    result, deadline = None, time.monotonic() + 1800
    while result is None:
        try:
            result = results.get(timeout=5)
        except queue.Empty:
            # A rank that died without reporting (killed) leaves the others waiting in a collective: stop them.
            if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in processes):
                break
    if result is None or "error" in result:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
        if result is None:
            codes = ", ".join(str(p.exitcode) for p in processes)
            raise MeasurementFailed(f"PyTorch {mode} ranks gave no result (exit statuses {codes})")
        raise MeasurementFailed(f"PyTorch {mode}: {result['error']}\n{result['traceback']}")
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise MeasurementFailed(f"a PyTorch {mode} rank exited with status {process.exitcode}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runner", default="build/runner")
    parser.add_argument("--only", choices=("runner", "pytorch"))
    parser.add_argument("--no-sharded", action="store_true",
                        help="leave out runner shard=optimizer / gradients / weights and PyTorch FSDP2")
    parser.add_argument("--output")
    args = parser.parse_args()
    if args.batch % args.world:
        parser.error(f"--batch {args.batch} does not split over --world {args.world}")
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        parser.error(f"--world {args.world} needs as many GPUs, found {torch.cuda.device_count()}")
    runner = None if args.only == "pytorch" else find_runner(args.runner)
    cores = len(os.sched_getaffinity(0))
    settings = {"device": args.device, "batch": args.batch, "channels": args.channels, "steps": args.steps,
                "warmup": args.warmup, "seed": args.seed, "cores": cores}
    w = args.world
    rows = {  # name -> (side, world, overlap, mode): mode is runner's shard, or PyTorch's "ddp" / "fsdp2"
        "runner, 1 process": ("runner", 1, True, "none"),
        f"runner, {w} ranks": ("runner", w, True, "none"),
        f"runner, {w} ranks, averaged after backward": ("runner", w, False, "none"),
        f"runner, {w} ranks, shard=optimizer": ("runner", w, True, "optimizer"),
        f"runner, {w} ranks, shard=gradients": ("runner", w, True, "gradients"),
        f"runner, {w} ranks, shard=weights": ("runner", w, True, "weights"),
        "PyTorch, 1 process": ("pytorch", 1, True, "ddp"),
        f"PyTorch DDP, {w} ranks": ("pytorch", w, True, "ddp"),
        f"PyTorch FSDP2, {w} ranks": ("pytorch", w, True, "fsdp2"),
        f"PyTorch FSDP2 full shard, {w} ranks": ("pytorch", w, True, "fsdp2-full"),
    }
    sharded = (f"runner, {w} ranks, shard=optimizer", f"runner, {w} ranks, shard=gradients",
               f"runner, {w} ranks, shard=weights", f"PyTorch FSDP2, {w} ranks", f"PyTorch FSDP2 full shard, {w} ranks")
    rows = {name: row for name, row in rows.items()
            if args.only in (None, row[0]) and not (args.no_sharded and name in sharded)}
    print(f"DDPM UNet (channels {args.channels}) on {args.device}, global batch {args.batch}, {cores} cores; "
          f"{args.warmup} + {args.steps} steps, {args.rounds} rounds", flush=True)
    measured = {name: [] for name in rows}
    failures = {}  # name -> the first failure's message; the row is not measured again
    for round_index in range(args.rounds):
        order = list(rows) if round_index % 2 == 0 else list(reversed(rows))
        for name in order:
            if name in failures:
                continue
            side, world, overlap, mode = rows[name]
            try:
                result = (measure_runner(runner, settings, world, overlap, mode) if side == "runner"
                          else measure_pytorch(settings, world, mode))
            except MeasurementFailed as failure:
                failures[name] = str(failure)
                print(f"  round {round_index + 1}/{args.rounds}  {name:45s} failed: {failure}", flush=True)
                continue
            measured[name].append(result)
            print(f"  round {round_index + 1}/{args.rounds}  {name:45s} {result['images_per_s']:8.1f} img/s", flush=True)

    def median(name):
        return statistics.median(r["images_per_s"] for r in measured[name]) if measured.get(name) else None

    def peak_rss_mb(name):  # the largest per-rank peak RSS over the ranks and rounds, in MB
        peaks = [max(r.get("peak_rss_bytes") or [0]) for r in measured.get(name, [])]
        return max(peaks) / 1e6 if peaks and max(peaks) > 0 else None

    print()
    print(f"{'setting':48s} {'img/s':>9s} {'step ms':>9s}  {'scaling':>8s}  {'peak RSS MB':>11s}")
    summary = []
    for name, (side, world, overlap, mode) in rows.items():
        rate = median(name)
        if rate is None:
            reason = failures.get(name, "not measured").strip().splitlines()
            summary.append({"setting": name, "side": side, "world_size": world, "overlap": overlap, "mode": mode,
                            "error": failures.get(name, "not measured")})
            print(f"{name:48s} failed: {reason[0][:200] if reason else ''}")
            continue
        one = median("runner, 1 process" if side == "runner" else "PyTorch, 1 process")
        scaling = rate / one if world > 1 and one else None
        rss = peak_rss_mb(name)
        summary.append({"setting": name, "side": side, "world_size": world, "overlap": overlap, "mode": mode,
                        "images_per_s": rate, "step_ms": 1000 * args.batch / rate, "scaling_efficiency": scaling,
                        "peak_rss_mb": rss})
        print(f"{name:48s} {rate:9.1f} {1000 * args.batch / rate:9.1f}  "
              f"{'' if scaling is None else f'{100 * scaling:7.1f}%':>8s}  {'' if rss is None else f'{rss:11.0f}'}")
    print()
    ratio = ratio_sharded = None
    runner_rate, pytorch_rate = median(f"runner, {w} ranks"), median(f"PyTorch DDP, {w} ranks")
    if runner_rate and pytorch_rate:
        ratio = runner_rate / pytorch_rate
        after = median(f"runner, {w} ranks, averaged after backward")
        overlap_text = f"{runner_rate / after:.2f}x" if after else "not measured"
        print(f"runner {w} ranks over PyTorch DDP {w} ranks: {ratio:.2f}x; "
              f"averaging during backward over after it: {overlap_text}")
    zero2_rate, fsdp2_rate = median(f"runner, {w} ranks, shard=gradients"), median(f"PyTorch FSDP2, {w} ranks")
    if zero2_rate and fsdp2_rate:
        ratio_sharded = zero2_rate / fsdp2_rate
        zero2_rss, fsdp2_rss = peak_rss_mb(f"runner, {w} ranks, shard=gradients"), peak_rss_mb(f"PyTorch FSDP2, {w} ranks")
        memory = (f"; per-rank peak RSS {zero2_rss:.0f} MB vs {fsdp2_rss:.0f} MB ({zero2_rss / fsdp2_rss:.2f}x)"
                  if zero2_rss and fsdp2_rss else "")
        print(f"runner {w} ranks shard=gradients over PyTorch FSDP2 {w} ranks: {ratio_sharded:.2f}x{memory}")
        print(f"ratio sharded {ratio_sharded:.2f}")
    elif f"PyTorch FSDP2, {w} ranks" in failures:
        print(f"ratio sharded: not measured (PyTorch FSDP2 failed: "
              f"{failures[f'PyTorch FSDP2, {w} ranks'].strip().splitlines()[0][:200]})")
    ratio_weights = None
    zero3_rate, full_rate = median(f"runner, {w} ranks, shard=weights"), median(f"PyTorch FSDP2 full shard, {w} ranks")
    if zero3_rate and full_rate:
        ratio_weights = zero3_rate / full_rate
        zero3_rss, full_rss = (peak_rss_mb(f"runner, {w} ranks, shard=weights"),
                               peak_rss_mb(f"PyTorch FSDP2 full shard, {w} ranks"))
        memory = (f"; per-rank peak RSS {zero3_rss:.0f} MB vs {full_rss:.0f} MB ({zero3_rss / full_rss:.2f}x)"
                  if zero3_rss and full_rss else "")
        print(f"runner {w} ranks shard=weights over PyTorch FSDP2 full shard {w} ranks: {ratio_weights:.2f}x{memory}")
        print(f"ratio sharded weights {ratio_weights:.2f}")
    versions = {"torch": torch.__version__}
    if runner is not None:
        versions["runner"] = runner_version(runner)
        versions.update(build_info(runner))
    write_record("data_parallel", machine_info(), versions,
                 {"settings": settings, "world": args.world, "rounds": args.rounds, "summary": summary,
                  "measurements": measured, "failures": failures, "ratio_sharded": ratio_sharded,
                  "ratio_sharded_weights": ratio_weights}, ratio, args.output)
    if failures:
        sys.exit("data_parallel: failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
