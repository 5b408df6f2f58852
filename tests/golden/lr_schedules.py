"""Golden learning-rate sequences from PyTorch's schedulers for tests/cpp/lr_schedule_test.cpp.

Run from the repository root with the venv's Python (torch 2.11):
    ~/.cache/runner/venv/bin/python tests/golden/lr_schedules.py
It writes tests/golden/lr_schedules.json (checked in; do not edit it by hand).

Every case builds SGD with lr 1.0 on one parameter, so the learning rate equals runner's factor, and records
the lr that each of the case's optimizer steps uses: record lr, optimizer.step(), scheduler.step() (and, for
plateau cases, ReduceLROnPlateau.step(metric) after the steps where the case observes a metric). Each case
carries the runner options (LrScheduleOptions field names) that describe the same schedule.

Warmup is SequentialLR([LinearLR(start_factor=s, end_factor=1, total_iters=W), main], milestones=[W]), where s
defaults to runner's 1 / (W + 1) when a case gives no warmup_start_factor.
LinearLR refuses start_factor 0 (its recursive update divides by total_iters * start_factor), so warmup from
0 uses LambdaLR with LinearLR's closed form, s + (1 - s) * min(W, k) / W, in its place. Plateau cases warm
up with LinearLR and ReduceLROnPlateau on the same optimizer (SequentialLR refuses ReduceLROnPlateau).

Cosine cases run past T_max, where PyTorch's CosineAnnealingLR continues the cosine (the lr rises again
toward the base lr, reaching it at 2 * T_max); runner holds eta_min there. "pytorch_until" is the number of
leading steps where runner must equal PyTorch; the C++ test checks that PyTorch's later values rise.
"""
import json
import math
import pathlib

import torch
from torch.optim import lr_scheduler as S

HERE = pathlib.Path(__file__).resolve().parent
STEPS = 60


def optimizer():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def main_scheduler(opt, o):
    kind = o["kind"]
    if kind == "constant":
        return S.LambdaLR(opt, lambda _: 1.0)  # no schedule (ConstantLR is something else)
    if kind == "linear":
        return S.LinearLR(opt, start_factor=1.0, end_factor=o.get("min_lr_factor", 0.0), total_iters=o["total_steps"])
    if kind == "cosine":
        return S.CosineAnnealingLR(opt, T_max=o["total_steps"], eta_min=o.get("min_lr_factor", 0.0))
    if kind == "step":
        return S.StepLR(opt, step_size=o["step_size"], gamma=o.get("gamma", 0.1))
    if kind == "multistep":
        return S.MultiStepLR(opt, milestones=o["milestones"], gamma=o.get("gamma", 0.1))
    if kind == "exponential":
        return S.ExponentialLR(opt, gamma=o["gamma"])
    raise ValueError(kind)


def warmup_scheduler(opt, warmup_steps, start):
    if start is None:
        start = 1.0 / (warmup_steps + 1)
    if start == 0.0:
        try:
            S.LinearLR(optimizer(), start_factor=0.0, total_iters=warmup_steps)
            raise AssertionError("LinearLR accepted start_factor 0")
        except ValueError:
            pass
        return S.LambdaLR(opt, lambda k: start + (1.0 - start) * min(warmup_steps, k) / warmup_steps)
    return S.LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=warmup_steps)


def scheduled(o):
    opt = optimizer()
    warmup_steps = o.get("warmup_steps", 0)
    if warmup_steps == 0:
        scheduler = main_scheduler(opt, o)
    else:
        warmup = warmup_scheduler(opt, warmup_steps, o.get("warmup_start_factor"))
        scheduler = S.SequentialLR(opt, [warmup, main_scheduler(opt, o)], milestones=[warmup_steps])
    lrs = []
    for _ in range(STEPS):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return lrs


