# Reference noise schedules, training losses and DDPM/DDIM samplers, as defined in docs/models-and-diffusion.md.
"""Gaussian diffusion: schedules, q_sample, the training loss and the samplers.

Schedules are float64 numpy arrays. Per-sample coefficients are gathered from them in float64 and
converted to the image dtype (float32) before they touch images, as guided-diffusion's
`_extract_into_tensor` does; everything that depends on a model output is computed in that dtype.

`model_fn(x, t, y)` is any callable returning the model output for images `x`, int64 timesteps `t`
(the original, un-respaced ones) and labels `y` (or None).
"""
import math

import numpy as np
import torch

PREDICTIONS = ("eps", "x0", "v")


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------

class Schedule:
    """A beta schedule and the float64 quantities derived from it."""

    def __init__(self, betas):
        betas = np.asarray(betas, dtype=np.float64)
        if betas.ndim != 1 or not ((betas > 0).all() and (betas <= 1).all()):
            raise ValueError("betas must be a 1-D array in (0, 1]")
        self.betas = betas
        self.timesteps = len(betas)
        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1.0)
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_log_variance_clipped = np.log(
            np.append(self.posterior_variance[1], self.posterior_variance[1:])
            if self.timesteps > 1 else betas)
        self.posterior_mean_coef1 = betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas) / (1.0 - self.alphas_cumprod)
        self.log_betas = np.log(betas)
        self.snr = self.alphas_cumprod / (1.0 - self.alphas_cumprod)


def linear_betas(timesteps, beta_start=1e-4, beta_end=0.02):
    scale = 1000.0 / timesteps
    return np.linspace(scale * beta_start, scale * beta_end, timesteps, dtype=np.float64)


def cosine_betas(timesteps, max_beta=0.999):
    def alpha_bar(u):
        return math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2

    return np.array([min(1 - alpha_bar((i + 1) / timesteps) / alpha_bar(i / timesteps), max_beta)
                     for i in range(timesteps)], dtype=np.float64)


def scaled_linear_betas(timesteps, beta_start=0.00085, beta_end=0.012):
    return np.linspace(beta_start ** 0.5, beta_end ** 0.5, timesteps, dtype=np.float64) ** 2


def make_schedule(kind="linear", timesteps=1000, beta_start=None, beta_end=None):
    ends = {k: v for k, v in (("beta_start", beta_start), ("beta_end", beta_end)) if v is not None}
    if kind == "linear":
        return Schedule(linear_betas(timesteps, **ends))
    if kind == "cosine":
        if ends:
            raise ValueError("the cosine schedule takes no beta_start/beta_end")
        return Schedule(cosine_betas(timesteps))
    if kind == "scaled_linear":
        return Schedule(scaled_linear_betas(timesteps, **ends))
    raise ValueError(f"unknown schedule {kind!r}")


def extract(values, t, like):
    """values[t] gathered in float64, converted to like's dtype, shaped [B, 1, ..., 1]."""
    if not torch.is_tensor(t):
        t = torch.as_tensor(t)
    out = torch.from_numpy(np.ascontiguousarray(values)).to(like.device)[t.to(like.device)].to(like.dtype)
    return out.reshape(-1, *([1] * (like.dim() - 1)))


def mean_flat(x):
    return x.mean(dim=list(range(1, x.dim())))


# ----------------------------------------------------------------------------------------------
# Forward process and training loss
# ----------------------------------------------------------------------------------------------

def q_sample(schedule, x0, t, noise):
    return (extract(schedule.sqrt_alphas_cumprod, t, x0) * x0
            + extract(schedule.sqrt_one_minus_alphas_cumprod, t, x0) * noise)


def predict_x0(schedule, x_t, t, out, prediction="eps"):
    """The x0 the model output stands for (unclipped)."""
    if prediction == "eps":
        return (extract(schedule.sqrt_recip_alphas_cumprod, t, x_t) * x_t
                - extract(schedule.sqrt_recipm1_alphas_cumprod, t, x_t) * out)
    if prediction == "x0":
        return out
    if prediction == "v":
        return (extract(schedule.sqrt_alphas_cumprod, t, x_t) * x_t
                - extract(schedule.sqrt_one_minus_alphas_cumprod, t, x_t) * out)
    raise ValueError(f"unknown prediction {prediction!r}")


def predict_eps(schedule, x_t, t, x0):
    """eps recomputed from an x0 prediction: (sqrt(1/abar) x_t - x0) / sqrt(1/abar - 1)."""
    return ((extract(schedule.sqrt_recip_alphas_cumprod, t, x_t) * x_t - x0)
            / extract(schedule.sqrt_recipm1_alphas_cumprod, t, x_t))


