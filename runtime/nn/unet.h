// The DDPM UNet of Ho et al. (2020): residual blocks with timestep embedding, self-attention at chosen
// resolutions, optional class conditioning. Parameter names and layout: docs/models-and-diffusion.md.
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/nn/denoiser.h"

namespace runner::nn {

struct UNetOptions {
  std::int64_t in_channels = 3;
  std::optional<std::int64_t> out_channels;  // default: in_channels, twice that with learn_sigma
  bool learn_sigma = false;
  std::int64_t channels = 128;
  std::vector<std::int64_t> mults{1, 2, 2, 2};
  std::int64_t blocks = 2;                  // residual blocks per level on the way down (one more on the way up)
  std::vector<std::int64_t> attention{16};  // resolutions with self-attention
  double dropout = 0.1;
  std::int64_t image = 32;
  std::int64_t classes = 0;  // 0: unconditional; else a label embedding with a null row at id `classes`
  double class_dropout = 0.1;
  std::int64_t groups = 32;
  bool checkpoint = false;
};

class ResnetBlockImpl : public torch::nn::Module {
 public:
  ResnetBlockImpl(std::int64_t in, std::int64_t out, std::int64_t temb_channels, double dropout, std::int64_t groups);
  // temb_activated = silu(timestep embedding), shared by every block.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb_activated);

  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, nin_shortcut{nullptr};
  torch::nn::Linear temb_proj{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(ResnetBlock);

class AttnBlockImpl : public torch::nn::Module {
 public:
  AttnBlockImpl(std::int64_t channels, std::int64_t groups);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d q{nullptr}, k{nullptr}, v{nullptr}, proj_out{nullptr};
};
TORCH_MODULE(AttnBlock);

class UNetImpl : public Denoiser {
 public:
  explicit UNetImpl(UNetOptions options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) override;

  std::int64_t in_channels() const override { return options_.in_channels; }
  std::int64_t out_channels() const override { return out_channels_; }
  std::int64_t image_size() const override { return options_.image; }
  std::int64_t classes() const override { return options_.classes; }
  double class_dropout() const override { return options_.classes > 0 ? options_.class_dropout : 0.0; }
  bool pixel_space() const override { return true; }
  std::vector<std::string> parameter_groups() const override;  // "down.0", ..., "up.0", ... (the levels)
  const UNetOptions& options() const { return options_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  struct Level {
    std::vector<ResnetBlock> blocks;
    std::vector<AttnBlock> attention;     // empty, or one per block
    torch::nn::Conv2d resample{nullptr};  // downsample (down path) or upsample (up path) convolution
  };
  at::Tensor run_block(ResnetBlock& block, const at::Tensor& x, const at::Tensor& temb_activated);
  at::Tensor run_attention(AttnBlock& block, const at::Tensor& x);

  UNetOptions options_;
  std::int64_t out_channels_;
  torch::nn::ModuleList temb_dense{nullptr};
  torch::nn::Embedding label_emb{nullptr};
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::GroupNorm norm_out{nullptr};
  std::vector<Level> down_, up_;
  ResnetBlock mid_block_1{nullptr}, mid_block_2{nullptr};
  AttnBlock mid_attn_1{nullptr};
};
TORCH_MODULE(UNet);

}  // namespace runner::nn
