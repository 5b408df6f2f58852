# Flow matching written from SiT's definitions (Ma et al. 2024; willisma/SiT transport/): paths, loss, ODE/SDE samplers.
"""Time runs as in SiT: t = 0 is noise, t = 1 data, x_t = alpha(t) x1 + sigma(t) x0 with x0 ~ N(0, I).

Coefficients are evaluated in float64 at the float32 times the model sees, then rounded to float32.
"""
import math

import torch

VP_BETA_MIN, VP_BETA_MAX = 0.1, 20.0
PATHS = ("linear", "gvp", "vp")
PREDICTIONS = ("velocity", "noise", "score")
WEIGHTS = ("none", "velocity", "likelihood")


class Path:
    """One interpolant: alpha, sigma, their time derivatives, and the SDE's drift and diffusion terms."""

    def __init__(self, kind):
        if kind not in PATHS:
            raise ValueError(kind)
        self.kind = kind

    def _vp_m(self, t):
        # log alpha(t) = -(1/4) (1-t)^2 (b_max - b_min) - (1/2) (1-t) b_min: the VP SDE's mean coefficient
        return -0.25 * (1 - t) ** 2 * (VP_BETA_MAX - VP_BETA_MIN) - 0.5 * (1 - t) * VP_BETA_MIN

    def _vp_dm(self, t):
        return 0.5 * (1 - t) * (VP_BETA_MAX - VP_BETA_MIN) + 0.5 * VP_BETA_MIN

    def alpha(self, t):
        """(alpha, d alpha / dt)"""
        t = t.double()
        if self.kind == "linear":
            return t, torch.ones_like(t)
        if self.kind == "gvp":
            return torch.sin(math.pi / 2 * t), math.pi / 2 * torch.cos(math.pi / 2 * t)
        a = torch.exp(self._vp_m(t))
        return a, a * self._vp_dm(t)

    def sigma(self, t):
        """(sigma, d sigma / dt)"""
        t = t.double()
        if self.kind == "linear":
            return 1 - t, -torch.ones_like(t)
        if self.kind == "gvp":
            return torch.cos(math.pi / 2 * t), -math.pi / 2 * torch.sin(math.pi / 2 * t)
        s = torch.sqrt(1 - torch.exp(2 * self._vp_m(t)))
        # d/dt sqrt(1 - e^{2m}) = -e^{2m} m' / sigma
        return s, -torch.exp(2 * self._vp_m(t)) * self._vp_dm(t) / s

    def drift(self, t):
        """(f, g): the probability-flow velocity is -f x + g score (f = -d log alpha / dt for the linear and GVP
        paths, -beta(t) / 2 for VP; g = f-related diffusion: (d alpha/alpha) sigma^2 - sigma d sigma, or beta / 2)."""
        t = t.double()
        if self.kind == "vp":
            beta = VP_BETA_MIN + (1 - t) * (VP_BETA_MAX - VP_BETA_MIN)
            return -0.5 * beta, 0.5 * beta
        a, da = self.alpha(t)
        s, ds = self.sigma(t)
        ratio = da / a
        return -ratio, ratio * s * s - s * ds

    def diffusion(self, t, form, norm):
        t = t.double()
        if form == "constant":
            return torch.full_like(t, norm)
        if form == "sbdm":
            return norm * self.drift(t)[1]
        if form == "sigma":
            return norm * self.sigma(t)[0]
        if form == "linear":
            return norm * (1 - t)
        if form == "decreasing":
            return 0.25 * (norm * torch.cos(math.pi * t) + 1) ** 2
        if form == "increasing-decreasing":
            return norm * torch.sin(math.pi * t) ** 2
        raise ValueError(form)


def bcast(c, x):
    return c.to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))


def default_eps(path, prediction):
    """SiT's create_transport defaults: (train_eps, sample_eps)."""
    if path == "vp":
        return 1e-5, 1e-3
    if prediction != "velocity":
        return 1e-3, 1e-3
    return 0.0, 0.0


