// The DDPM UNet: construction with the paper's initialisation, and the forward pass.
#include "runtime/nn/unet.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <stdexcept>

#include "runtime/nn/activation_checkpoint.h"
#include "runtime/nn/embeddings.h"
#include "runtime/nn/initialization.h"
#include "runtime/nn/linear.h"

namespace runner::nn {
namespace {

constexpr double kNormEps = 1e-6;

torch::nn::GroupNorm group_norm(std::int64_t groups, std::int64_t channels) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(kNormEps));
}

torch::nn::Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride = 1) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(stride == 1 ? kernel / 2 : 0));
}

void check_options(const UNetOptions& o) {
  auto fail = [](const std::string& message) { throw std::invalid_argument("UNet: " + message); };
  if (o.in_channels < 1) fail(fmt::format("in_channels must be at least 1, got {}", o.in_channels));
  if (o.channels < 1) fail(fmt::format("channels must be at least 1, got {}", o.channels));
  if (o.mults.empty()) fail("mults must list at least one channel multiplier");
  for (auto m : o.mults)
    if (m < 1) fail(fmt::format("channel multipliers must be at least 1, got {}", m));
  if (o.blocks < 1) fail(fmt::format("blocks must be at least 1, got {}", o.blocks));
  if (o.dropout < 0 || o.dropout >= 1) fail(fmt::format("dropout must be in [0, 1), got {}", o.dropout));
  if (o.class_dropout < 0 || o.class_dropout >= 1)
    fail(fmt::format("class_dropout must be in [0, 1), got {}", o.class_dropout));
  if (o.classes < 0) fail(fmt::format("classes must be 0 (unconditional) or more, got {}", o.classes));
  if (o.out_channels && *o.out_channels < 1)
    fail(fmt::format("out_channels must be at least 1, got {}", *o.out_channels));
  if (o.groups < 1) fail(fmt::format("groups must be at least 1, got {}", o.groups));
  const auto levels = static_cast<std::int64_t>(o.mults.size());
  const std::int64_t factor = std::int64_t{1} << (levels - 1);
  if (o.image < 1 || o.image % factor != 0) {
    fail(fmt::format("image size {} must be divisible by {} ({} levels halve it {} times)", o.image, factor, levels,
                     levels - 1));
  }
  std::vector<std::int64_t> resolutions;
  for (std::int64_t i = 0; i < levels; ++i) resolutions.push_back(o.image >> i);
  for (auto r : o.attention) {
    if (std::find(resolutions.begin(), resolutions.end(), r) == resolutions.end()) {
      fail(fmt::format("attention resolution {} is not one of the UNet's resolutions {}", r,
                       fmt::join(resolutions, ", ")));
    }
  }
  for (auto m : o.mults) {
    if ((o.channels * m) % o.groups != 0) {
      fail(fmt::format("width {} (channels {} x mult {}) is not divisible by groups {}", o.channels * m, o.channels, m,
                       o.groups));
    }
  }
  if (o.channels % o.groups != 0) fail(fmt::format("channels {} is not divisible by groups {}", o.channels, o.groups));
}

}  // namespace

ResnetBlockImpl::ResnetBlockImpl(std::int64_t in, std::int64_t out, std::int64_t temb_channels, double dropout,
                                 std::int64_t groups)
    : dropout_(dropout) {
  norm1 = register_module("norm1", group_norm(groups, in));
  conv1 = register_module("conv1", conv(in, out, 3));
  temb_proj = register_module("temb_proj", torch::nn::Linear(temb_channels, out));
  norm2 = register_module("norm2", group_norm(groups, out));
  conv2 = register_module("conv2", conv(out, out, 3));
  if (in != out) nin_shortcut = register_module("nin_shortcut", conv(in, out, 1));
  xavier_uniform_with_zero_bias(conv1->weight, conv1->bias);
  xavier_uniform_with_zero_bias(temb_proj->weight, temb_proj->bias);
  zero_(conv2->weight, conv2->bias);
  if (nin_shortcut) xavier_uniform_with_zero_bias(nin_shortcut->weight, nin_shortcut->bias);
}

at::Tensor ResnetBlockImpl::forward(const at::Tensor& x, const at::Tensor& temb_activated) {
  auto h = conv1(at::silu(norm1(x)));
  h = h + linear_forward(*temb_proj, temb_activated).unsqueeze(-1).unsqueeze(-1);
  h = at::silu(norm2(h));
  if (dropout_ > 0) h = at::dropout(h, dropout_, is_training());
  h = conv2(h);
  return (nin_shortcut ? nin_shortcut(x) : x) + h;
}

AttnBlockImpl::AttnBlockImpl(std::int64_t channels, std::int64_t groups) {
  norm = register_module("norm", group_norm(groups, channels));
  q = register_module("q", conv(channels, channels, 1));
  k = register_module("k", conv(channels, channels, 1));
  v = register_module("v", conv(channels, channels, 1));
  proj_out = register_module("proj_out", conv(channels, channels, 1));
  for (auto* c : {&q, &k, &v}) xavier_uniform_with_zero_bias((*c)->weight, (*c)->bias);
  zero_(proj_out->weight, proj_out->bias);
}

