"""Golden trajectories for runtime/train (optimizers and EMA), with Python torch 2.11.

Run from the repository root with the venv's Python:
    ~/.cache/runner/venv/bin/python tests/golden/optimizers_foreach.py [OUTPUT]
It writes OUTPUT, by default tests/golden/optimizers_foreach.safetensors (checked in; do not edit it by hand),
read by tests/cpp/train_optimizer_test.cpp. PyTorch's CPU kernels round differently from one machine to
another, even with the same instruction set, so ctest writes a fresh copy on the machine it runs on
(build/golden/) and the C++ test checks bit equality against that one; against the checked-in copy it
checks agreement to 1e-6 relative.

Optimizers: torch.optim.AdamW / Adam / SGD with foreach=True (torch.optim.adamw._multi_tensor_adam with
decoupled weight decay, adam._multi_tensor_adam, sgd._multi_tensor_sgd) and, for the calling convention of
the fused kernels, fused=True on the CPU (adam._fused_adam -> torch._fused_adamw_ / torch._fused_adam_,
sgd._fused_sgd -> torch._fused_sgd_). Every case has two parameter groups with different learning rates
and float32 parameters of several shapes; one parameter's grad is None on some steps. The *_amsgrad cases
set amsgrad=True in one of their two groups (group 0 for AdamW, with the parameter that misses grads;
group 1 for Adam).

Tensor learning rates: torch.optim.AdamW / Adam / SGD with fused=True and each group's lr a float32 tensor
(lr=torch.tensor(...)), as runtime/train/optimizer.h's capturable step takes it: the lr of step S is the
group's lr times LR_FACTORS[S - 1], written with group["lr"].fill_() as LRScheduler does, and step
SKIPPED_STEP runs with found_inf = 1 (optimizer.found_inf, as GradScaler sets it), which the kernels skip.

EMA: the decay rule and update of diffusers' EMAModel (training_utils.py, get_decay and step), written out
here so diffusers need not be installed, plus the update_every rule of runtime/train/ema.h.

Keys (s = 1..7 is the step after which the values are taken, G/P the group and parameter index):
    init.groupG.paramP                       initial parameter
    grad.stepS.groupG.paramP                 gradient of step S (absent: grad None on that step)
    CASE.stepS.groupG.paramP.param           parameter after step S
    CASE.stepS.groupG.paramP.STATE           optimizer state after step S (step, exp_avg, exp_avg_sq,
                                             max_exp_avg_sq, momentum_buffer), absent while the parameter
                                             has none
    TLCASE.stepS.groupG.paramP.param / .STATE   the same for the tensor-lr cases
    ema.init.I / ema.param.stepS.I           EMA model parameters (initial, after optimizer step S)
    ema.buffer.stepS.0                       an EMA model buffer (copied, not averaged)
    EMACASE.stepS.I / EMACASE.stepS.buffer0  shadow after update(S)
The metadata "cases", "tensor_lr_cases" and "ema_cases" hold the settings as JSON, "lr_factors" and
"skipped_step" the tensor-lr schedule.
"""
import json
import math
import pathlib
import sys

import torch
from safetensors.torch import save_file

HERE = pathlib.Path(__file__).resolve().parent
STEPS = 7

# Parameter shapes per group; group 0 parameter 2 has grad None on some steps.
SHAPES = [[(4, 3), (5,), (2, 3, 2)], [(3, 4), (1,)]]

