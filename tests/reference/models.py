# Reference PyTorch DDPM UNet and DiT, as defined in docs/models-and-diffusion.md.
"""The two built-in diffusion backbones, written from the papers and the page.

`UNet(**options)` is the DDPM UNet (Ho et al. 2020) and `DiT(**options)` the Diffusion Transformer
(Peebles & Xie 2023). Options use the Lua names of `nn.UNet{...}` and `nn.DiT{...}`; state-dict names
are the page's. Both are called as `model(x, t, y=None)` with integer timesteps `t` and 0-based int64
labels `y`; the null label (classifier-free guidance) has id `classes`.

Label dropout is not applied here: it is drawn by the trainer, which passes the null id itself.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

UNET_DEFAULTS = {
    "in_channels": 3, "out_channels": None, "channels": 128, "mults": (1, 2, 2, 2), "blocks": 2,
    "attention": (16,), "dropout": 0.1, "image": 32, "classes": 0, "class_dropout": 0.1, "groups": 32,
    "learn_sigma": False, "checkpoint": False,
}

DIT_SIZES = {
    "S": (12, 384, 6),
    "B": (12, 768, 12),
    "L": (24, 1024, 16),
    "XL": (28, 1152, 16),
}

DIT_DEFAULTS = {
    "size": None, "depth": None, "hidden": None, "heads": None, "patch": None, "image": 32,
    "in_channels": 4, "classes": 1000, "class_dropout": 0.1, "mlp_ratio": 4, "learn_sigma": True,
    "checkpoint": False,
}


def _options(defaults, given, model):
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"{model}: unknown option(s) {', '.join(unknown)}")
    return {**defaults, **given}


# ----------------------------------------------------------------------------------------------
# DDPM UNet
# ----------------------------------------------------------------------------------------------

def ddpm_timestep_embedding(t, dim):
    """DDPM's sinusoidal embedding: cat(sin(t f), cos(t f)), f_k = exp(-k ln(10000) / (half - 1))."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * -step)
    args = t.float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=1)
    if dim % 2 == 1:
        emb = F.pad(emb, (0, 1))
    return emb


class ResnetBlock(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels, dropout, groups):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels, eps=1e-6)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.temb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = nn.GroupNorm(groups, out_channels, eps=1e-6)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)
        else:
            self.nin_shortcut = None

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        shortcut = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return shortcut + h


class AttnBlock(nn.Module):
    def __init__(self, channels, groups):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        b, c, height, width = x.shape
        h = self.norm(x)

        def tokens(t):  # [B, C, H, W] -> [B, 1, H*W, C]: one head over all positions
            return t.reshape(b, c, height * width).transpose(1, 2)[:, None]

        h = F.scaled_dot_product_attention(tokens(self.q(h)), tokens(self.k(h)), tokens(self.v(h)))
        h = h[:, 0].transpose(1, 2).reshape(b, c, height, width)
        return x + self.proj_out(h)