at::Tensor AttnBlockImpl::forward(const at::Tensor& x) {
  const auto batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  const auto h = norm(x);
  // [B, C, H, W] -> [B, 1 head, H*W, C]
  auto tokens = [&](const at::Tensor& t) {
    return t.reshape({batch, channels, height * width}).transpose(1, 2).unsqueeze(1);
  };
  const auto attended = at::scaled_dot_product_attention(tokens(q(h)), tokens(k(h)), tokens(v(h)));
  const auto image = attended.squeeze(1).transpose(1, 2).reshape({batch, channels, height, width});
  return x + proj_out(image);
}

UNetImpl::UNetImpl(UNetOptions options) : Denoiser("UNet"), options_(std::move(options)) {
  check_options(options_);
  const auto& o = options_;
  out_channels_ = o.out_channels.value_or(o.learn_sigma ? 2 * o.in_channels : o.in_channels);
  set_checkpointing(o.checkpoint);
  const std::int64_t temb_channels = 4 * o.channels;
  const auto levels = static_cast<std::int64_t>(o.mults.size());
  auto has_attention = [&](std::int64_t resolution) {
    return std::find(o.attention.begin(), o.attention.end(), resolution) != o.attention.end();
  };

  auto temb = register_module("temb", std::make_shared<torch::nn::Module>());
  temb_dense = temb->register_module("dense", torch::nn::ModuleList(torch::nn::Linear(o.channels, temb_channels),
                                                                    torch::nn::Linear(temb_channels, temb_channels)));
  for (const auto& dense : *temb_dense) {
    auto* linear = dense->as<torch::nn::Linear>();
    xavier_uniform_with_zero_bias(linear->weight, linear->bias);
  }
  if (o.classes > 0) {
    label_emb = register_module("label_emb", torch::nn::Embedding(o.classes + 1, temb_channels));
    normal_(label_emb->weight, 0.02);
  }
  conv_in = register_module("conv_in", conv(o.in_channels, o.channels, 3));
  xavier_uniform_with_zero_bias(conv_in->weight, conv_in->bias);

  // Widths of the feature maps pushed on the skip stack, in order.
  std::vector<std::int64_t> skip_widths{o.channels};
  std::int64_t width = o.channels;
  auto down = register_module("down", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < levels; ++i) {
    const std::int64_t resolution = o.image >> i;
    const std::int64_t level_width = o.channels * o.mults[static_cast<std::size_t>(i)];
    auto level_module = std::make_shared<torch::nn::Module>();
    auto block_list = level_module->register_module("block", torch::nn::ModuleList());
    auto attn_list = level_module->register_module("attn", torch::nn::ModuleList());
    Level level;
    for (std::int64_t j = 0; j < o.blocks; ++j) {
      level.blocks.emplace_back(width, level_width, temb_channels, o.dropout, o.groups);
      block_list->push_back(level.blocks.back());
      width = level_width;
      if (has_attention(resolution)) {
        level.attention.emplace_back(width, o.groups);
        attn_list->push_back(level.attention.back());
      }
      skip_widths.push_back(width);
    }
    if (i != levels - 1) {
      auto downsample = level_module->register_module("downsample", std::make_shared<torch::nn::Module>());
      level.resample = downsample->register_module("conv", conv(width, width, 3, 2));
      xavier_uniform_with_zero_bias(level.resample->weight, level.resample->bias);
      skip_widths.push_back(width);
    }
    down->push_back(level_module);
    down_.push_back(std::move(level));
  }

  auto mid = register_module("mid", std::make_shared<torch::nn::Module>());
  mid_block_1 = mid->register_module("block_1", ResnetBlock(width, width, temb_channels, o.dropout, o.groups));
  mid_attn_1 = mid->register_module("attn_1", AttnBlock(width, o.groups));
  mid_block_2 = mid->register_module("block_2", ResnetBlock(width, width, temb_channels, o.dropout, o.groups));

  // The up path is built from the deepest level, but its modules are listed by level (up.0 is the finest).
  std::vector<std::shared_ptr<torch::nn::Module>> up_modules(static_cast<std::size_t>(levels));
  up_.resize(static_cast<std::size_t>(levels));
  for (std::int64_t i = levels - 1; i >= 0; --i) {
    const std::int64_t resolution = o.image >> i;
    const std::int64_t level_width = o.channels * o.mults[static_cast<std::size_t>(i)];
    auto level_module = std::make_shared<torch::nn::Module>();
    auto block_list = level_module->register_module("block", torch::nn::ModuleList());
    auto attn_list = level_module->register_module("attn", torch::nn::ModuleList());
    Level& level = up_[static_cast<std::size_t>(i)];
    for (std::int64_t j = 0; j <= o.blocks; ++j) {
      const std::int64_t skip = skip_widths.back();
      skip_widths.pop_back();
      level.blocks.emplace_back(width + skip, level_width, temb_channels, o.dropout, o.groups);
      block_list->push_back(level.blocks.back());
      width = level_width;
      if (has_attention(resolution)) {
        level.attention.emplace_back(width, o.groups);
        attn_list->push_back(level.attention.back());
      }
    }
    if (i != 0) {
      auto upsample = level_module->register_module("upsample", std::make_shared<torch::nn::Module>());
      level.resample = upsample->register_module("conv", conv(width, width, 3));
      xavier_uniform_with_zero_bias(level.resample->weight, level.resample->bias);
    }
    up_modules[static_cast<std::size_t>(i)] = level_module;
  }
  auto up = register_module("up", torch::nn::ModuleList());
  for (auto& module : up_modules) up->push_back(module);

  norm_out = register_module("norm_out", group_norm(o.groups, width));
  conv_out = register_module("conv_out", conv(width, out_channels_, 3));
  zero_(conv_out->weight, conv_out->bias);
}