OPTIMIZER_CASES = {
    "adamw": dict(kind="adamw", fused=False, none_steps=[1, 4],
                  groups=[dict(lr=1e-2, weight_decay=0.01),
                          dict(lr=3e-3, weight_decay=0.01, beta1=0.8, beta2=0.99, eps=1e-6)]),
    "adam": dict(kind="adam", fused=False, none_steps=[1, 4],
                 groups=[dict(lr=1e-2, weight_decay=0.1),
                         dict(lr=2e-2, weight_decay=0.1, beta1=0.85, beta2=0.995, eps=1e-7)]),
    "sgd": dict(kind="sgd", fused=False, none_steps=[1, 4],
                groups=[dict(lr=0.1, weight_decay=1e-2, momentum=0.9, dampening=0.1),
                        dict(lr=0.05, weight_decay=0.0, momentum=0.5)]),
    "sgd_nesterov": dict(kind="sgd", fused=False, none_steps=[1, 4],
                         groups=[dict(lr=0.1, weight_decay=1e-2, momentum=0.9, nesterov=True),
                                 dict(lr=0.05, weight_decay=0.0, momentum=0.8, nesterov=True)]),
    "sgd_plain": dict(kind="sgd", fused=False, none_steps=[1, 4],
                      groups=[dict(lr=0.1, weight_decay=1e-2), dict(lr=0.3)]),
    # PyTorch's _fused_sgd cannot take a parameter whose first grad comes after other momentum buffers exist
    # (it passes None to the kernel), so the fused cases leave the grad out on later steps only.
    "adamw_fused": dict(kind="adamw", fused=True, none_steps=[3, 5],
                        groups=[dict(lr=1e-2, weight_decay=0.01),
                                dict(lr=3e-3, weight_decay=0.01, beta1=0.8, beta2=0.99, eps=1e-6)]),
    "adam_fused": dict(kind="adam", fused=True, none_steps=[3, 5],
                       groups=[dict(lr=1e-2, weight_decay=0.1),
                               dict(lr=2e-2, weight_decay=0.1, beta1=0.85, beta2=0.995, eps=1e-7)]),
    "sgd_fused": dict(kind="sgd", fused=True, none_steps=[3, 5],
                      groups=[dict(lr=0.1, weight_decay=1e-2, momentum=0.9, dampening=0.1),
                              dict(lr=0.05, weight_decay=0.0, momentum=0.5)]),
    "sgd_nesterov_fused": dict(kind="sgd", fused=True, none_steps=[3, 5],
                               groups=[dict(lr=0.1, weight_decay=1e-2, momentum=0.9, nesterov=True),
                                       dict(lr=0.05, weight_decay=0.0, momentum=0.8, nesterov=True)]),
    # AMSGrad in one group of two: the other group's parameters keep no max_exp_avg_sq.
    "adamw_amsgrad": dict(kind="adamw", fused=False, none_steps=[1, 4],
                          groups=[dict(lr=1e-2, weight_decay=0.01, beta2=0.9, amsgrad=True),
                                  dict(lr=3e-3, weight_decay=0.01, beta1=0.8, beta2=0.99, eps=1e-6)]),
    "adam_amsgrad": dict(kind="adam", fused=False, none_steps=[1, 4],
                         groups=[dict(lr=1e-2, weight_decay=0.1),
                                 dict(lr=2e-2, weight_decay=0.1, beta1=0.85, beta2=0.95, eps=1e-7, amsgrad=True)]),
    "adamw_amsgrad_fused": dict(kind="adamw", fused=True, none_steps=[3, 5],
                                groups=[dict(lr=1e-2, weight_decay=0.01, beta2=0.9, amsgrad=True),
                                        dict(lr=3e-3, weight_decay=0.01, beta1=0.8, beta2=0.99, eps=1e-6)]),
    "adam_amsgrad_fused": dict(kind="adam", fused=True, none_steps=[3, 5],
                               groups=[dict(lr=1e-2, weight_decay=0.1),
                                       dict(lr=2e-2, weight_decay=0.1, beta1=0.85, beta2=0.95, eps=1e-7,
                                            amsgrad=True)]),
}

# Fused with a float32 tensor lr per group, a changing lr and one step skipped by found_inf.
TENSOR_LR_CASES = {
    "adamw_tensor_lr": dict(kind="adamw", fused=True, none_steps=[3, 5],
                            groups=OPTIMIZER_CASES["adamw_fused"]["groups"]),
    "adam_amsgrad_tensor_lr": dict(kind="adam", fused=True, none_steps=[3, 5],
                                   groups=OPTIMIZER_CASES["adam_amsgrad_fused"]["groups"]),
    "sgd_tensor_lr": dict(kind="sgd", fused=True, none_steps=[3, 5], groups=OPTIMIZER_CASES["sgd_fused"]["groups"]),
    "sgd_plain_tensor_lr": dict(kind="sgd", fused=True, none_steps=[3, 5],
                                groups=OPTIMIZER_CASES["sgd_plain"]["groups"]),
}
LR_FACTORS = [1.0, 0.7, 1.3, 0.45, 0.9, 0.25, 0.6]
SKIPPED_STEP = 4