class Downsample(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UNet(nn.Module):
    def __init__(self, **options):
        super().__init__()
        o = _options(UNET_DEFAULTS, options, "UNet")
        self.options = o
        ch = o["channels"]
        mults = tuple(o["mults"])
        attention = set(o["attention"])
        groups, dropout = o["groups"], o["dropout"]
        self.channels = ch
        self.in_channels = o["in_channels"]
        self.out_channels = o["out_channels"] or self.in_channels * (2 if o["learn_sigma"] else 1)
        self.classes = o["classes"]
        self.has_null = self.classes > 0
        self.image = o["image"]
        self.levels = len(mults)
        self.blocks = o["blocks"]
        self.temb_ch = 4 * ch

        self.temb = nn.Module()
        self.temb.dense = nn.ModuleList([nn.Linear(ch, self.temb_ch), nn.Linear(self.temb_ch, self.temb_ch)])
        self.label_emb = nn.Embedding(self.classes + 1, self.temb_ch) if self.classes > 0 else None
        self.conv_in = nn.Conv2d(self.in_channels, ch, 3, padding=1)

        resolution = self.image
        widths = [ch]  # width of every tensor pushed on the skip stack
        block_in = ch
        self.down = nn.ModuleList()
        for i, mult in enumerate(mults):
            level = nn.Module()
            level.block = nn.ModuleList()
            level.attn = nn.ModuleList()
            block_out = ch * mult
            for _ in range(self.blocks):
                level.block.append(ResnetBlock(block_in, block_out, self.temb_ch, dropout, groups))
                block_in = block_out
                if resolution in attention:
                    level.attn.append(AttnBlock(block_in, groups))
                widths.append(block_in)
            if i != self.levels - 1:
                level.downsample = Downsample(block_in)
                resolution //= 2
                widths.append(block_in)
            self.down.append(level)

        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in, self.temb_ch, dropout, groups)
        self.mid.attn_1 = AttnBlock(block_in, groups)
        self.mid.block_2 = ResnetBlock(block_in, block_in, self.temb_ch, dropout, groups)

        up_levels = [None] * self.levels
        for i in reversed(range(self.levels)):
            level = nn.Module()
            level.block = nn.ModuleList()
            level.attn = nn.ModuleList()
            block_out = ch * mults[i]
            for _ in range(self.blocks + 1):
                level.block.append(ResnetBlock(block_in + widths.pop(), block_out, self.temb_ch, dropout, groups))
                block_in = block_out
                if resolution in attention:
                    level.attn.append(AttnBlock(block_in, groups))
            if i != 0:
                level.upsample = Upsample(block_in)
                resolution *= 2
            up_levels[i] = level
        self.up = nn.ModuleList(up_levels)

        self.norm_out = nn.GroupNorm(groups, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, self.out_channels, 3, padding=1)
        self.initialize_weights()

    def initialize_weights(self):
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, ResnetBlock):
                nn.init.zeros_(module.conv2.weight)
            elif isinstance(module, AttnBlock):
                nn.init.zeros_(module.proj_out.weight)
        nn.init.zeros_(self.conv_out.weight)
        if self.label_emb is not None:
            nn.init.normal_(self.label_emb.weight, std=0.02)

    def forward(self, x, t, y=None):
        temb = ddpm_timestep_embedding(t, self.channels).to(x.dtype)
        temb = self.temb.dense[1](F.silu(self.temb.dense[0](temb)))
        if self.label_emb is not None:
            if y is None:
                y = torch.full((x.shape[0],), self.classes, dtype=torch.long, device=x.device)
            temb = temb + self.label_emb(y)

        hs = [self.conv_in(x)]
        for i, level in enumerate(self.down):
            for j in range(self.blocks):
                h = level.block[j](hs[-1], temb)
                if len(level.attn) > 0:
                    h = level.attn[j](h)
                hs.append(h)
            if i != self.levels - 1:
                hs.append(level.downsample(hs[-1]))

        h = self.mid.block_1(hs[-1], temb)
        h = self.mid.attn_1(h)
        h = self.mid.block_2(h, temb)

        for i in reversed(range(self.levels)):
            level = self.up[i]
            for j in range(self.blocks + 1):
                h = level.block[j](torch.cat([h, hs.pop()], dim=1), temb)
                if len(level.attn) > 0:
                    h = level.attn[j](h)
            if i != 0:
                h = level.upsample(h)

        return self.conv_out(F.silu(self.norm_out(h)))


# ----------------------------------------------------------------------------------------------
# DiT
# ----------------------------------------------------------------------------------------------