at::Tensor UNetImpl::run_block(ResnetBlock& block, const at::Tensor& x, const at::Tensor& temb_activated) {
  if (!checkpointing()) return block->forward(x, temb_activated);
  return checkpointed([block](const TensorList& in) mutable { return TensorList{block->forward(in[0], in[1])}; },
                      {x, temb_activated})[0];
}

at::Tensor UNetImpl::run_attention(AttnBlock& block, const at::Tensor& x) {
  if (!checkpointing()) return block->forward(x);
  return checkpointed([block](const TensorList& in) mutable { return TensorList{block->forward(in[0])}; }, {x})[0];
}

at::Tensor UNetImpl::forward(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) {
  check_inputs(x, t, labels);
  auto temb = linear_forward(*temb_dense[1]->as<torch::nn::Linear>(),
                             at::silu(linear_forward(*temb_dense[0]->as<torch::nn::Linear>(),
                                                     ddpm_timestep_embedding(t, options_.channels).to(x.dtype()))));
  if (label_emb) temb = temb + label_emb(*labels);
  const auto temb_activated = at::silu(temb);

  std::vector<at::Tensor> skips{conv_in(x)};
  const auto levels = down_.size();
  for (std::size_t i = 0; i < levels; ++i) {
    Level& level = down_[i];
    before_group("down", i);
    const std::size_t first = skips.size();
    for (std::size_t j = 0; j < level.blocks.size(); ++j) {
      auto h = run_block(level.blocks[j], skips.back(), temb_activated);
      if (!level.attention.empty()) h = run_attention(level.attention[j], h);
      skips.push_back(std::move(h));
    }
    if (level.resample) skips.push_back(level.resample(at::constant_pad_nd(skips.back(), {0, 1, 0, 1})));
    if (has_parameter_group_hooks())
      after_group("down", i, std::vector<at::Tensor>(skips.begin() + static_cast<std::ptrdiff_t>(first), skips.end()));
  }
  auto h = run_block(mid_block_1, skips.back(), temb_activated);
  h = run_attention(mid_attn_1, h);
  h = run_block(mid_block_2, h, temb_activated);
  for (std::size_t i = levels; i-- > 0;) {
    Level& level = up_[i];
    before_group("up", i);
    for (std::size_t j = 0; j < level.blocks.size(); ++j) {
      h = run_block(level.blocks[j], at::cat({h, skips.back()}, 1), temb_activated);
      skips.pop_back();
      if (!level.attention.empty()) h = run_attention(level.attention[j], h);
    }
    if (level.resample) h = level.resample(at::upsample_nearest2d(h, {h.size(2) * 2, h.size(3) * 2}));
    after_group("up", i, {h});
  }
  return conv_out(at::silu(norm_out(h)));
}

std::vector<std::string> UNetImpl::parameter_groups() const {
  std::vector<std::string> groups;
  for (std::size_t i = 0; i < down_.size(); ++i) groups.push_back(fmt::format("down.{}", i));
  for (std::size_t i = 0; i < up_.size(); ++i) groups.push_back(fmt::format("up.{}", i));
  return groups;
}

void UNetImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options_;
  stream << fmt::format(
      "UNet(channels={}, mults={{{}}}, blocks={}, attention={{{}}}, dropout={}, image={}, in={}, out={}", o.channels,
      fmt::join(o.mults, ","), o.blocks, fmt::join(o.attention, ","), o.dropout, o.image, o.in_channels, out_channels_);
  if (o.classes > 0) stream << fmt::format(", classes={}, class_dropout={}", o.classes, o.class_dropout);
  if (checkpointing()) stream << ", checkpoint=true";
  stream << ")";
}

}  // namespace runner::nn
