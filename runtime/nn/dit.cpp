// DiT: presets, construction with the official initialisation, and the forward pass.
#include "runtime/nn/dit.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cmath>
#include <stdexcept>

#include "runtime/kernels/ops.h"
#include "runtime/nn/activation_checkpoint.h"
#include "runtime/nn/embeddings.h"
#include "runtime/nn/initialization.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/weight_casts.h"

namespace runner::nn {
namespace {

constexpr double kNormEps = 1e-6;
constexpr std::int64_t kFrequencyWidth = 256;

struct Size {
  const char* name;
  std::int64_t depth, hidden, heads;
};
constexpr Size kSizes[] = {{"S", 12, 384, 6}, {"B", 12, 768, 12}, {"L", 24, 1024, 16}, {"XL", 28, 1152, 16}};
constexpr std::int64_t kPatches[] = {2, 4, 8};

// LayerNorm (no affine) then the adaLN modulation: one runner op when fused, else the official DiT's ATen ops.
at::Tensor normalize_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, bool fused) {
  return fused ? ops::layer_norm_modulate(x, shift, scale, kNormEps)
               : ops::layer_norm_modulate_unfused(x, shift, scale, kNormEps);
}

// The adaLN-Zero gated residual x + gate * y.
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, bool fused) {
  return fused ? ops::gated_residual(x, gate, y) : ops::gated_residual_unfused(x, gate, y);
}

void check_options(const DiTOptions& o) {
  auto fail = [](const std::string& message) { throw std::invalid_argument("DiT: " + message); };
  if (o.depth < 1) fail(fmt::format("depth must be at least 1, got {}", o.depth));
  if (o.heads < 1 || o.hidden < 1 || o.hidden % o.heads != 0) {
    fail(fmt::format("hidden ({}) must be a positive multiple of heads ({})", o.hidden, o.heads));
  }
  if (o.hidden % 4 != 0)
    fail(fmt::format("hidden must be a multiple of 4 for the 2-D position embedding, got {}", o.hidden));
  if (o.patch < 1 || o.image < 1 || o.image % o.patch != 0) {
    fail(fmt::format("image size {} must be a positive multiple of the patch size {}", o.image, o.patch));
  }
  if (o.in_channels < 1) fail(fmt::format("in_channels must be at least 1, got {}", o.in_channels));
  if (o.classes < 0) fail(fmt::format("classes must be 0 (unconditional) or more, got {}", o.classes));
  if (o.class_dropout < 0 || o.class_dropout >= 1)
    fail(fmt::format("class_dropout must be in [0, 1), got {}", o.class_dropout));
  if (o.mlp_ratio <= 0) fail(fmt::format("mlp_ratio must be positive, got {}", o.mlp_ratio));
}

template <typename Holder = torch::nn::Linear>
Holder xavier_linear(std::int64_t in, std::int64_t out) {
  Holder linear(in, out);
  xavier_uniform_with_zero_bias(linear->weight, linear->bias);
  return linear;
}

torch::nn::Linear zero_linear(std::int64_t in, std::int64_t out) {
  torch::nn::Linear linear(in, out);
  zero_(linear->weight, linear->bias);
  return linear;
}

}  // namespace

std::vector<std::string> dit_preset_names() {
  std::vector<std::string> names;
  for (const auto& size : kSizes) {
    for (auto patch : kPatches) names.push_back(fmt::format("DiT-{}/{}", size.name, patch));
  }
  return names;
}

DiTOptions dit_preset(const std::string& name) {
  for (const auto& size : kSizes) {
    for (auto patch : kPatches) {
      if (name == fmt::format("DiT-{}/{}", size.name, patch)) {
        DiTOptions options;
        options.depth = size.depth;
        options.hidden = size.hidden;
        options.heads = size.heads;
        options.patch = patch;
        return options;
      }
    }
  }
  throw std::invalid_argument(
      fmt::format("unknown DiT size '{}' (known: {})", name, fmt::join(dit_preset_names(), ", ")));
}

