// DiT, the diffusion transformer of Peebles & Xie (2023): patchify, adaLN-Zero blocks, optional learned
// sigma, sizes S / B / L / XL with patch 2 / 4 / 8. Parameter names: docs/models-and-diffusion.md.
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/nn/denoiser.h"
#include "runtime/nn/linear.h"

namespace runner::nn {

struct DiTOptions {
  std::int64_t depth = 28;
  std::int64_t hidden = 1152;
  std::int64_t heads = 16;
  std::int64_t patch = 2;
  std::int64_t image = 32;  // input side (latent side for latent diffusion)
  std::int64_t in_channels = 4;
  std::int64_t classes = 1000;  // 0: unconditional (no label embedder)
  double class_dropout = 0.1;   // > 0 adds the null label (id `classes`) for classifier-free guidance
  double mlp_ratio = 4.0;
  bool learn_sigma = true;
  bool checkpoint = false;
  // The fused DiT block: LayerNorm with the adaLN modulation and the gated residuals as runner's ops
  // (runtime/kernels: one CUDA kernel each way instead of chains of elementwise ops), and every block's adaLN
  // projection in one GEMM. The same parameters; on the CPU the ops are the ATen ops. Off until a GPU run has
  // checked the kernels.
  bool fused = false;
};

// "DiT-XL/2" -> depth 28, hidden 1152, heads 16, patch 2 (other fields default). Throws on unknown names.
DiTOptions dit_preset(const std::string& name);
// The known preset names, "DiT-S/2" ... "DiT-XL/8".
std::vector<std::string> dit_preset_names();

class DiTBlockImpl : public torch::nn::Module {
 public:
  DiTBlockImpl(std::int64_t hidden, std::int64_t heads, double mlp_ratio, bool fused = false);
  // x [B, N, hidden], conditioning_activated = silu(c) [B, hidden].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& conditioning_activated);
  // x [B, N, hidden] with this block's adaLN projection of silu(c) given, [B, 6 hidden].
  at::Tensor forward_modulated(const at::Tensor& x, const at::Tensor& modulation_out);

  Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};  // may run in FP8 (linear.h)
  torch::nn::Linear modulation{nullptr};

 private:
  std::int64_t hidden_, heads_;
  bool fused_;
};
TORCH_MODULE(DiTBlock);

class DiTImpl : public Denoiser {
 public:
  explicit DiTImpl(DiTOptions options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) override;

  std::int64_t in_channels() const override { return options_.in_channels; }
  std::int64_t out_channels() const override { return out_channels_; }
  std::int64_t image_size() const override { return options_.image; }
  std::int64_t classes() const override { return options_.classes; }
  double class_dropout() const override { return options_.classes > 0 ? options_.class_dropout : 0.0; }
  bool pixel_space() const override { return false; }
  std::vector<std::string> parameter_groups() const override;  // "blocks.0", ... (each block with its adaLN)
  const DiTOptions& options() const { return options_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  at::Tensor unpatchify(const at::Tensor& tokens) const;
  // Each block's adaLN projection of silu(c), then the final layer's: one GEMM when fused.
  std::vector<at::Tensor> adaln_modulations(const at::Tensor& c_activated) const;

  DiTOptions options_;
  std::int64_t out_channels_, grid_;
  torch::nn::Conv2d patch_proj{nullptr};
  torch::nn::Linear t_linear1{nullptr}, t_linear2{nullptr};
  torch::nn::Embedding label_table{nullptr};
  at::Tensor pos_embed;
  std::vector<DiTBlock> blocks_;
  torch::nn::Linear final_linear{nullptr}, final_modulation{nullptr};
};
TORCH_MODULE(DiT);

}  // namespace runner::nn