def plateau(o, metrics, observe_every):
    opt = optimizer()
    warmup_steps = o.get("warmup_steps", 0)
    warmup = warmup_scheduler(opt, warmup_steps, o.get("warmup_start_factor")) if warmup_steps else None
    settings = {key: o[key] for key in ("mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "eps")
                if key in o}
    reduce = S.ReduceLROnPlateau(opt, min_lr=o.get("min_lr_factor", 0.0), **settings)
    lrs, observed = [], iter(metrics)
    for step in range(STEPS):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if warmup is not None:
            warmup.step()
        if (step + 1) % observe_every == 0:
            reduce.step(next(observed))
    assert next(observed, None) is None, "metric count does not match the observations"
    return lrs


SCHEDULED = [
    ("constant warmup from 0", {"kind": "constant", "warmup_steps": 7, "warmup_start_factor": 0.0}),
    ("constant warmup, default start", {"kind": "constant", "warmup_steps": 7}),
    ("linear to 0.1x over 37", {"kind": "linear", "total_steps": 37, "min_lr_factor": 0.1}),
    ("linear warmup", {"kind": "linear", "total_steps": 23, "warmup_steps": 5, "warmup_start_factor": 0.1}),
    ("cosine over 41", {"kind": "cosine", "total_steps": 41}),
    ("cosine warmup from 0 to 0.05x",
     {"kind": "cosine", "total_steps": 31, "min_lr_factor": 0.05, "warmup_steps": 9, "warmup_start_factor": 0.0}),
    ("cosine warmup, default start", {"kind": "cosine", "total_steps": 31, "warmup_steps": 4}),
    ("cosine warmup of 1 step", {"kind": "cosine", "total_steps": 13, "min_lr_factor": 0.2, "warmup_steps": 1,
                                 "warmup_start_factor": 0.5}),
    ("step every 7", {"kind": "step", "step_size": 7, "gamma": 0.5}),
    ("step warmup", {"kind": "step", "step_size": 10, "gamma": 0.3, "warmup_steps": 4, "warmup_start_factor": 0.5}),
    ("multistep default gamma", {"kind": "multistep", "milestones": [5, 17, 18, 40]}),
    ("multistep warmup", {"kind": "multistep", "milestones": [1, 11, 29], "gamma": 0.6, "warmup_steps": 3,
                          "warmup_start_factor": 0.2}),
    ("exponential", {"kind": "exponential", "gamma": 0.93}),
    ("exponential warmup", {"kind": "exponential", "gamma": 0.97, "warmup_steps": 6, "warmup_start_factor": 0.01}),
]


def min_rel_metrics():
    # Improves, stalls (7.9995 is within the relative threshold of 8), improves, then stalls for good.
    return [10, 9, 8, 8, 8, 8, 8, 7.9995, 7.9994, 7.9, 7.8, 7.8, 7.8, 7.8, 7.8, 7.7] + [7.75] * 44


def max_abs_metrics():
    # Observed every 3 steps: rises by less than the absolute threshold 0.05, then by more, then stalls.
    return [0.1, 0.2, 0.24, 0.27, 0.29, 0.4, 0.41, 0.42, 0.43, 0.44, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]


PLATEAU = [
    ("plateau min rel to floor", {"kind": "plateau", "factor": 0.5, "patience": 3, "min_lr_factor": 0.01},
     min_rel_metrics(), 1),
    ("plateau max abs cooldown warmup",
     {"kind": "plateau", "mode": "max", "threshold_mode": "abs", "threshold": 0.05, "factor": 0.3, "patience": 1,
      "cooldown": 2, "warmup_steps": 5, "warmup_start_factor": 0.2}, max_abs_metrics(), 3),
    ("plateau reduces during warmup",
     {"kind": "plateau", "factor": 0.5, "patience": 1, "warmup_steps": 10, "warmup_start_factor": 0.1}, [5.0] * 30, 2),
    ("plateau eps stops reductions", {"kind": "plateau", "patience": 0}, [1.0] * STEPS, 1),
    ("plateau min abs negative metrics",
     {"kind": "plateau", "threshold_mode": "abs", "threshold": 0.5, "factor": 0.25, "patience": 2, "cooldown": 1},
     [-0.15 * k for k in range(30)], 2),
    # In rel mode a negative best times (1 - threshold) lies above best: equal and slightly worse values count
    # as better (-9.5 after -10, and every -7.5); -6.0 lies above -7.5 * 0.9 and is bad.
    ("plateau min rel negative metrics", {"kind": "plateau", "threshold": 0.1, "factor": 0.5, "patience": 1},
     [-10.0, -9.5, -9.0, -8.6, -8.2, -8.1, -8.0, -7.9] + [-7.5] * 10 + [-6.0] * 42, 1),
]


def main():
    cases = []
    for name, o in SCHEDULED:
        lrs = scheduled(o)
        until = STEPS
        if o["kind"] == "cosine":
            until = o.get("warmup_steps", 0) + o["total_steps"] + 1
            assert lrs[until] > lrs[until - 1], "CosineAnnealingLR no longer rises after T_max"
        cases.append({"name": name, "options": o, "lrs": lrs, "pytorch_until": until})
    for name, o, metrics, every in PLATEAU:
        cases.append({"name": name, "options": o, "lrs": plateau(o, metrics, every), "pytorch_until": STEPS,
                      "metrics": metrics, "observe_every": every})
    for case in cases:
        assert all(math.isfinite(v) for v in case["lrs"])
    document = {"generated_by": "tests/golden/lr_schedules.py", "torch": torch.__version__, "steps": STEPS,
                "cases": cases}
    (HERE / "lr_schedules.json").write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