def sampling_interval(path, prediction, sample_eps, sde=False, form="sigma", last_step_size=0.0):
    end = 1 - sample_eps if (not sde or last_step_size == 0) else 1 - last_step_size
    if path == "vp":
        return 0.0, end
    if prediction != "velocity" or sde:
        start = sample_eps if (form == "sbdm" and sde) or prediction != "velocity" else 0.0
        return start, end
    return 0.0, 1.0


def training_loss(path_kind, prediction, weighting, model_fn, x1, t, x0, labels=None):
    """Per-sample weighted mean squared errors [B] and their mean; the model gets x_t and t (float32)."""
    path = Path(path_kind)
    t = t.float()
    a, da = path.alpha(t)
    s, ds = path.sigma(t)
    x_t = bcast(a, x1) * x1 + bcast(s, x1) * x0
    out = model_fn(x_t, t, labels).float()
    if out.shape[1] == 2 * x1.shape[1]:
        out = out[:, : x1.shape[1]]
    if prediction == "velocity":
        err = (out - (bcast(da, out) * x1 + bcast(ds, out) * x0)) ** 2
    else:
        g = path.drift(t)[1]
        weight = {"none": None, "velocity": (g / s) ** 2, "likelihood": g / s ** 2}[weighting]
        err = (out - x0) ** 2 if prediction == "noise" else (out * bcast(s, out) + x0) ** 2
        if weight is not None:
            err = bcast(weight, out) * err
    mse = err.flatten(1).mean(1)
    return mse.mean(), mse, x_t


class Field:
    """The velocity and score of a model at (x, t), with classifier-free guidance as SiT's forward_with_cfg."""

    def __init__(self, path_kind, prediction, model_fn, labels=None, guidance=1.0, null_label=None, channels=None):
        self.path, self.prediction, self.model_fn = Path(path_kind), prediction, model_fn
        self.labels, self.guidance, self.null_label, self.channels = labels, guidance, null_label, channels

    def output(self, x, t):
        tt = torch.full((x.shape[0],), t, dtype=torch.float32, device=x.device)
        C = x.shape[1]
        if self.guidance == 1.0:
            out = self.model_fn(x, tt, self.labels).float()
        else:
            y = torch.cat([self.labels, torch.full_like(self.labels, self.null_label)])
            both = self.model_fn(torch.cat([x, x]), torch.cat([tt, tt]), y).float()
            cond, uncond = both.chunk(2)
            k = self.channels or C
            out = torch.cat([uncond[:, :k] + self.guidance * (cond[:, :k] - uncond[:, :k]), cond[:, k:]], 1)
        return out[:, :C], tt

    def score_of(self, out, x, tt):
        a, da = self.path.alpha(tt)
        s, ds = self.path.sigma(tt)
        if self.prediction == "score":
            return out
        if self.prediction == "noise":
            return out / -bcast(s, x)
        r = a / da
        return (bcast(r, x) * out - x) / bcast(s * s - r * ds * s, x)

    def velocity_of(self, out, x, tt):
        if self.prediction == "velocity":
            return out
        f, g = self.path.drift(tt)
        return -bcast(f, x) * x + bcast(g, x) * self.score_of(out, x, tt)

    def velocity(self, x, t):
        out, tt = self.output(x, t)
        return self.velocity_of(out, x, tt)

    def score(self, x, t):
        out, tt = self.output(x, t)
        return self.score_of(out, x, tt)

    def sde_drift(self, x, t, form, norm):
        out, tt = self.output(x, t)
        return self.velocity_of(out, x, tt) + bcast(self.path.diffusion(tt, form, norm), x) * self.score_of(out, x, tt)


@torch.no_grad()
def sample_ode(field, x, t0, t1, steps, method):
    """Fixed-step Euler or Heun (torchdiffeq's euler, heun2) over the float32 grid linspace(t0, t1, steps + 1)."""
    grid = torch.linspace(t0, t1, steps + 1)
    xs = [x]
    for i in range(steps):
        t, dt = grid[i].item(), (grid[i + 1] - grid[i]).item()
        k1 = field.velocity(x, t)
        if method == "heun":
            k2 = field.velocity(x + dt * k1, t + dt)
            x = x + dt * (0.5 * k1 + 0.5 * k2)
        else:
            x = x + dt * k1
        xs.append(x)
    return xs


