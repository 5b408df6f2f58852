# Writes the golden model, schedule, loss and sampler cases computed by the Python reference.
"""Usage: python tests/reference/make_cases.py OUT_DIR [--device cpu] [--dtype float32]

Writes
    OUT_DIR/models/<case>.safetensors     parameters, inputs, output, gradients of one model
    OUT_DIR/diffusion/schedules.safetensors
    OUT_DIR/diffusion/losses.safetensors
    OUT_DIR/diffusion/sampling.safetensors
    OUT_DIR/flow/losses.safetensors
    OUT_DIR/flow/sampling.safetensors
Every file's metadata says what it holds; option and setting tables are Lua table literals.
The output is a deterministic function of the code (fixed seeds).
"""
import argparse
import pathlib
import sys
import time

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import diffusion  # noqa: E402
import models  # noqa: E402
import transport  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}

MODEL_CASES = [
    # name, model, options, batch
    ("unet_uncond", "unet", {"channels": 32, "mults": [1, 2], "blocks": 1, "attention": [8], "dropout": 0.1,
                             "image": 16, "groups": 8}, 2),
    ("unet_class", "unet", {"channels": 16, "mults": [1, 2, 2], "blocks": 2, "attention": [8, 4], "dropout": 0.1,
                            "image": 16, "groups": 4, "classes": 10, "in_channels": 1}, 3),
    ("unet_sigma", "unet", {"channels": 16, "mults": [1, 2], "blocks": 1, "attention": [8, 4], "dropout": 0.0,
                            "image": 8, "groups": 4, "in_channels": 2, "learn_sigma": True}, 2),
    ("dit_class", "dit", {"depth": 2, "hidden": 64, "heads": 4, "patch": 2, "image": 8, "in_channels": 4,
                          "classes": 10, "learn_sigma": True}, 3),
    ("dit_uncond", "dit", {"depth": 2, "hidden": 48, "heads": 3, "patch": 4, "image": 16, "in_channels": 3,
                           "classes": 0, "learn_sigma": False}, 2),
    ("dit_p1", "dit", {"depth": 1, "hidden": 32, "heads": 2, "patch": 1, "image": 4, "in_channels": 2,
                       "classes": 5, "class_dropout": 0, "mlp_ratio": 2, "learn_sigma": False}, 3),
]


MODEL_NOTES = (
    "output = model(input.x, input.t, input.y) in eval mode (dropout off); grad.* = d sum(output * grad_out) / d "
    "param; param.* is the full state dict (DiT pos_embed included, it has no grad). The attention key biases "
    "(UNet *.k.bias, the middle third of DiT qkv.bias) have mathematically zero gradients: their stored values "
    "are rounding noise, so compare gradients with an absolute tolerance scaled to the largest gradient")


def lua(value):
    """A Python value as a Lua literal (dicts keep their order)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "{" + ",".join(lua(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={lua(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def base_metadata(args, **extra):
    meta = {"generated_by": "tests/reference/make_cases.py", "torch": torch.__version__,
            "device": args.device, "dtype": args.dtype}
    meta.update({k: str(v) for k, v in extra.items()})
    return meta


def save(tensors, path, metadata):
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, path, metadata)


def randomize(model, generator):
    """Gives the zero-initialised weights, the biases and the norm affines small random values so
    that every parameter affects the output."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=generator))
            elif "norm" in name and p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
            elif not p.any():
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=generator) * (0.5 / fan_in ** 0.5))


def build_case(index, kind, options, batch):
    torch.manual_seed(1000 + index)
    model = models.build(kind, options)
    g = torch.Generator().manual_seed(2000 + index)
    randomize(model, g)
    image = options["image"]
    channels = options.get("in_channels", 3)
    x = torch.randn(batch, channels, image, image, generator=g)
    t = torch.randint(0, 1000, (batch,), generator=g)
    t[0], t[-1] = 0, 999
    y = None
    if options.get("classes", 0) > 0:
        classes = options["classes"]
        y = torch.randint(0, classes, (batch,), generator=g)
        if model.has_null:
            y[-1] = classes  # the null label
    return model, x, t, y, g