def min_snr_weights(schedule, prediction, gamma):
    """Per-timestep float64 min-SNR-gamma loss weights (Hang et al. 2023)."""
    snr = schedule.snr
    clipped = np.minimum(snr, gamma)
    if prediction == "eps":
        return clipped / snr
    if prediction == "x0":
        return clipped
    if prediction == "v":
        return clipped / (snr + 1.0)
    raise ValueError(f"unknown prediction {prediction!r}")


def normal_kl(mean1, logvar1, mean2, logvar2):
    """KL(N(mean1, exp(logvar1)) || N(mean2, exp(logvar2))), elementwise, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def approx_standard_normal_cdf(x):
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def discretized_gaussian_log_likelihood(x, means, log_scales):
    """Log-likelihood (nats) of images in [-1, 1] quantised to 256 levels; the edge bins extend to infinity."""
    centered = x - means
    inv_stdv = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_stdv * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_cdf_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta))


def vb_terms(schedule, x0, x_t, t, out_mean, out_var, prediction="eps"):
    """Per-sample variational-bound term in bits: KL(q(x_{t-1}|x_t,x0) || p(x_{t-1}|x_t)), or the
    decoder NLL at t = 0. out_var in [-1, 1] interpolates the log variance between the clipped
    posterior log variance and log beta."""
    coef1 = extract(schedule.posterior_mean_coef1, t, x_t)
    coef2 = extract(schedule.posterior_mean_coef2, t, x_t)
    x0_pred = predict_x0(schedule, x_t, t, out_mean, prediction)
    model_mean = coef1 * x0_pred + coef2 * x_t
    true_mean = coef1 * x0 + coef2 * x_t
    min_log = extract(schedule.posterior_log_variance_clipped, t, x_t)
    max_log = extract(schedule.log_betas, t, x_t)
    frac = (out_var + 1) / 2
    log_var = frac * max_log + (1 - frac) * min_log
    kl = mean_flat(normal_kl(true_mean, min_log, model_mean, log_var)) / math.log(2.0)
    nll = -mean_flat(discretized_gaussian_log_likelihood(x0, model_mean, 0.5 * log_var)) / math.log(2.0)
    return torch.where(t.to(x_t.device) == 0, nll, kl)


def training_loss(schedule, model_fn, x0, t, noise, labels=None, prediction="eps", min_snr_gamma=None):
    """Returns (loss, mse, vb): the scalar loss, the per-sample weighted mse [B] (weight_i * mse_i, so
    loss = mse.mean() + vb.mean()) and the per-sample vb term [B] (None unless the model outputs 2C
    channels)."""
    t = t.to(x0.device)
    x_t = q_sample(schedule, x0, t, noise)
    out = model_fn(x_t, t, labels)
    channels = x0.shape[1]
    if prediction == "eps":
        target = noise
    elif prediction == "x0":
        target = x0
    elif prediction == "v":
        target = (extract(schedule.sqrt_alphas_cumprod, t, x0) * noise
                  - extract(schedule.sqrt_one_minus_alphas_cumprod, t, x0) * x0)
    else:
        raise ValueError(f"unknown prediction {prediction!r}")
    mse = mean_flat((out[:, :channels] - target) ** 2)
    if min_snr_gamma is not None:
        weights = min_snr_weights(schedule, prediction, min_snr_gamma)
        mse = torch.from_numpy(weights).to(x0.device)[t].to(mse.dtype) * mse
    loss = mse.mean()
    vb = None
    if out.shape[1] == 2 * channels:
        vb = vb_terms(schedule, x0, x_t, t, out[:, :channels].detach(), out[:, channels:], prediction)
        loss = loss + vb.mean()
    elif out.shape[1] != channels:
        raise ValueError(f"model output has {out.shape[1]} channels for {channels}-channel images")
    return loss, mse, vb


def drop_labels(labels, drop, classes):
    """Replace the labels where `drop` is true by the null id `classes`."""
    return torch.where(drop, torch.full_like(labels, classes), labels)


# ----------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------

def sampling_timesteps(timesteps, steps):
    """round(linspace(0, T - 1, S)) in float64, ties to even, in descending order (int64)."""
    if not 1 <= steps <= timesteps:
        raise ValueError(f"steps must be in 1..{timesteps}")
    return np.round(np.linspace(0, timesteps - 1, steps, dtype=np.float64)).astype(np.int64)[::-1].copy()


class RespacedChain:
    """The respaced chain over the visited timesteps, indexed like them (descending, k = step)."""

    def __init__(self, schedule, steps):
        self.timesteps = sampling_timesteps(schedule.timesteps, steps)
        ascending = self.timesteps[::-1]
        abar = schedule.alphas_cumprod[ascending]
        abar_prev = np.append(1.0, abar[:-1])
        betas = 1.0 - abar / abar_prev
        posterior_variance = betas * (1.0 - abar_prev) / (1.0 - abar)
        if len(ascending) > 1:
            clipped = np.append(posterior_variance[1], posterior_variance[1:])
            large = np.append(posterior_variance[1], betas[1:])
        else:
            clipped = betas
            large = betas
        tables = {
            "alphas_cumprod": abar,
            "alphas_cumprod_prev": abar_prev,
            "betas": betas,
            "log_betas": np.log(betas),
            "posterior_variance": posterior_variance,
            "posterior_log_variance_clipped": np.log(clipped),
            "log_variance_large": np.log(large),
            "posterior_mean_coef1": betas * np.sqrt(abar_prev) / (1.0 - abar),
            "posterior_mean_coef2": (1.0 - abar_prev) * np.sqrt(1.0 - betas) / (1.0 - abar),
        }
        for name, values in tables.items():  # reversed into step order
            setattr(self, name, values[::-1].copy())


def guided_output(model_fn, x, t, labels, guidance, null_label):
    """One model call; with guidance != 1 a single batched call on cat([x, x]) with labels
    cat([y, null]), guiding the first C output channels (the rest come from the conditional half)."""
    if guidance == 1.0:
        return model_fn(x, t, labels)
    if labels is None or null_label is None:
        raise ValueError("classifier-free guidance needs labels and null_label")
    null = torch.full_like(labels, null_label)
    out = model_fn(torch.cat([x, x]), torch.cat([t, t]), torch.cat([labels, null]))
    cond, uncond = out.chunk(2)
    channels = x.shape[1]
    guided = uncond[:, :channels] + guidance * (cond[:, :channels] - uncond[:, :channels])
    return torch.cat([guided, cond[:, channels:]], dim=1)


@torch.no_grad()
def sample(schedule, model_fn, x_T, sampler="ddim", steps=50, eta=0.0, variance="auto", clip=True,
           guidance=1.0, labels=None, null_label=None, noise=None, prediction="eps", generator=None):
    """Runs the sampler from x_T and returns (final x, trajectory) where trajectory is the list
    [x_T, x after step 0, ..., x after step S-1]. Step k (k = 0 at the largest t) adds noise[k]
    (noise is [S, B, C, H, W]; drawn from `generator` when not given). variance: "auto" (learned when
    the model outputs 2C channels, else "large"), "learned", "small" or "large" (DDPM only)."""
    if sampler not in ("ddim", "ddpm"):
        raise ValueError(f"unknown sampler {sampler!r}")
    chain = RespacedChain(schedule, steps)
    x = x_T
    channels = x.shape[1]
    trajectory = [x]
    for k, timestep in enumerate(chain.timesteps):
        last = k == len(chain.timesteps) - 1
        t = torch.full((x.shape[0],), int(timestep), dtype=torch.long, device=x.device)
        step = torch.full((x.shape[0],), k, dtype=torch.long, device=x.device)
        out = guided_output(model_fn, x, t, labels, guidance, null_label)
        learned = out.shape[1] == 2 * channels
        if not learned and out.shape[1] != channels:
            raise ValueError(f"model output has {out.shape[1]} channels for {channels}-channel images")
        x0 = predict_x0(schedule, x, t, out[:, :channels], prediction)
        if clip:
            x0 = x0.clamp(-1, 1)

        z = None
        if not last:
            z = noise[k] if noise is not None else torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)

        if sampler == "ddpm":
            mean = extract(chain.posterior_mean_coef1, step, x) * x0 + extract(chain.posterior_mean_coef2, step, x) * x
            kind = variance if variance != "auto" else ("learned" if learned else "large")
            if kind == "learned":
                if not learned:
                    raise ValueError("a learned variance needs a model with 2C output channels")
                min_log = extract(chain.posterior_log_variance_clipped, step, x)
                max_log = extract(chain.log_betas, step, x)
                frac = (out[:, channels:] + 1) / 2
                log_var = frac * max_log + (1 - frac) * min_log
            elif kind == "small":
                log_var = extract(chain.posterior_log_variance_clipped, step, x)
            elif kind == "large":
                log_var = extract(chain.log_variance_large, step, x)
            else:
                raise ValueError(f"unknown variance {variance!r}")
            x = mean if last else mean + torch.exp(0.5 * log_var) * z
        else:
            eps = predict_eps(schedule, x, t, x0)
            abar = extract(chain.alphas_cumprod, step, x)
            abar_prev = extract(chain.alphas_cumprod_prev, step, x)
            sigma = eta * torch.sqrt((1 - abar_prev) / (1 - abar)) * torch.sqrt(1 - abar / abar_prev)
            mean = x0 * torch.sqrt(abar_prev) + torch.sqrt(1 - abar_prev - sigma ** 2) * eps
            x = mean if last else mean + sigma * z
        trajectory.append(x)
    return x, trajectory