def initial_params():
    g = torch.Generator().manual_seed(11)
    return [[torch.randn(shape, generator=g) for shape in shapes] for shapes in SHAPES]


def gradient(step, group, index, shape):
    """A deterministic gradient: sin of a counter, computed in float64, stored as float32."""
    n = math.prod(shape)
    counter = torch.arange(n, dtype=torch.float64)
    offset = 1.3 * step + 0.7 * group + 0.45 * index
    scale = 0.5 + 0.25 * index + 0.1 * group
    return (scale * torch.sin(0.61 * counter + offset)).to(torch.float32).reshape(shape)


def has_grad(case, step, group, index):
    return not (group == 0 and index == 2 and step in case["none_steps"])


def torch_optimizer(case, params, tensor_lr=False):
    groups = []
    for settings, group_params in zip(case["groups"], params):
        lr = torch.tensor(settings["lr"]) if tensor_lr else settings["lr"]
        group = {"params": group_params, "lr": lr, "weight_decay": settings.get("weight_decay", 0.0)}
        if case["kind"] == "sgd":
            group.update(momentum=settings.get("momentum", 0.0), dampening=settings.get("dampening", 0.0),
                         nesterov=settings.get("nesterov", False))
        else:
            group.update(betas=(settings.get("beta1", 0.9), settings.get("beta2", 0.999)),
                         eps=settings.get("eps", 1e-8), amsgrad=settings.get("amsgrad", False))
        groups.append(group)
    flags = {"fused": True} if case["fused"] else {"foreach": True}
    if case["kind"] == "adamw":
        return torch.optim.AdamW(groups, **flags)
    if case["kind"] == "adam":
        return torch.optim.Adam(groups, **flags)
    return torch.optim.SGD(groups, **flags)


def optimizer_trajectories(tensors):
    init = initial_params()
    for g, group in enumerate(init):
        for p, value in enumerate(group):
            tensors[f"init.group{g}.param{p}"] = value.clone()
    # Grads of every step (the union of the schedules: a case leaves out its none_steps).
    for step in range(1, STEPS + 1):
        for g, shapes in enumerate(SHAPES):
            for p, shape in enumerate(shapes):
                tensors[f"grad.step{step}.group{g}.param{p}"] = gradient(step, g, p, shape)
    cases = [(name, case, False) for name, case in OPTIMIZER_CASES.items()]
    cases += [(name, case, True) for name, case in TENSOR_LR_CASES.items()]
    for name, case, tensor_lr in cases:
        params = [[value.clone().requires_grad_() for value in group] for group in init]
        optimizer = torch_optimizer(case, params, tensor_lr)
        for step in range(1, STEPS + 1):
            for g, group in enumerate(params):
                for p, param in enumerate(group):
                    param.grad = (tensors[f"grad.step{step}.group{g}.param{p}"].clone()
                                  if has_grad(case, step, g, p) else None)
            if tensor_lr:
                for group, settings in zip(optimizer.param_groups, case["groups"]):
                    group["lr"].fill_(settings["lr"] * LR_FACTORS[step - 1])
                if step == SKIPPED_STEP:
                    optimizer.found_inf = torch.ones(())
            optimizer.step()
            if tensor_lr and step == SKIPPED_STEP:
                del optimizer.found_inf
            for g, group in enumerate(params):
                for p, param in enumerate(group):
                    prefix = f"{name}.step{step}.group{g}.param{p}"
                    tensors[f"{prefix}.param"] = param.detach().clone()
                    for key, value in optimizer.state.get(param, {}).items():
                        if value is not None:
                            tensors[f"{prefix}.{key}"] = value.detach().clone()


# ---- EMA: diffusers' EMAModel.get_decay and step, with runner's update_every ------------------------------

EMA_SHAPES = [(3, 4), (6,), (2, 2, 2)]  # parameter 2 is frozen (requires_grad False): copied, not averaged
EMA_STEPS = 10