@torch.no_grad()
def sample_ode_dopri5(field, x, t0, t1, steps, rtol, atol):
    """torchdiffeq's adaptive dopri5 (what SiT's ODE sampler calls) through the grid linspace(t0, t1, steps + 1)."""
    from torchdiffeq import odeint
    grid = torch.linspace(t0, t1, steps + 1)
    return list(odeint(lambda t, y: field.velocity(y, t.item()), x, grid, method="dopri5", rtol=rtol, atol=atol))


@torch.no_grad()
def sample_sde(field, x, t0, t1, steps, method, form, norm, last_step, last_step_size, noise):
    """Euler-Maruyama or Heun over linspace(t0, t1, steps) (steps - 1 steps, step k with noise[k]), then the last
    step to t1 (SiT's Sampler.sample_sde)."""
    grid = torch.linspace(t0, t1, steps)
    dt = (grid[1] - grid[0]).item()
    xs = [x]
    for i in range(steps - 1):
        t = grid[i].item()
        tt = torch.full((x.shape[0],), t, dtype=torch.float32)
        dw = noise[i] * math.sqrt(dt)
        w = bcast(field.path.diffusion(tt, form, norm), x)
        if method == "heun":
            xh = x + torch.sqrt(2 * w) * dw
            k1 = field.sde_drift(xh, t, form, norm)
            k2 = field.sde_drift(xh + dt * k1, t + dt, form, norm)
            x = xh + 0.5 * dt * (k1 + k2)
        else:
            x = x + field.sde_drift(x, t, form, norm) * dt + torch.sqrt(2 * w) * dw
        xs.append(x)
    if last_step == "mean":
        x = x + field.sde_drift(x, t1, form, norm) * last_step_size
    elif last_step == "euler":
        x = x + field.velocity(x, t1) * last_step_size
    elif last_step == "tweedie":
        tt = torch.full((x.shape[0],), t1, dtype=torch.float32)
        a, s = field.path.alpha(tt)[0], field.path.sigma(tt)[0]
        x = x / bcast(a, x) + bcast(s * s, x) / bcast(a, x) * field.score(x, t1)
    xs.append(x)
    return xs


def likelihood(field, x, t0, t1, steps, method, probes, rtol=1e-3, atol=1e-6):
    """SiT's sample_ode_likelihood: the probability-flow ODE backwards from data (model time 1 - s for s over
    linspace(t0, t1, steps + 1)) with the Hutchinson divergence probe . d(v . probe)/dx, model evaluation k taking
    probes[k]; logp = log N(z; 0, I) - the integrated divergence. Returns (logp [B], z)."""
    count = [0]

    def f(s, state):
        y = state[0]
        t = (1 - torch.as_tensor(s, dtype=torch.float32)).item()
        probe = probes[count[0]]
        count[0] += 1
        with torch.enable_grad():
            y = y.detach().requires_grad_(True)
            v = field.velocity(y, t)
            grad = torch.autograd.grad((v * probe).sum(), y)[0]
        return (-v.detach(), (grad * probe).flatten(1).sum(1))

    state = (x, torch.zeros(x.shape[0]))
    grid = torch.linspace(t0, t1, steps + 1)
    if method == "dopri5":
        from torchdiffeq import odeint
        out = odeint(f, state, grid, method="dopri5", rtol=rtol, atol=atol)
        z, delta = out[0][-1], out[1][-1]
    else:
        for i in range(steps):
            s, dt = grid[i].item(), (grid[i + 1] - grid[i]).item()
            k1 = f(s, state)
            if method == "heun":
                k2 = f(s + dt, tuple(a + dt * b for a, b in zip(state, k1)))
                state = tuple(a + dt * (0.5 * b + 0.5 * c) for a, b, c in zip(state, k1, k2))
            else:
                state = tuple(a + dt * b for a, b in zip(state, k1))
        z, delta = state
    n = z[0].numel()
    prior = -n / 2 * math.log(2 * math.pi) - (z ** 2).flatten(1).sum(1) / 2
    return prior - delta, z