def forward_backward(model, x, t, y, g, device, dtype):
    model = model.to(device=device, dtype=dtype).eval()
    xd = x.to(device=device, dtype=dtype).requires_grad_()
    out = model(xd, t.to(device), None if y is None else y.to(device))
    grad_out = torch.randn(out.shape, generator=g)
    (out * grad_out.to(device=device, dtype=dtype)).sum().backward()
    grads = {f"grad.{n}": p.grad.float().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    return out.detach().float().cpu(), grad_out, grads, xd.grad.float().cpu()


def model_cases(out_dir, args):
    (out_dir / "models").mkdir(parents=True, exist_ok=True)
    built = {}
    for index, (name, kind, options, batch) in enumerate(MODEL_CASES):
        model, x, t, y, g = build_case(index, kind, options, batch)
        params = {f"param.{n}": v.detach().float().contiguous().clone() for n, v in model.state_dict().items()}
        built[name] = (kind, options, params)
        output, grad_out, grads, grad_x = forward_backward(model, x, t, y, g, args.device, DTYPES[args.dtype])
        tensors = {**params, "input.x": x, "input.t": t, "output": output, "grad_out": grad_out,
                   **grads, "grad.input.x": grad_x}
        if y is not None:
            tensors["input.y"] = y
        save(tensors, out_dir / "models" / f"{name}.safetensors",
             base_metadata(args, model=kind, options=lua(options), notes=MODEL_NOTES))
    return built


def schedule_cases(out_dir, args):
    tensors = {}
    for kind, T in (("linear", 1000), ("linear", 100), ("cosine", 1000), ("cosine", 50), ("scaled_linear", 1000)):
        s = diffusion.make_schedule(kind, T)
        for field in ("betas", "alphas_cumprod", "alphas_cumprod_prev", "posterior_variance",
                      "posterior_log_variance_clipped", "posterior_mean_coef1", "posterior_mean_coef2"):
            tensors[f"{kind}_{T}.{field}"] = torch.from_numpy(getattr(s, field).copy())
    for T, S in ((1000, 10), (1000, 1000), (1000, 1), (100, 7), (50, 50), (1000, 5), (1000, 250), (1000, 999),
                 (50, 25)):
        tensors[f"timesteps_{T}_{S}"] = torch.from_numpy(diffusion.sampling_timesteps(T, S))
    save(tensors, out_dir / "diffusion" / "schedules.safetensors",
         base_metadata(args, notes="float64 schedules <kind>_<T>.<field>; timesteps_<T>_<S> are the "
                                   "sampler's visited timesteps in descending order (int64)"))


def loss_cases(out_dir, args):
    device, dtype = args.device, DTYPES[args.dtype]
    g = torch.Generator().manual_seed(3)
    x0 = torch.randint(0, 256, (4, 3, 8, 8), generator=g).float() / 127.5 - 1  # 8-bit images: exact -1 and 1 occur
    t = torch.tensor([0, 999, 37, 500])
    noise = torch.randn(4, 3, 8, 8, generator=g)
    out = torch.randn(4, 3, 8, 8, generator=g)
    out_sigma = torch.cat([torch.randn(4, 3, 8, 8, generator=g), torch.rand(4, 3, 8, 8, generator=g) * 2 - 1], dim=1)
    tensors = {"x0": x0, "t": t, "noise": noise, "out": out, "out_sigma": out_sigma}

    def dev(v):
        return v.to(device=device, dtype=dtype)

    for sched in ("linear_1000", "cosine_1000"):
        kind, T = sched.rsplit("_", 1)
        s = diffusion.make_schedule(kind, int(T))
        tensors[f"x_t.{sched}"] = diffusion.q_sample(s, dev(x0), t.to(device), dev(noise)).float().cpu()
        for pred in diffusion.PREDICTIONS:
            for snr in ("none", "5"):
                loss, mse, _ = diffusion.training_loss(s, lambda x, tt, y: dev(out), dev(x0), t, dev(noise),
                                                       prediction=pred, min_snr_gamma=None if snr == "none" else 5.0)
                tensors[f"loss.{sched}.{pred}.{snr}"] = loss.float().cpu()
                tensors[f"mse.{sched}.{pred}.{snr}"] = mse.float().cpu()
        loss, mse, vb = diffusion.training_loss(s, lambda x, tt, y: dev(out_sigma), dev(x0), t, dev(noise))
        tensors[f"loss_sigma.{sched}.eps"] = loss.float().cpu()
        tensors[f"mse_sigma.{sched}.eps"] = mse.float().cpu()
        tensors[f"vb.{sched}"] = vb.float().cpu()
    save(tensors, out_dir / "diffusion" / "losses.safetensors",
         base_metadata(args, notes=(
             "x_t = q_sample(x0, t, noise); the model output is the fixed tensor `out` (or `out_sigma`: 2C "
             "channels, the last C are the variance interpolation in [-1, 1]); loss.<sched>.<pred>.<snr> is the "
             "scalar loss with min-SNR gamma <snr> (none = unweighted); mse.* are the WEIGHTED per-sample values "
             "weight_i * mse_i, so loss = mean(mse); loss_sigma.<sched>.eps = mean(mse_sigma) + mean(vb) "
             "(eps prediction, unweighted); vb in bits per dimension (t = 0: decoder NLL)")))


SAMPLING_DEFAULTS = {"eta": 0.0, "variance": "auto", "clip": True, "guidance": 1.0, "prediction": "eps"}

SAMPLING_CASES = [
    # name, model case, settings (SAMPLING_DEFAULTS fill the rest)
    ("ddim", "unet_uncond", {"schedule": "linear", "timesteps": 1000, "sampler": "ddim", "steps": 10}),
    ("ddpm", "unet_uncond", {"schedule": "cosine", "timesteps": 100, "sampler": "ddpm", "steps": 7,
                             "variance": "small"}),
    ("ddpm_large", "unet_uncond", {"schedule": "linear", "timesteps": 1000, "sampler": "ddpm", "steps": 4,
                                   "variance": "large"}),
    ("dit_cfg", "dit_class", {"schedule": "linear", "timesteps": 1000, "sampler": "ddpm", "steps": 5, "guidance": 4.0}),
    ("ddim_eta", "unet_uncond", {"schedule": "linear", "timesteps": 1000, "sampler": "ddim", "steps": 6, "eta": 0.5}),
    ("ddim_x0", "unet_uncond", {"schedule": "linear", "timesteps": 1000, "sampler": "ddim", "steps": 4,
                                "prediction": "x0"}),
    ("ddim_v", "unet_uncond", {"schedule": "linear", "timesteps": 1000, "sampler": "ddim", "steps": 4,
                               "prediction": "v"}),
    ("ddim_noclip", "dit_class", {"schedule": "linear", "timesteps": 1000, "sampler": "ddim", "steps": 3,
                                  "clip": False}),
]

SAMPLING_INPUTS = {
    # model case: (name of its x_T tensor, batch, labels)
    "unet_uncond": ("x_T", 2, None),
    "dit_class": ("dit_class.x_T", 3, [3, 0, 9]),
}


def sampling_cases(out_dir, args, built):
    device, dtype = args.device, DTYPES[args.dtype]
    g = torch.Generator().manual_seed(4)
    tensors, meta, inputs = {}, {}, {}
    for case, (x_T_name, batch, labels) in SAMPLING_INPUTS.items():
        kind, options, params = built[case]
        model = models.build(kind, options)
        model.load_state_dict({n[len("param."):]: v for n, v in params.items()})
        model = model.to(device=device, dtype=dtype).eval()
        image = options["image"]
        tensors[x_T_name] = torch.randn(batch, options.get("in_channels", 3), image, image, generator=g)
        if labels is not None:
            tensors[f"{case}.labels"] = torch.tensor(labels)
        inputs[case] = model
        meta[f"model.{case}"] = f"models/{case}.safetensors"

    for name, case, settings in SAMPLING_CASES:
        settings = {**SAMPLING_DEFAULTS, **settings}
        model = inputs[case]
        x_T_name, _, labels = SAMPLING_INPUTS[case]
        x_T = tensors[x_T_name]
        steps = settings["steps"]
        stochastic = settings["sampler"] == "ddpm" or settings["eta"] > 0
        noise = torch.randn(steps, *x_T.shape, generator=g) if stochastic else None

        def model_fn(x, t, y, model=model):
            return model(x.to(dtype), t, y).float()

        _, trajectory = diffusion.sample(
            diffusion.make_schedule(settings["schedule"], settings["timesteps"]), model_fn, x_T.to(device),
            sampler=settings["sampler"], steps=steps, eta=settings["eta"], variance=settings["variance"],
            clip=settings["clip"], guidance=settings["guidance"],
            labels=None if labels is None else tensors[f"{case}.labels"].to(device),
            null_label=model.classes if model.has_null else None,
            noise=None if noise is None else noise.to(device), prediction=settings["prediction"])
        tensors[f"{name}.trajectory"] = torch.stack(trajectory).float()
        tensors[f"{name}.timesteps"] = torch.from_numpy(diffusion.sampling_timesteps(settings["timesteps"], steps))
        if noise is not None:
            tensors[f"{name}.noise"] = noise
        meta[name] = lua({"model": case, "x_T": x_T_name, "labels": "none" if labels is None else f"{case}.labels",
                          "noise": "none" if noise is None else f"{name}.noise", **settings})
    meta["cases"] = lua([name for name, _, _ in SAMPLING_CASES])
    save(tensors, out_dir / "diffusion" / "sampling.safetensors",
         base_metadata(args, **meta, notes=(
             "<case>.trajectory is [S+1, B, C, H, W]: x_T then x after each step; step k uses <case>.noise[k] "
             "(the last step adds none); <case>.timesteps are the visited timesteps; models run in eval mode with "
             "the weights of the file in metadata model.<model case>; variance auto = learned for 2C-channel "
             "outputs (else large); the null label is the model's `classes`")))


def flow_loss_cases(out_dir, args):
    device, dtype = args.device, DTYPES[args.dtype]
    g = torch.Generator().manual_seed(5)
    x1 = torch.randint(0, 256, (4, 3, 8, 8), generator=g).float() / 127.5 - 1
    t = torch.tensor([0.001, 0.999, 0.37, 0.5])  # the ends of the noise and score predictions' training interval
    noise = torch.randn(4, 3, 8, 8, generator=g)
    out = torch.randn(4, 3, 8, 8, generator=g)
    tensors = {"x1": x1, "t": t, "noise": noise, "out": out}
    cases = []
    for path in transport.PATHS:
        for prediction in transport.PREDICTIONS:
            for weight in (("none",) if prediction == "velocity" else transport.WEIGHTS):
                name = f"{path}.{prediction}.{weight}"
                loss, mse, x_t = transport.training_loss(path, prediction, weight, lambda x, tt, y: out.to(device),
                                                         x1.to(device, dtype), t.to(device), noise.to(device, dtype))
                tensors[f"loss.{name}"], tensors[f"mse.{name}"] = loss.float().cpu(), mse.float().cpu()
                tensors[f"x_t.{path}"] = x_t.float().cpu()
                cases.append(name)
    save(tensors, out_dir / "flow" / "losses.safetensors",
         base_metadata(args, cases=lua(cases), notes=(
             "SiT's training loss for x1, noise (x0) and times t with the model output fixed to `out`: "
             "loss.<path>.<prediction>.<weighting> (scalar) and mse.* (per-sample weighted mean squared errors); "
             "x_t.<path> the model's input alpha x1 + sigma x0")))


FLOW_SAMPLING_DEFAULTS = {"path": "linear", "prediction": "velocity", "sde": False, "sampler": "euler",
                          "diffusion_form": "sigma", "diffusion_norm": 1.0, "last_step": "mean",
                          "last_step_size": 0.04, "guidance": 1.0, "guidance_channels": 0, "rtol": 1e-3, "atol": 1e-6, "reverse": False}

FLOW_SAMPLING_CASES = [
    # name, model case, settings (FLOW_SAMPLING_DEFAULTS fill the rest; guidance_channels 0 = all)
    ("ode_euler", "unet_uncond", {"steps": 5}),
    ("ode_heun_cfg", "dit_class", {"sampler": "heun", "steps": 4, "guidance": 4.0}),
    ("ode_euler_gvp_noise", "unet_uncond", {"path": "gvp", "prediction": "noise", "steps": 4}),
    ("ode_heun_vp_score", "dit_class", {"path": "vp", "prediction": "score", "sampler": "heun", "steps": 3}),
    ("ode_dopri5", "unet_uncond", {"sampler": "dopri5", "steps": 4}),
    ("ode_dopri5_cfg_noise", "dit_class", {"prediction": "noise", "sampler": "dopri5", "steps": 2, "guidance": 3.0,
                                           "rtol": 1e-4, "atol": 1e-4}),
    ("ode_heun_reverse_gvp_noise", "unet_uncond", {"path": "gvp", "prediction": "noise", "sampler": "heun",
                                                   "steps": 3, "reverse": True}),
    ("ode_dopri5_reverse", "dit_class", {"sampler": "dopri5", "steps": 2, "reverse": True}),
    ("sde_euler", "unet_uncond", {"sde": True, "steps": 5}),
    ("sde_heun_gvp_sbdm_tweedie", "dit_class", {"path": "gvp", "prediction": "noise", "sde": True, "sampler": "heun", "steps": 4,
                                                "diffusion_form": "sbdm", "last_step": "tweedie", "guidance": 2.0,
                                                "guidance_channels": 3}),
    ("sde_euler_vp_noise", "unet_uncond", {"path": "vp", "prediction": "noise", "sde": True, "steps": 4,
                                           "diffusion_form": "linear", "diffusion_norm": 0.5, "last_step": "euler"}),
    ("sde_euler_score_none", "unet_uncond", {"prediction": "score", "sde": True, "steps": 3,
                                             "diffusion_form": "constant", "last_step": "none"}),
    ("sde_euler_decreasing", "dit_class", {"path": "gvp", "prediction": "noise", "sde": True, "steps": 3,
                                           "diffusion_form": "decreasing", "last_step_size": 0.1}),
    ("sde_heun_incdec", "unet_uncond", {"sde": True, "sampler": "heun", "steps": 3,
                                        "diffusion_form": "increasing-decreasing"}),
]


def flow_sampling_cases(out_dir, args, built):
    device, dtype = args.device, DTYPES[args.dtype]
    g = torch.Generator().manual_seed(6)
    tensors, meta, inputs = {}, {}, {}
    for case, (x_T_name, batch, labels) in SAMPLING_INPUTS.items():
        kind, options, params = built[case]
        model = models.build(kind, options)
        model.load_state_dict({n[len("param."):]: v for n, v in params.items()})
        inputs[case] = model.to(device=device, dtype=dtype).eval()
        image = options["image"]
        tensors[x_T_name] = torch.randn(batch, options.get("in_channels", 3), image, image, generator=g)
        if labels is not None:
            tensors[f"{case}.labels"] = torch.tensor(labels)
        meta[f"model.{case}"] = f"models/{case}.safetensors"
    for name, case, settings in FLOW_SAMPLING_CASES:
        settings = {**FLOW_SAMPLING_DEFAULTS, **settings}
        model = inputs[case]
        x_T_name, _, labels = SAMPLING_INPUTS[case]
        x_T = tensors[x_T_name].to(device)

        def model_fn(x, t, y, model=model):
            return model(x.to(dtype), t, y).float()

        field = transport.Field(settings["path"], settings["prediction"], model_fn,
                                labels=None if labels is None else tensors[f"{case}.labels"].to(device),
                                guidance=settings["guidance"], null_label=model.classes if model.has_null else None,
                                channels=settings["guidance_channels"] or None)
        _, sample_eps = transport.default_eps(settings["path"], settings["prediction"])
        steps = settings["steps"]
        if settings["sde"]:
            last_size = 0.0 if settings["last_step"] == "none" else settings["last_step_size"]
            t0, t1 = transport.sampling_interval(settings["path"], settings["prediction"], sample_eps, sde=True,
                                                 form=settings["diffusion_form"], last_step_size=last_size)
            noise = torch.randn(steps, *x_T.shape, generator=g)
            tensors[f"{name}.noise"] = noise
            trajectory = transport.sample_sde(field, x_T, t0, t1, steps, settings["sampler"],
                                              settings["diffusion_form"], settings["diffusion_norm"],
                                              settings["last_step"], last_size, noise.to(device))
        else:
            t0, t1 = transport.sampling_interval(settings["path"], settings["prediction"], sample_eps)
            if settings["reverse"]:  # SiT's check_interval(reverse=True)
                t0, t1 = 1 - t0, 1 - t1
            if settings["sampler"] == "dopri5":
                trajectory = transport.sample_ode_dopri5(field, x_T, t0, t1, steps, settings["rtol"], settings["atol"])
            else:
                trajectory = transport.sample_ode(field, x_T, t0, t1, steps, settings["sampler"])
        tensors[f"{name}.trajectory"] = torch.stack(trajectory).float().cpu()
        meta[name] = lua({"model": case, "x_T": x_T_name, "labels": "none" if labels is None else f"{case}.labels",
                          "noise": f"{name}.noise" if settings["sde"] else "none", **settings})
    meta["cases"] = lua([name for name, _, _ in FLOW_SAMPLING_CASES])
    likelihoods = []
    data = torch.randint(0, 256, tuple(tensors["x_T"].shape), generator=g).float() / 127.5 - 1
    tensors["likelihood.x"] = data
    probes = torch.randint(0, 2, (2000, *data.shape), generator=g).float() * 2 - 1
    tensors["likelihood.probes"] = probes
    for name, path, prediction, method, steps, tol in (("likelihood_euler", "linear", "velocity", "euler", 4, None),
                                                       ("likelihood_heun_gvp_noise", "gvp", "noise", "heun", 3, None),
                                                       ("likelihood_dopri5", "linear", "velocity", "dopri5", 2, 1e-2)):
        field = transport.Field(path, prediction, lambda x, t, y, model=inputs["unet_uncond"]: model(x.to(dtype), t, y).float())
        _, sample_eps = transport.default_eps(path, prediction)
        t0, t1 = transport.sampling_interval(path, prediction, sample_eps)
        logp, z = transport.likelihood(field, data.to(device), t0, t1, steps, method, probes.to(device),
                                       rtol=tol or 1e-3, atol=tol or 1e-6)
        tensors[f"{name}.logp"], tensors[f"{name}.z"] = logp.float().cpu(), z.float().cpu()
        meta[name] = lua({"path": path, "prediction": prediction, "sampler": method, "steps": steps,
                          "rtol": tol or 1e-3, "atol": tol or 1e-6})
        likelihoods.append(name)
    meta["likelihoods"] = lua(likelihoods)
    save(tensors, out_dir / "flow" / "sampling.safetensors",
         base_metadata(args, **meta, notes=(
             "<case>.trajectory is [steps + 1, B, C, H, W]: x_T then x after each step (SDE: steps - 1 noisy steps, "
             "step k with <case>.noise[k], then the last step; dopri5: torchdiffeq.odeint at the steps + 1 grid times "
             "with the case's rtol and atol); <likelihood case>.logp [B] and .z: SiT's ODE likelihood of likelihood.x "
             "under unet_uncond, model evaluation k with the Rademacher likelihood.probes[k]; models as in diffusion/sampling.safetensors; "
             "SiT's default train and sample eps for the path and prediction")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    args = parser.parse_args()
    torch.set_num_threads(1)  # small tensors: threads only add overhead, and one thread fixes the reduction order
    start = time.time()
    (args.out_dir / "diffusion").mkdir(parents=True, exist_ok=True)
    (args.out_dir / "flow").mkdir(parents=True, exist_ok=True)
    built = model_cases(args.out_dir, args)
    schedule_cases(args.out_dir, args)
    loss_cases(args.out_dir, args)
    sampling_cases(args.out_dir, args, built)
    flow_loss_cases(args.out_dir, args)
    flow_sampling_cases(args.out_dir, args, built)
    print(f"wrote {args.out_dir} in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
