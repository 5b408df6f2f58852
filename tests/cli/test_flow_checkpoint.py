"""An official SiT checkpoint: saved as SiT's train.py saves one ({"model", "ema", "opt", "args"}, DiT's parameter
names), it loads into nn.DiT and runner.diffusion.flow samples from it what SiT's sample.py computes: the doubled batch
through forward_with_cfg (guidance on the first 3 channels), the ODE (Euler) and the SDE (Euler-Maruyama, sigma
diffusion, Mean last step) from the same noise."""
import argparse
import pathlib
import sys

import torch
from safetensors.torch import load_file, save_file

from runner_process import RunnerHomeTest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "reference"))
import models  # noqa: E402
import transport  # noqa: E402

OPTIONS = {"depth": 2, "hidden": 64, "heads": 4, "patch": 2, "image": 8, "in_channels": 4, "classes": 10,
           "learn_sigma": True, "class_dropout": 0.1}


class SiT(torch.nn.Module):
    """SiT's model as its models.py defines it around the DiT backbone: forward drops the learned-sigma channels,
    forward_with_cfg runs cat([half, half]) and guides the first 3 channels."""

    def __init__(self):
        super().__init__()
        self.net = models.build("dit", OPTIONS)

    def forward(self, x, t, y):
        return self.net(x, t, y)[:, :OPTIONS["in_channels"]]

    def forward_with_cfg(self, x, t, y, cfg_scale):
        half = x[: len(x) // 2]
        out = self.forward(torch.cat([half, half]), t, y)
        eps, rest = out[:, :3], out[:, 3:]
        cond, uncond = torch.split(eps, len(eps) // 2)
        guided = uncond + cfg_scale * (cond - uncond)
        return torch.cat([torch.cat([guided, guided]), rest], 1)


def randomize(model, generator):
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=generator) * (0.5 / max(p[0].numel(), 1) ** 0.5 if p.dim() > 1 else 0.05))


class SiTCheckpoint(RunnerHomeTest):
    def test_an_official_sit_checkpoint_loads_and_samples_as_sit_sample_py(self):
        torch.manual_seed(0)
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(1)
        model, ema = SiT(), SiT()
        randomize(ema, g)
        args = argparse.Namespace(model="SiT-S/2", image_size=64, num_classes=10, path_type="Linear",
                                  prediction="velocity", loss_weight=None, sample_eps=None, train_eps=None)
        # train.py saves model.module.state_dict(): SiT's own names, which are DiT's.
        torch.save({"model": model.net.state_dict(), "ema": ema.net.state_dict(), "opt": {}, "args": args},
                   self.dir / "0010000.pt")
        ema.eval()

        n, steps, cfg_scale = 3, 6, 4.0
        z = torch.randn(n, 4, 8, 8, generator=g)
        y = torch.tensor([3, 0, 9])
        sde_noise = torch.randn(steps, n, 4, 8, 8, generator=g)
        # sample.py: z = cat([z, z]), y = cat([y, null]), model_kwargs = {y, cfg_scale}, samples[-1].chunk(2)[0].
        doubled_y = torch.cat([y, torch.full((n,), OPTIONS["classes"])])

        def with_cfg(x, t, _labels):
            return ema.forward_with_cfg(x, t, doubled_y, cfg_scale)

        field = transport.Field("linear", "velocity", with_cfg)
        with torch.no_grad():
            ode = transport.sample_ode(field, torch.cat([z, z]), 0.0, 1.0, steps, "euler")[-1][:n]
            t0, t1 = transport.sampling_interval("linear", "velocity", 0.0, sde=True, form="sigma", last_step_size=0.04)
            sde = transport.sample_sde(field, torch.cat([z, z]), t0, t1, steps, "euler", "sigma", 1.0, "mean", 0.04,
                                       torch.cat([sde_noise, sde_noise], 1))[-1][:n]
        save_file({"z": z, "y": y, "sde_noise": sde_noise}, self.dir / "inputs.safetensors")

        self.script("sample.lua", f"""
            local inputs = torch.load("inputs.safetensors")
            local dit = nn.DiT {{ depth = 2, hidden = 64, heads = 4, patch = 2, image = 8, in_channels = 4, classes = 10,
                                 learn_sigma = true, class_dropout = 0.1 }}
            dit:load("0010000.pt", {{ key = "ema" }})
            local flow = runner.diffusion.flow {{ path = "linear", prediction = "velocity" }}
            local common = {{ x_T = inputs.z, labels = inputs.y, guidance = {cfg_scale}, guidance_channels = 3,
                              steps = {steps} }}
            local ode = flow:sample(dit, common)
            common.sde, common.noise = true, inputs.sde_noise
            local sde = flow:sample(dit, common)
            torch.save({{ ode = ode, sde = sde }}, "samples.safetensors")
        """)
        self.runner("sample.lua", check=0)
        samples = load_file(self.dir / "samples.safetensors")
        # The same float32 operations in another order: 1e-4 over values of a few units.
        torch.testing.assert_close(samples["ode"], ode, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(samples["sde"], sde, atol=1e-4, rtol=1e-4)
        self.assertGreater((samples["ode"] - z).abs().mean().item(), 0.1, "the samples moved from the noise")