def dit_timestep_embedding(t, dim=256, max_period=10000):
    """DiT's frequency embedding: cat(cos(t f), sin(t f)), f_k = exp(-ln(10000) k / half)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


def sincos_pos_embed_1d(dim, positions):
    """[M] float64 positions -> [M, dim]: cat(sin(pos w), cos(pos w)), w_k = 1 / 10000^(k / (dim/2))."""
    omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
    omega = 1.0 / 10000 ** omega
    out = np.outer(positions, omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def sincos_pos_embed_2d(dim, grid):
    """[grid*grid, dim] float64: first dim/2 channels encode the column, the last dim/2 the row."""
    rows, columns = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64), indexing="ij")
    return np.concatenate([sincos_pos_embed_1d(dim // 2, columns.reshape(-1)),
                           sincos_pos_embed_1d(dim // 2, rows.reshape(-1))], axis=1)


class PatchEmbed(nn.Module):
    def __init__(self, in_channels, hidden, patch):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, hidden, patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden, frequency_dim=256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t):
        return self.mlp(dit_timestep_embedding(t, self.frequency_dim).to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    def __init__(self, classes, hidden, class_dropout):
        super().__init__()
        self.embedding_table = nn.Embedding(classes + (1 if class_dropout > 0 else 0), hidden)

    def forward(self, y):
        return self.embedding_table(y)


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.fc1 = nn.Linear(hidden, inner)
        self.fc2 = nn.Linear(inner, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    def __init__(self, hidden, heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden, int(hidden * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))

    def forward(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=-1)
        x = x + gate1[:, None] * self.attn(modulate(self.norm1(x), shift1, scale1))
        x = x + gate2[:, None] * self.mlp(modulate(self.norm2(x), shift2, scale2))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden, patch, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


def dit_dimensions(o):
    """(depth, hidden, heads, patch) from `size` ("DiT-XL/2") overridden by explicit options."""
    depth = hidden = heads = patch = None
    if o["size"] is not None:
        name = o["size"][4:] if o["size"].startswith("DiT-") else o["size"]
        family, _, patch_text = name.partition("/")
        if family not in DIT_SIZES or not patch_text.isdigit():
            raise ValueError(f"DiT: unknown size {o['size']!r}")
        depth, hidden, heads = DIT_SIZES[family]
        patch = int(patch_text)
    depth = o["depth"] if o["depth"] is not None else depth
    hidden = o["hidden"] if o["hidden"] is not None else hidden
    heads = o["heads"] if o["heads"] is not None else heads
    patch = o["patch"] if o["patch"] is not None else patch
    if None in (depth, hidden, heads, patch):
        raise ValueError("DiT: give `size` or all of depth, hidden, heads, patch")
    return depth, hidden, heads, patch


class DiT(nn.Module):
    def __init__(self, **options):
        super().__init__()
        o = _options(DIT_DEFAULTS, options, "DiT")
        self.options = o
        depth, hidden, heads, patch = dit_dimensions(o)
        if o["image"] % patch != 0 or hidden % heads != 0 or hidden % 4 != 0:
            raise ValueError("DiT: image must be a multiple of patch, hidden of heads and of 4")
        self.in_channels = o["in_channels"]
        self.out_channels = self.in_channels * (2 if o["learn_sigma"] else 1)
        self.patch = patch
        self.grid = o["image"] // patch
        self.classes = o["classes"]
        self.has_null = self.classes > 0 and o["class_dropout"] > 0

        self.x_embedder = PatchEmbed(self.in_channels, hidden, patch)
        self.t_embedder = TimestepEmbedder(hidden)
        self.y_embedder = LabelEmbedder(self.classes, hidden, o["class_dropout"]) if self.classes > 0 else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid * self.grid, hidden), requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(hidden, heads, o["mlp_ratio"]) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden, patch, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self):
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        pos = sincos_pos_embed_2d(self.pos_embed.shape[-1], self.grid)
        with torch.no_grad():
            self.pos_embed.copy_(torch.from_numpy(pos).float()[None])
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        if self.y_embedder is not None:
            nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[1].weight)
            nn.init.zeros_(block.adaLN_modulation[1].bias)
        nn.init.zeros_(self.final_layer.adaLN_modulation[1].weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation[1].bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def unpatchify(self, x):
        b, p, c, g = x.shape[0], self.patch, self.out_channels, self.grid
        x = x.reshape(b, g, g, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(b, c, g * p, g * p)

    def forward(self, x, t, y=None):
        x = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t)
        if self.y_embedder is not None:
            if y is None:
                if not self.has_null:
                    raise ValueError("DiT: labels are required (no null label with class_dropout 0)")
                y = torch.full((x.shape[0],), self.classes, dtype=torch.long, device=x.device)
            c = c + self.y_embedder(y)
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)
        return self.unpatchify(x)


def build(model, options):
    """`build("unet", {...})` or `build("dit", {...})`."""
    return {"unet": UNet, "dit": DiT}[model](**options)


def parameter_count(model, trainable_only=False):
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