DiTBlockImpl::DiTBlockImpl(std::int64_t hidden, std::int64_t heads, double mlp_ratio, bool fused)
    : hidden_(hidden), heads_(heads), fused_(fused) {
  auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", xavier_linear<Linear>(hidden, 3 * hidden));
  proj = attn->register_module("proj", xavier_linear<Linear>(hidden, hidden));
  const auto mlp_hidden = static_cast<std::int64_t>(static_cast<double>(hidden) * mlp_ratio);
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", xavier_linear<Linear>(hidden, mlp_hidden));
  fc2 = mlp->register_module("fc2", xavier_linear<Linear>(mlp_hidden, hidden));
  modulation = zero_linear(hidden, 6 * hidden);
  register_module("adaLN_modulation", torch::nn::Sequential(torch::nn::SiLU(), modulation));
}

at::Tensor DiTBlockImpl::forward(const at::Tensor& x, const at::Tensor& conditioning_activated) {
  return forward_modulated(x, linear_forward(*modulation, conditioning_activated));
}

at::Tensor DiTBlockImpl::forward_modulated(const at::Tensor& x, const at::Tensor& modulation_out) {
  const auto m = modulation_out.chunk(6, 1);
  const auto batch = x.size(0), tokens = x.size(1);
  const auto head_width = hidden_ / heads_;
  // [B, N, 3 hidden] -> 3 x [B, heads, N, head_width]; unbind (as timm's Attention) has one stack as its backward,
  // where indexing each of the three would zero-fill and copy a whole qkv-sized gradient per head.
  const auto qkv_heads = linear_forward(*qkv, normalize_modulate(x, m[0], m[1], fused_))
                             .reshape({batch, tokens, 3, heads_, head_width})
                             .permute({2, 0, 3, 1, 4})
                             .unbind(0);
  const auto attended = at::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2]);
  const auto out = gated_residual(
      x, m[2], linear_forward(*proj, attended.transpose(1, 2).reshape({batch, tokens, hidden_})), fused_);
  const auto mlp =
      linear_forward(*fc2, at::gelu(linear_forward(*fc1, normalize_modulate(out, m[3], m[4], fused_)), "tanh"));
  return gated_residual(out, m[5], mlp, fused_);
}

