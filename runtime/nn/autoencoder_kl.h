// The KL autoencoder of latent diffusion (Rombach et al. 2022) with the architecture and parameter names of
// diffusers' AutoencoderKL (the Stable Diffusion VAE family): encode to a diagonal Gaussian, decode latents.
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace runner::nn {

// The fields of diffusers' AutoencoderKL config that shape the network (config.json uses the same names).
struct AutoencoderKLOptions {
  std::int64_t in_channels = 3;
  std::int64_t out_channels = 3;
  std::int64_t latent_channels = 4;
  std::vector<std::int64_t> block_out_channels{128, 256, 512, 512};  // one level each; all but the last halve
  std::int64_t layers_per_block = 2;
  std::int64_t norm_num_groups = 32;
  double scaling_factor = 0.18215;
  std::optional<double> shift_factor;
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  std::int64_t decode_batch = 0;  // decode at most this many latents at a time (memory); 0: all at once
};

class VaeResnetBlockImpl : public torch::nn::Module {
 public:
  VaeResnetBlockImpl(std::int64_t in, std::int64_t out, std::int64_t groups);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};
};
TORCH_MODULE(VaeResnetBlock);

// Single-head self-attention over the pixels with a residual connection (diffusers' Attention as the VAE uses it).
class VaeAttentionImpl : public torch::nn::Module {
 public:
  VaeAttentionImpl(std::int64_t channels, std::int64_t groups);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::GroupNorm group_norm{nullptr};
  torch::nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  torch::nn::ModuleList to_out{nullptr};  // [Linear]
};
TORCH_MODULE(VaeAttention);

// resnets[0], then (attention, resnet) pairs: attentions[0], resnets[1].
class VaeMidBlockImpl : public torch::nn::Module {
 public:
  VaeMidBlockImpl(std::int64_t channels, std::int64_t groups, bool attention);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr};
};
TORCH_MODULE(VaeMidBlock);

// A convolution that halves (pad right and bottom by one, 3x3 stride 2) or doubles (nearest, then 3x3) the side.
class VaeResampleImpl : public torch::nn::Module {
 public:
  VaeResampleImpl(std::int64_t channels, bool down);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv{nullptr};

 private:
  bool down_;
};
TORCH_MODULE(VaeResample);

// DownEncoderBlock2D / UpDecoderBlock2D: resnets, then downsamplers[0] / upsamplers[0] except on the last level.
class VaeLevelImpl : public torch::nn::Module {
 public:
  VaeLevelImpl(std::int64_t in, std::int64_t out, std::int64_t layers, std::int64_t groups, bool down, bool resample);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList resnets{nullptr}, resamplers{nullptr};
};
TORCH_MODULE(VaeLevel);

class VaeEncoderImpl : public torch::nn::Module {
 public:
  explicit VaeEncoderImpl(const AutoencoderKLOptions& o);
  at::Tensor forward(const at::Tensor& x);  // the moments: mean and log-variance stacked on the channel axis
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  VaeMidBlock mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
};
TORCH_MODULE(VaeEncoder);

class VaeDecoderImpl : public torch::nn::Module {
 public:
  explicit VaeDecoderImpl(const AutoencoderKLOptions& o);
  at::Tensor forward(const at::Tensor& z);
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  VaeMidBlock mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
};
TORCH_MODULE(VaeDecoder);

class AutoencoderKLImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLImpl(AutoencoderKLOptions options);
  // images [N, in_channels, H, W] in [-1, 1] -> (mean, logvar) [N, latent_channels, H/f, W/f], logvar clamped
  // to [-30, 20] as diffusers' DiagonalGaussianDistribution does. H and W must be multiples of f.
  std::pair<at::Tensor, at::Tensor> encode(const at::Tensor& images);
  // latents (unscaled) [N, latent_channels, h, w] -> images [N, out_channels, h*f, w*f]
  at::Tensor decode(const at::Tensor& latents);
  std::int64_t downsample() const;  // f = 2^(levels - 1)
  const AutoencoderKLOptions& options() const { return options_; }
  void pretty_print(std::ostream& stream) const override;

  VaeEncoder encoder{nullptr};
  VaeDecoder decoder{nullptr};
  torch::nn::Conv2d quant_conv{nullptr}, post_quant_conv{nullptr};

 private:
  AutoencoderKLOptions options_;
};
TORCH_MODULE(AutoencoderKL);

// Checks the options; throws std::invalid_argument naming the field.
void check_autoencoder_kl_options(const AutoencoderKLOptions& options);

// Reads a diffusers config.json into options (unknown architecture values are refused, naming the path).
AutoencoderKLOptions read_autoencoder_kl_config(const std::string& config_path, AutoencoderKLOptions options = {});

// A diffusers folder (config.json + diffusion_pytorch_model.safetensors) or one weights file (safetensors or
// a torch.save state dict) with
// diffusers' parameter names (older checkpoints' query/key/value/proj_attn names included). `options` are
// the architecture for a single file; a folder's config.json overrides them.
struct LoadedAutoencoder {
  AutoencoderKL model{nullptr};
  std::string weights_path;
};
LoadedAutoencoder load_autoencoder_kl(const std::string& path, const AutoencoderKLOptions& options = {});

}  // namespace runner::nn
