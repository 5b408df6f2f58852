// DiT: presets, construction with the official initialisation, and the forward pass.
#include "runtime/nn/dit.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/activation.h>

#include <cmath>
#include <stdexcept>

#include "runtime/kernels/ops.h"
#include "runtime/nn/activation_checkpoint.h"
#include "runtime/nn/embeddings.h"
#include "runtime/nn/initialization.h"
#include "runtime/nn/linear.h"

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

at::Tensor layer_norm(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, kNormEps); }

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, bool fused) {
  return fused ? ops::modulate(x, shift, scale) : x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
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

torch::nn::Linear xavier_linear(std::int64_t in, std::int64_t out) {
  torch::nn::Linear linear(in, out);
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
  qkv = attn->register_module("qkv", xavier_linear(hidden, 3 * hidden));
  proj = attn->register_module("proj", xavier_linear(hidden, hidden));
  const auto mlp_hidden = static_cast<std::int64_t>(static_cast<double>(hidden) * mlp_ratio);
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", xavier_linear(hidden, mlp_hidden));
  fc2 = mlp->register_module("fc2", xavier_linear(mlp_hidden, hidden));
  modulation = zero_linear(hidden, 6 * hidden);
  register_module("adaLN_modulation", torch::nn::Sequential(torch::nn::SiLU(), modulation));
}

at::Tensor DiTBlockImpl::forward(const at::Tensor& x, const at::Tensor& conditioning_activated) {
  const auto m = linear_forward(*modulation, conditioning_activated).chunk(6, 1);
  const auto batch = x.size(0), tokens = x.size(1);
  const auto head_width = hidden_ / heads_;
  // [B, N, 3 hidden] -> 3 x [B, heads, N, head_width]; unbind (as timm's Attention) has one stack as its backward,
  // where indexing each of the three would zero-fill and copy a whole qkv-sized gradient per head.
  const auto qkv_heads = linear_forward(*qkv, modulate(layer_norm(x), m[0], m[1], fused_))
                             .reshape({batch, tokens, 3, heads_, head_width})
                             .permute({2, 0, 3, 1, 4})
                             .unbind(0);
  const auto attended = at::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2]);
  auto out = x + m[2].unsqueeze(1) * linear_forward(*proj, attended.transpose(1, 2).reshape({batch, tokens, hidden_}));
  const auto mlp =
      linear_forward(*fc2, at::gelu(linear_forward(*fc1, modulate(layer_norm(out), m[3], m[4], fused_)), "tanh"));
  return out + m[5].unsqueeze(1) * mlp;
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
  for (auto& block : blocks_) {
    if (checkpointing()) {
      tokens = checkpointed([block](const TensorList& in) mutable { return TensorList{block->forward(in[0], in[1])}; },
                            {tokens, c_activated})[0];
    } else {
      tokens = block->forward(tokens, c_activated);
    }
  }
  const auto m = linear_forward(*final_modulation, c_activated).chunk(2, 1);
  return unpatchify(linear_forward(*final_linear, modulate(layer_norm(tokens), m[0], m[1], options_.fused)));
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
