# Benchmark: data-parallel training steps, runner's ranks against PyTorch DistributedDataParallel on the same UNet.
"""Images per second of full DDPM training steps (noise and timestep sampling, forward, MSE, backward, gradient
averaging, clip 1.0, AdamW) of the CIFAR-10 DDPM UNet, in one process and in W ranks, runner against PyTorch.

    ~/.cache/runner/venv/bin/python bench/data_parallel.py [--world 2] [--batch 16] [--channels 32]
        [--steps 10] [--warmup 3] [--rounds 3] [--device cpu|cuda] [--runner build/runner] [--only runner|pytorch]

- runner: `runner bench/data_parallel.lua` (one process) and `runner --nproc W bench/data_parallel.lua`
  (W ranks over Gloo on the CPU, NCCL on GPUs), gradients averaged during the backward pass (the default) and,
  as a third row, after it (`overlap=false`).
- PyTorch: the same model (tests/reference/models.py) in one process, and W processes started with
  torch.multiprocessing, `torch.distributed` on Gloo / NCCL and `DistributedDataParallel` with its defaults
  (25 MB buckets, all-reduce overlapped with backward); `clip_grad_norm_` and `torch.optim.AdamW`.
- Both sides: the batch is the global batch (each rank takes batch / W), float32 on the CPU (bf16 autocast
  on CUDA), one process gets all the cores' threads and each of W ranks cores / W. --warmup untimed steps,
  a barrier, --steps timed steps, a barrier. Rounds alternate the sides; medians are reported.

The table gives images/s for each setting and, per side, the W-rank scaling efficiency (W-rank images/s over
one process's, the same cores in both). The last line, `ratio X.XX`, is runner's W-rank images/s over
PyTorch DDP's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
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
from bench_record import machine_info, runner_version, write_record  # noqa: E402

TIMESTEPS = 1000


def unet_options(channels):
    return {"channels": channels, "mults": (1, 2, 2, 2), "blocks": 2, "attention": (16,), "dropout": 0.1,
            "image": 32, "in_channels": 3, "classes": 0}


def measure_runner(runner, settings, world, overlap):
    command = [str(runner)] + (["--nproc", str(world)] if world > 1 else []) + [
        str(BENCH_DIR / "data_parallel.lua"), f"device={'auto' if settings['device'] == 'cuda' else 'cpu'}",
        f"batch={settings['batch']}", f"channels={settings['channels']}", f"steps={settings['steps']}",
        f"warmup={settings['warmup']}", f"overlap={'true' if overlap else 'false'}"]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, settings["cores"] // world)))
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"runner failed (exit status {done.returncode}): {' '.join(command)}\n"
                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.exit(f"runner printed no RESULT line: {' '.join(command)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def pytorch_rank(rank, world, port, settings, results):
    """One PyTorch process: rank `rank` of `world` (world 1: no process group, no DDP)."""
    torch.set_num_threads(max(1, settings["cores"] // world))
    on_cuda = settings["device"] == "cuda"
    device = torch.device(f"cuda:{rank}" if on_cuda else "cpu")
    if world > 1:
        torch_dist.init_process_group("nccl" if on_cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                      rank=rank, world_size=world)
    torch.manual_seed(settings["seed"])
    model = reference.build("unet", unet_options(settings["channels"])).to(device)
    model.train()
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
    if rank == 0:
        results.put({"world_size": world, "batch": settings["batch"], "steps": settings["steps"], "seconds": seconds,
                     "step_s": seconds / settings["steps"], "images_per_s": settings["batch"] * settings["steps"] / seconds,
                     "parameters": sum(p.numel() for p in model.parameters()), "loss": last,
                     "threads": torch.get_num_threads(), "device": str(device)})
    if world > 1:
        torch_dist.destroy_process_group()


def measure_pytorch(settings, world):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + os.getpid() % 1000
    processes = [context.Process(target=pytorch_rank, args=(rank, world, port, settings, results))
                 for rank in range(world)]
    for process in processes:
        process.start()
    result = results.get(timeout=1800)
    for process in processes:
        process.join()
        if process.exitcode != 0:
            sys.exit(f"a PyTorch rank exited with status {process.exitcode}")
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
    rows = {  # name -> (side, world, overlap)
        "runner, 1 process": ("runner", 1, True),
        f"runner, {args.world} ranks": ("runner", args.world, True),
        f"runner, {args.world} ranks, averaged after backward": ("runner", args.world, False),
        "PyTorch, 1 process": ("pytorch", 1, True),
        f"PyTorch DDP, {args.world} ranks": ("pytorch", args.world, True),
    }
    rows = {name: row for name, row in rows.items() if args.only in (None, row[0])}
    print(f"DDPM UNet (channels {args.channels}) on {args.device}, global batch {args.batch}, {cores} cores; "
          f"{args.warmup} + {args.steps} steps, {args.rounds} rounds", flush=True)
    measured = {name: [] for name in rows}
    for round_index in range(args.rounds):
        order = list(rows) if round_index % 2 == 0 else list(reversed(rows))
        for name in order:
            side, world, overlap = rows[name]
            result = measure_runner(runner, settings, world, overlap) if side == "runner" else measure_pytorch(settings, world)
            measured[name].append(result)
            print(f"  round {round_index + 1}/{args.rounds}  {name:45s} {result['images_per_s']:8.1f} img/s", flush=True)

    def median(name):
        return statistics.median(r["images_per_s"] for r in measured[name]) if name in measured else None

    print()
    print(f"{'setting':48s} {'img/s':>9s} {'step ms':>9s}  {'scaling':>8s}")
    summary = []
    for name, (side, world, overlap) in rows.items():
        rate = median(name)
        one = median("runner, 1 process" if side == "runner" else "PyTorch, 1 process")
        scaling = rate / one if world > 1 and one else None
        summary.append({"setting": name, "side": side, "world_size": world, "overlap": overlap,
                        "images_per_s": rate, "step_ms": 1000 * args.batch / rate, "scaling_efficiency": scaling})
        print(f"{name:48s} {rate:9.1f} {1000 * args.batch / rate:9.1f}  "
              f"{'' if scaling is None else f'{100 * scaling:7.1f}%':>8s}")
    ratio = None
    runner_rate, pytorch_rate = median(f"runner, {args.world} ranks"), median(f"PyTorch DDP, {args.world} ranks")
    if runner_rate and pytorch_rate:
        ratio = runner_rate / pytorch_rate
        overlap_gain = runner_rate / median(f"runner, {args.world} ranks, averaged after backward")
        print(f"\nrunner {args.world} ranks over PyTorch DDP {args.world} ranks: {ratio:.2f}x; "
              f"averaging during backward over after it: {overlap_gain:.2f}x")
    versions = {"torch": torch.__version__}
    if runner is not None:
        versions["runner"] = runner_version(runner)
    write_record("data_parallel", machine_info(), versions,
                 {"settings": settings, "world": args.world, "rounds": args.rounds, "summary": summary,
                  "measurements": measured}, ratio, args.output)


if __name__ == "__main__":
    main()