DiTImpl::DiTImpl(DiTOptions options) : Denoiser("DiT"), options_(std::move(options)) {
  check_options(options_);
  const auto& o = options_;
  set_checkpointing(o.checkpoint);
  out_channels_ = o.learn_sigma ? 2 * o.in_channels : o.in_channels;
  grid_ = o.image / o.patch;

  auto x_embedder = register_module("x_embedder", std::make_shared<torch::nn::Module>());
  patch_proj = x_embedder->register_module(
      "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(o.in_channels, o.hidden, o.patch).stride(o.patch)));
  {
    // Xavier-uniform on the [hidden, in * patch * patch] view, as the official code initialises it.
    at::NoGradGuard no_grad;
    const double bound = std::sqrt(6.0 / static_cast<double>(o.in_channels * o.patch * o.patch + o.hidden));
    patch_proj->weight.uniform_(-bound, bound);
    patch_proj->bias.zero_();
  }

  auto t_embedder = register_module("t_embedder", std::make_shared<torch::nn::Module>());
  t_linear1 = xavier_linear(kFrequencyWidth, o.hidden);
  t_linear2 = xavier_linear(o.hidden, o.hidden);
  normal_(t_linear1->weight, 0.02);
  normal_(t_linear2->weight, 0.02);
  t_embedder->register_module("mlp", torch::nn::Sequential(t_linear1, torch::nn::SiLU(), t_linear2));

  if (o.classes > 0) {
    auto y_embedder = register_module("y_embedder", std::make_shared<torch::nn::Module>());
    label_table = y_embedder->register_module(
        "embedding_table", torch::nn::Embedding(o.classes + (o.class_dropout > 0 ? 1 : 0), o.hidden));
    normal_(label_table->weight, 0.02);
  }

  pos_embed = register_parameter("pos_embed", sincos_position_embedding_2d(o.hidden, grid_).unsqueeze(0), false);

  auto blocks = register_module("blocks", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < o.depth; ++i) {
    blocks_.emplace_back(o.hidden, o.heads, o.mlp_ratio, o.fused);
    blocks->push_back(blocks_.back());
  }

  auto final_layer = register_module("final_layer", std::make_shared<torch::nn::Module>());
  final_linear = final_layer->register_module("linear", zero_linear(o.hidden, o.patch * o.patch * out_channels_));
  final_modulation = zero_linear(o.hidden, 2 * o.hidden);
  final_layer->register_module("adaLN_modulation", torch::nn::Sequential(torch::nn::SiLU(), final_modulation));
}

at::Tensor DiTImpl::unpatchify(const at::Tensor& tokens) const {
  const auto batch = tokens.size(0);
  const auto p = options_.patch, c = out_channels_;
  return tokens.reshape({batch, grid_, grid_, p, p, c})
      .permute({0, 5, 1, 3, 2, 4})
      .reshape({batch, c, grid_ * p, grid_ * p});
}

at::Tensor DiTImpl::forward(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) {
  check_inputs(x, t, labels);
  auto tokens = patch_proj(x).flatten(2).transpose(1, 2) + pos_embed;
  auto c = linear_forward(
      *t_linear2, at::silu(linear_forward(*t_linear1, dit_timestep_embedding(t, kFrequencyWidth).to(x.dtype()))));
  if (label_table) c = c + label_table(*labels);
  const auto c_activated = at::silu(c);
  // With group hooks (sharded weights) each block's adaLN projection runs inside its block's bracket.
  const bool grouped = has_parameter_group_hooks();
  const auto modulations = grouped ? std::vector<at::Tensor>() : adaln_modulations(c_activated);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    auto& block = blocks_[i];
    before_group("blocks", i);
    const at::Tensor modulation = grouped ? linear_forward(*block->modulation, c_activated) : modulations[i];
    if (checkpointing()) {
      tokens = checkpointed(
          [block](const TensorList& in) mutable { return TensorList{block->forward_modulated(in[0], in[1])}; },
          {tokens, modulation})[0];
    } else {
      tokens = block->forward_modulated(tokens, modulation);
    }
    after_group("blocks", i, {tokens});
  }
  const auto m = (grouped ? linear_forward(*final_modulation, c_activated) : modulations.back()).chunk(2, 1);
  return unpatchify(linear_forward(*final_linear, normalize_modulate(tokens, m[0], m[1], options_.fused)));
}

std::vector<std::string> DiTImpl::parameter_groups() const {
  std::vector<std::string> groups;
  for (std::size_t i = 0; i < blocks_.size(); ++i) groups.push_back(fmt::format("blocks.{}", i));
  return groups;
}

std::vector<at::Tensor> DiTImpl::adaln_modulations(const at::Tensor& c_activated) const {
  std::vector<at::Tensor> modulations;
  if (!options_.fused) {
    for (const auto& block : blocks_) modulations.push_back(linear_forward(*block->modulation, c_activated));
    modulations.push_back(linear_forward(*final_modulation, c_activated));
    return modulations;
  }
  // Every block takes the same SiLU(c): one GEMM over the concatenated weights, split per block. The parameters
  // keep their own names and shapes; the concatenation is a copy per step, cheaper than the GEMMs it merges.
  std::vector<at::Tensor> weights, biases;
  std::vector<std::int64_t> widths;
  for (const auto& block : blocks_) {
    weights.push_back(weight_for_matmul(block->modulation->weight));
    biases.push_back(weight_for_matmul(block->modulation->bias));
    widths.push_back(block->modulation->weight.size(0));
  }
  weights.push_back(weight_for_matmul(final_modulation->weight));
  biases.push_back(weight_for_matmul(final_modulation->bias));
  widths.push_back(final_modulation->weight.size(0));
  return at::linear(c_activated, at::cat(weights), at::cat(biases)).split_with_sizes(widths, 1);
}

void DiTImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options_;
  stream << fmt::format("DiT(depth={}, hidden={}, heads={}, patch={}, image={}, in={}, out={}, classes={}", o.depth,
                        o.hidden, o.heads, o.patch, o.image, o.in_channels, out_channels_, o.classes);
  if (o.classes > 0) stream << fmt::format(", class_dropout={}", o.class_dropout);
  if (checkpointing()) stream << ", checkpoint=true";
  if (o.fused) stream << ", fused=true";
  stream << ")";
}

}  // namespace runner::nn
