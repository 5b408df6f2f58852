"""nn.AutoencoderKL against diffusers' AutoencoderKL with random weights: encode and decode in float32, float64 and
bfloat16, from a diffusers folder, one safetensors file (older attention names too) or a .pt; errors name the file."""
import json

import torch
from diffusers import AutoencoderKL
from safetensors.torch import load_file, save_file

from runner_process import RunnerHomeTest

OPTIONS = {"block_out_channels": (16, 32, 32), "layers_per_block": 1, "norm_num_groups": 8, "latent_channels": 4}
LUA_OPTIONS = "{ block_out_channels = { 16, 32, 32 }, layers_per_block = 1, norm_num_groups = 8, latent_channels = 4 }"

SCRIPT = """
local tensors = torch.load("inputs.safetensors")
local vae = nn.AutoencoderKL.load(arg[1], arg[2] and loadstring("return " .. arg[2])())
local dtype = arg[3] or "float32"
vae:to(dtype)
local info = vae:info()
print("downsample", info.downsample, "scaling", info.scaling_factor)
torch.no_grad(function()
  local mean, logvar = vae:encode(tensors.x:to(dtype))
  torch.save({ mean = mean:float(), logvar = logvar:float(), decoded = vae:decode(tensors.z:to(dtype)):float() },
             "outputs.safetensors")
end)
"""


def make_vae():
    torch.manual_seed(0)
    vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
                        **OPTIONS).eval()
    with torch.no_grad():
        for parameter in vae.parameters():
            if parameter.dim() == 1:  # biases and norm affines: small random values so that each one matters
                parameter.add_(0.1 * torch.randn_like(parameter))
    return vae


class Autoencoder(RunnerHomeTest):
    def setUp(self):
        super().setUp()
        self.vae = make_vae()
        self.vae.save_pretrained(self.dir / "vae", safe_serialization=True)
        generator = torch.Generator().manual_seed(1)
        self.x = torch.rand(2, 3, 32, 32, generator=generator) * 2 - 1
        self.z = torch.randn(2, 4, 8, 8, generator=generator)
        save_file({"x": self.x, "z": self.z}, self.dir / "inputs.safetensors")
        self.script("vae.lua", SCRIPT)

    def reference(self, dtype):
        vae = make_vae().to(dtype)
        with torch.no_grad():
            posterior = vae.encode(self.x.to(dtype)).latent_dist
            return {"mean": posterior.mean.float(), "logvar": posterior.logvar.float(),
                    "decoded": vae.decode(self.z.to(dtype)).sample.float()}

    def compare(self, dtype, tolerance, *args):
        result = self.runner("vae.lua", "--", *args, check=0)
        self.assertIn("downsample\t4\tscaling\t0.18215", result.stdout)
        outputs = load_file(self.dir / "outputs.safetensors")
        for name, expected in self.reference(dtype).items():
            worst = (outputs[name] - expected).abs().max().item()
            self.assertLessEqual(worst, tolerance * expected.abs().max().item(), f"{name} in {dtype}: max |diff| {worst}")

    def test_equal_to_diffusers_from_a_folder(self):
        # float32: the same operations in the same order: 1e-5 of the largest value (the bar).
        self.compare(torch.float32, 1e-5, "vae")
        self.compare(torch.float64, 1e-10, "vae", "nil", "float64")
        # bfloat16 on both sides: 8-bit mantissas through about 20 layers, summed in other orders.
        self.compare(torch.bfloat16, 0.05, "vae", "nil", "bfloat16")

    def test_one_file_with_options_older_names_and_pt(self):
        state = load_file(self.dir / "vae" / "diffusion_pytorch_model.safetensors")
        save_file(state, self.dir / "vae.safetensors")
        renames = {"to_q.": "query.", "to_k.": "key.", "to_v.": "value.", "to_out.0.": "proj_attn."}
        old = {}
        for name, tensor in state.items():
            for new, previous in renames.items():
                name = name.replace(".attentions.0." + new, ".attentions.0." + previous)
            old[name] = tensor
        self.assertIn("encoder.mid_block.attentions.0.proj_attn.weight", old)
        save_file(old, self.dir / "old.safetensors")
        torch.save(state, self.dir / "vae.pt")
        for path in ("vae.safetensors", "old.safetensors", "vae.pt"):
            self.compare(torch.float32, 1e-5, path, LUA_OPTIONS)

    def test_sliced_decoding_gives_the_same_images(self):
        self.script("sliced.lua", f"""
            local z = torch.load("inputs.safetensors").z
            local whole = nn.AutoencoderKL.load("vae")
            local options = {LUA_OPTIONS}
            options.decode_batch = 1
            local sliced = nn.AutoencoderKL.load("vae.safetensors", options)
            torch.no_grad(function()
              local a, b = whole:decode(z), sliced:decode(z)
              -- Convolutions of one image and of a batch sum in other orders: equal to float rounding.
              local worst = (a - b):abs():max():item()
              assert(worst <= 1e-5 * a:abs():max():item(), "decode_batch = 1 differs by " .. worst)
            end)
            print("same")
        """)
        save_file(load_file(self.dir / "vae" / "diffusion_pytorch_model.safetensors"), self.dir / "vae.safetensors")
        self.assertIn("same", self.runner("sliced.lua", check=0).stdout)

    def test_errors_name_the_file(self):
        config = json.loads((self.dir / "vae" / "config.json").read_text())
        config["down_block_types"][1] = "AttnDownEncoderBlock2D"
        (self.dir / "vae" / "config.json").write_text(json.dumps(config))
        result = self.runner("vae.lua", "--", "vae", check=1)
        self.assertIn('vae/config.json: down_block_types lists "AttnDownEncoderBlock2D"; runner\'s AutoencoderKL has '
                      'DownEncoderBlock2D only', result.stderr)
        result = self.runner("vae.lua", "--", "missing", check=1)
        self.assertIn("vae.lua:2: missing: no such file or folder", result.stderr)
        state = load_file(self.dir / "vae" / "diffusion_pytorch_model.safetensors")
        del state["decoder.conv_out.bias"]
        save_file(state, self.dir / "partial.safetensors")
        result = self.runner("vae.lua", "--", "partial.safetensors", LUA_OPTIONS, check=1)
        self.assertIn("partial.safetensors: the weights do not fit AutoencoderKL(block_out_channels={16,32,32}, "
                      "layers_per_block=1, latent_channels=4): missing keys: decoder.conv_out.bias", result.stderr)
        result = self.runner("vae.lua", "--", "vae.safetensors_missing", check=1)
        self.assertIn("no such file or folder", result.stderr)
