# Benchmark: VAE encoding throughput, runner's nn.AutoencoderKL against diffusers' AutoencoderKL.encode.
"""Images per second through the encoder of the Stable Diffusion VAE (the default AutoencoderKL config, random
weights; the posterior's mean and log-variance), runner against diffusers on the same device, batch, size and
dtype, as `runner data encode` runs it.

    ~/.cache/runner/venv/bin/python bench/vae_encode.py [--device cpu|cuda] [--size 256] [--batch 32]
        [--dtype float32|bfloat16] [--steps 10] [--warmup 3] [--rounds 3] [--runner build/runner]

- runner: `runner bench/vae_encode.lua`, timed `vae:encode(images)` under no_grad.
- diffusers: `AutoencoderKL(**SD_VAE)` (the same config), `vae.encode(images).latent_dist` (mean and logvar) under
  torch.no_grad, in this process.
- Both: --warmup untimed calls, then --steps timed calls with a device synchronisation at both ends; the
  sides alternate for --rounds rounds and the medians are reported. On CUDA both allow TF32 convolutions
  (PyTorch's default for cuDNN). On the CPU both use all cores' threads.

The last line, `ratio X.XX`, is runner's images/s over diffusers'.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from bench_record import machine_info, runner_version, write_record  # noqa: E402
from runner_side import find_runner, run_runner_script  # noqa: E402


# The Stable Diffusion VAE (stabilityai/sd-vae-ft-mse's config.json); diffusers' constructor defaults are a
# one-level toy, runner's nn.AutoencoderKL{} defaults are this.
SD_VAE = {"in_channels": 3, "out_channels": 3, "latent_channels": 4, "block_out_channels": (128, 256, 512, 512),
          "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
          "layers_per_block": 2, "norm_num_groups": 32, "act_fn": "silu", "scaling_factor": 0.18215}


def measure_diffusers(settings):
    from diffusers import AutoencoderKL
    device, dtype = settings["device"], getattr(torch, settings["dtype"])
    torch.manual_seed(0)
    vae = AutoencoderKL(**SD_VAE).to(device=device, dtype=dtype).eval()
    images = (torch.rand(settings["batch"], 3, settings["size"], settings["size"], device=device) * 2 - 1).to(dtype)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    with torch.no_grad():
        for _ in range(settings["warmup"]):
            vae.encode(images).latent_dist.mean
        sync()
        start = time.perf_counter()
        for _ in range(settings["steps"]):
            posterior = vae.encode(images).latent_dist
        sync()
        seconds = time.perf_counter() - start
    del posterior
    return {"images_per_s": settings["steps"] * settings["batch"] / seconds, "call_ms": 1000 * seconds / settings["steps"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runner", default="build/runner")
    parser.add_argument("--output")
    args = parser.parse_args()
    runner = find_runner(args.runner)
    if args.device.startswith("cuda"):
        torch.backends.cudnn.allow_tf32 = True
    settings = {k: getattr(args, k) for k in ("device", "size", "batch", "dtype", "steps", "warmup")}
    runs = {"runner": [], "diffusers": []}
    for _ in range(args.rounds):
        runs["runner"].append(run_runner_script(runner, "vae_encode.lua", settings))
        runs["diffusers"].append(measure_diffusers(settings))
    median = {side: statistics.median(r["images_per_s"] for r in rows) for side, rows in runs.items()}
    ratio = median["runner"] / median["diffusers"]
    print(f"VAE encode (Stable Diffusion AutoencoderKL), {args.device}, {args.dtype}, batch {args.batch}, "
          f"{args.size}x{args.size}, median of {args.rounds} rounds")
    print(f"{'side':<10} {'images/s':>10} {'ms/call':>10}")
    for side in ("runner", "diffusers"):
        print(f"{side:<10} {median[side]:>10.2f} {1000 * args.batch / median[side]:>10.1f}")
    machine = machine_info()
    if args.device.startswith("cuda"):
        machine["gpu"] = torch.cuda.get_device_name(0)
    import diffusers
    versions = {"runner": runner_version(runner), "torch": torch.__version__, "diffusers": diffusers.__version__}
    write_record("vae_encode", machine, versions, {"settings": settings, "runs": runs, "median_images_per_s": median,
                                                   "ratio": ratio}, ratio, args.output)


if __name__ == "__main__":
    main()