EMA_CASES = {
    "ema_constant": dict(decay=0.9, min_decay=0.0, update_after_step=0, warmup=False, inv_gamma=1.0,
                         power=2 / 3, update_every=1),
    "ema_warmup": dict(decay=0.999, min_decay=0.0, update_after_step=0, warmup=True, inv_gamma=1.0,
                       power=2 / 3, update_every=1),
    "ema_every3": dict(decay=0.95, min_decay=0.0, update_after_step=0, warmup=True, inv_gamma=1.0,
                       power=0.75, update_every=3),
    "ema_clamped": dict(decay=0.7, min_decay=0.55, update_after_step=2, warmup=True, inv_gamma=2.0,
                        power=2 / 3, update_every=2),
}


def diffusers_decay(options, optimization_step):
    """diffusers.training_utils.EMAModel.get_decay."""
    step = max(0, optimization_step - options["update_after_step"] - 1)
    if step <= 0:
        return 0.0
    if options["warmup"]:
        value = 1 - (1 + step / options["inv_gamma"]) ** -options["power"]
    else:
        value = options["decay"]
    value = min(value, options["decay"])
    return max(value, options["min_decay"])


def ema_params_at(step):
    """The model's parameters after optimizer step `step` (0: initial), and its buffer."""
    g = torch.Generator().manual_seed(23)
    init = [torch.randn(shape, generator=g) for shape in EMA_SHAPES]
    params = []
    for i, value in enumerate(init):
        counter = torch.arange(value.numel(), dtype=torch.float64).reshape(value.shape)
        params.append((value.double() + 0.3 * torch.sin(0.9 * counter + 0.8 * step + i)).float())
    buffer = torch.tensor([float(step), 2.0 * step], dtype=torch.float32)
    return params, buffer


def ema_trajectories(tensors):
    params0, buffer0 = ema_params_at(0)
    for i, value in enumerate(params0):
        tensors[f"ema.init.{i}"] = value
    tensors["ema.buffer.init.0"] = buffer0
    for step in range(1, EMA_STEPS + 1):
        params, buffer = ema_params_at(step)
        for i, value in enumerate(params):
            tensors[f"ema.param.step{step}.{i}"] = value
        tensors[f"ema.buffer.step{step}.0"] = buffer
    for name, options in EMA_CASES.items():
        shadow = [value.clone() for value in params0]
        shadow_buffer = buffer0.clone()
        for step in range(1, EMA_STEPS + 1):
            params, buffer = ema_params_at(step)
            if step % options["update_every"] == 0:
                # runner's rule: diffusers' step with optimization_step = the optimizer step.
                decay = diffusers_decay(options, step)
                one_minus_decay = 1 - decay
                for i, (s, p) in enumerate(zip(shadow, params)):
                    if i == 2:  # frozen: diffusers copies parameters that do not require grad
                        s.copy_(p)
                    else:
                        s.sub_(one_minus_decay * (s - p))
                shadow_buffer.copy_(buffer)
            for i, s in enumerate(shadow):
                tensors[f"{name}.step{step}.{i}"] = s.clone()
            tensors[f"{name}.step{step}.buffer0"] = shadow_buffer.clone()
            tensors[f"{name}.decay.step{step}"] = torch.tensor(diffusers_decay(options, step), dtype=torch.float64)


def main():
    # The CPU kernels split large tensors over threads and the chunk edges round differently: one thread,
    # as the C++ test uses for the bit-equality checks.
    torch.set_num_threads(1)
    tensors = {}
    optimizer_trajectories(tensors)
    ema_trajectories(tensors)
    metadata = {
        "generated_by": "tests/golden/optimizers_foreach.py",
        "torch": torch.__version__,
        # The CPU kernels (AVX2, AVX512, ...) round differently: bit equality holds on the same machine only.
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": str(torch.get_num_threads()),
        "steps": str(STEPS),
        "ema_steps": str(EMA_STEPS),
        "shapes": json.dumps(SHAPES),
        "cases": json.dumps(OPTIMIZER_CASES),
        "tensor_lr_cases": json.dumps(TENSOR_LR_CASES),
        "lr_factors": json.dumps(LR_FACTORS),
        "skipped_step": str(SKIPPED_STEP),
        "ema_shapes": json.dumps(EMA_SHAPES),
        "ema_cases": json.dumps(EMA_CASES),
    }
    output = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "optimizers_foreach.safetensors"
    output.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, output, metadata)


if __name__ == "__main__":
    main()
