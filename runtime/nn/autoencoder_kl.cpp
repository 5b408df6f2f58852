// AutoencoderKL: the diffusers architecture, its config.json and its weight files.
#include "runtime/nn/autoencoder_kl.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "runtime/ckpt/weights_file.h"
#include "runtime/core/shape_text.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/state_loading.h"

namespace runner::nn {
namespace {

constexpr double kNormEps = 1e-6;

torch::nn::GroupNorm group_norm(std::int64_t groups, std::int64_t channels) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(kNormEps));
}

torch::nn::Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride = 1,
                       std::int64_t padding = -1) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding < 0 ? kernel / 2 : padding));
}

bool is_directory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// Older diffusers checkpoints name the mid-block attention's projections as the LDM code did.
std::string current_name(const std::string& name) {
  static const std::pair<const char*, const char*> kRenames[] = {
      {".attentions.0.query.", ".attentions.0.to_q."},
      {".attentions.0.key.", ".attentions.0.to_k."},
      {".attentions.0.value.", ".attentions.0.to_v."},
      {".attentions.0.proj_attn.", ".attentions.0.to_out.0."},
  };
  for (const auto& [old_part, new_part] : kRenames) {
    const auto at = name.find(old_part);
    if (at != std::string::npos) return name.substr(0, at) + new_part + name.substr(at + std::strlen(old_part));
  }
  return name;
}

}  // namespace

VaeResnetBlockImpl::VaeResnetBlockImpl(std::int64_t in, std::int64_t out, std::int64_t groups) {
  norm1 = register_module("norm1", group_norm(groups, in));
  conv1 = register_module("conv1", conv(in, out, 3));
  norm2 = register_module("norm2", group_norm(groups, out));
  conv2 = register_module("conv2", conv(out, out, 3));
  if (in != out) conv_shortcut = register_module("conv_shortcut", conv(in, out, 1));
}

at::Tensor VaeResnetBlockImpl::forward(const at::Tensor& x) {
  auto h = conv1(at::silu(norm1(x)));
  h = conv2(at::silu(norm2(h)));
  return (conv_shortcut ? conv_shortcut(x) : x) + h;
}

VaeAttentionImpl::VaeAttentionImpl(std::int64_t channels, std::int64_t groups) {
  group_norm = register_module("group_norm", nn::group_norm(groups, channels));
  to_q = register_module("to_q", torch::nn::Linear(channels, channels));
  to_k = register_module("to_k", torch::nn::Linear(channels, channels));
  to_v = register_module("to_v", torch::nn::Linear(channels, channels));
  to_out = register_module("to_out", torch::nn::ModuleList(torch::nn::Linear(channels, channels)));
}

at::Tensor VaeAttentionImpl::forward(const at::Tensor& x) {
  const auto n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const at::Tensor tokens = group_norm(x).reshape({n, c, h * w}).transpose(1, 2);  // [N, HW, C]
  // One head of width C: SDPA's default scale 1/sqrt(C), as diffusers' AttnProcessor2_0.
  const at::Tensor q = linear_forward(*to_q, tokens).unsqueeze(1), k = linear_forward(*to_k, tokens).unsqueeze(1),
                   v = linear_forward(*to_v, tokens).unsqueeze(1);
  at::Tensor attended = at::scaled_dot_product_attention(q, k, v).squeeze(1);
  attended = linear_forward(*to_out[0]->as<torch::nn::Linear>(), attended);
  return attended.transpose(1, 2).reshape({n, c, h, w}) + x;
}

VaeMidBlockImpl::VaeMidBlockImpl(std::int64_t channels, std::int64_t groups, bool attention) {
  resnets = register_module("resnets", torch::nn::ModuleList(VaeResnetBlock(channels, channels, groups),
                                                             VaeResnetBlock(channels, channels, groups)));
  attentions = register_module("attentions", torch::nn::ModuleList());
  if (attention) attentions->push_back(VaeAttention(channels, groups));
}

at::Tensor VaeMidBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = resnets[0]->as<VaeResnetBlock>()->forward(x);
  if (!attentions->is_empty()) h = attentions[0]->as<VaeAttention>()->forward(h);
  return resnets[1]->as<VaeResnetBlock>()->forward(h);
}

VaeResampleImpl::VaeResampleImpl(std::int64_t channels, bool down) : down_(down) {
  conv = register_module("conv", down ? nn::conv(channels, channels, 3, 2, 0) : nn::conv(channels, channels, 3));
}

at::Tensor VaeResampleImpl::forward(const at::Tensor& x) {
  if (down_) return conv(at::constant_pad_nd(x, {0, 1, 0, 1}, 0));
  return conv(at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2}));
}

VaeLevelImpl::VaeLevelImpl(std::int64_t in, std::int64_t out, std::int64_t layers, std::int64_t groups, bool down,
                           bool resample) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < layers; ++i) resnets->push_back(VaeResnetBlock(i == 0 ? in : out, out, groups));
  resamplers = register_module(down ? "downsamplers" : "upsamplers", torch::nn::ModuleList());
  if (resample) resamplers->push_back(VaeResample(out, down));
}

at::Tensor VaeLevelImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (const auto& block : *resnets) h = block->as<VaeResnetBlock>()->forward(h);
  if (!resamplers->is_empty()) h = resamplers[0]->as<VaeResample>()->forward(h);
  return h;
}

VaeEncoderImpl::VaeEncoderImpl(const AutoencoderKLOptions& o) {
  const auto& widths = o.block_out_channels;
  conv_in = register_module("conv_in", conv(o.in_channels, widths.front(), 3));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::int64_t in = i == 0 ? widths.front() : widths[i - 1];
    down_blocks->push_back(VaeLevel(in, widths[i], o.layers_per_block, o.norm_num_groups, true, i + 1 < widths.size()));
  }
  mid_block = register_module("mid_block", VaeMidBlock(widths.back(), o.norm_num_groups, o.mid_block_add_attention));
  conv_norm_out = register_module("conv_norm_out", group_norm(o.norm_num_groups, widths.back()));
  conv_out = register_module("conv_out", conv(widths.back(), 2 * o.latent_channels, 3));
}

at::Tensor VaeEncoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_in(x);
  for (const auto& level : *down_blocks) h = level->as<VaeLevel>()->forward(h);
  h = mid_block(h);
  return conv_out(at::silu(conv_norm_out(h)));
}

VaeDecoderImpl::VaeDecoderImpl(const AutoencoderKLOptions& o) {
  const std::vector<std::int64_t> widths(o.block_out_channels.rbegin(), o.block_out_channels.rend());
  conv_in = register_module("conv_in", conv(o.latent_channels, widths.front(), 3));
  mid_block = register_module("mid_block", VaeMidBlock(widths.front(), o.norm_num_groups, o.mid_block_add_attention));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::int64_t in = i == 0 ? widths.front() : widths[i - 1];
    up_blocks->push_back(
        VaeLevel(in, widths[i], o.layers_per_block + 1, o.norm_num_groups, false, i + 1 < widths.size()));
  }
  conv_norm_out = register_module("conv_norm_out", group_norm(o.norm_num_groups, widths.back()));
  conv_out = register_module("conv_out", conv(widths.back(), o.out_channels, 3));
}

at::Tensor VaeDecoderImpl::forward(const at::Tensor& z) {
  at::Tensor h = mid_block(conv_in(z));
  for (const auto& level : *up_blocks) h = level->as<VaeLevel>()->forward(h);
  return conv_out(at::silu(conv_norm_out(h)));
}

void check_autoencoder_kl_options(const AutoencoderKLOptions& o) {
  auto fail = [](const std::string& message) { throw std::invalid_argument("AutoencoderKL: " + message); };
  if (o.in_channels < 1) fail(fmt::format("in_channels must be at least 1, got {}", o.in_channels));
  if (o.out_channels < 1) fail(fmt::format("out_channels must be at least 1, got {}", o.out_channels));
  if (o.latent_channels < 1) fail(fmt::format("latent_channels must be at least 1, got {}", o.latent_channels));
  if (o.block_out_channels.empty()) fail("block_out_channels must list at least one width");
  if (o.layers_per_block < 1) fail(fmt::format("layers_per_block must be at least 1, got {}", o.layers_per_block));
  if (o.norm_num_groups < 1) fail(fmt::format("norm_num_groups must be at least 1, got {}", o.norm_num_groups));
  for (const auto width : o.block_out_channels)
    if (width < 1 || width % o.norm_num_groups != 0)
      fail(fmt::format("block_out_channels {} must be positive multiples of norm_num_groups {}",
                       fmt::join(o.block_out_channels, ", "), o.norm_num_groups));
  if (!(o.scaling_factor > 0)) fail(fmt::format("scaling_factor must be positive, got {}", o.scaling_factor));
  if (o.decode_batch < 0) fail(fmt::format("decode_batch must be 0 (all at once) or more, got {}", o.decode_batch));
}

AutoencoderKLImpl::AutoencoderKLImpl(AutoencoderKLOptions options) : options_(std::move(options)) {
  check_autoencoder_kl_options(options_);
  encoder = register_module("encoder", VaeEncoder(options_));
  decoder = register_module("decoder", VaeDecoder(options_));
  const std::int64_t latent = options_.latent_channels;
  if (options_.use_quant_conv) quant_conv = register_module("quant_conv", conv(2 * latent, 2 * latent, 1));
  if (options_.use_post_quant_conv) post_quant_conv = register_module("post_quant_conv", conv(latent, latent, 1));
}

std::int64_t AutoencoderKLImpl::downsample() const {
  return std::int64_t{1} << (options_.block_out_channels.size() - 1);
}

std::pair<at::Tensor, at::Tensor> AutoencoderKLImpl::encode(const at::Tensor& images) {
  const std::int64_t f = downsample();
  if (images.dim() != 4 || images.size(1) != options_.in_channels || images.size(2) % f != 0 || images.size(3) % f != 0)
    throw std::invalid_argument(
        fmt::format("AutoencoderKL:encode: images must be [N, {}, H, W] with H and W multiples of {}, got {}",
                    options_.in_channels, f, core::shape_text(images.sizes())));
  at::Tensor moments = encoder(images);
  if (quant_conv) moments = quant_conv(moments);
  auto halves = moments.chunk(2, 1);
  return {halves[0], at::clamp(halves[1], -30.0, 20.0)};
}

at::Tensor AutoencoderKLImpl::decode(const at::Tensor& latents) {
  if (latents.dim() != 4 || latents.size(1) != options_.latent_channels)
    throw std::invalid_argument(fmt::format("AutoencoderKL:decode: latents must be [N, {}, h, w], got {}",
                                            options_.latent_channels, core::shape_text(latents.sizes())));
  const std::int64_t n = latents.size(0);
  const std::int64_t slice = options_.decode_batch > 0 ? options_.decode_batch : std::max<std::int64_t>(n, 1);
  std::vector<at::Tensor> parts;
  for (std::int64_t start = 0; start < n; start += slice) {
    at::Tensor z = latents.narrow(0, start, std::min(slice, n - start));
    if (post_quant_conv) z = post_quant_conv(z);
    parts.push_back(decoder(z));
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, 0);
}

void AutoencoderKLImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options_;
  stream << fmt::format(
      "AutoencoderKL(block_out_channels={{{}}}, layers_per_block={}, latent_channels={}, "
      "norm_num_groups={}, scaling_factor={}",
      fmt::join(o.block_out_channels, ","), o.layers_per_block, o.latent_channels, o.norm_num_groups, o.scaling_factor);
  if (o.shift_factor) stream << fmt::format(", shift_factor={}", *o.shift_factor);
  stream << ")";
}

AutoencoderKLOptions read_autoencoder_kl_config(const std::string& config_path, AutoencoderKLOptions o) {
  std::ifstream file(config_path);
  if (!file) throw std::invalid_argument(fmt::format("{}: cannot read the VAE config", config_path));
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument(fmt::format("{}: not valid JSON: {}", config_path, error.what()));
  }
  auto fail = [&](const std::string& message) {
    throw std::invalid_argument(fmt::format("{}: {}", config_path, message));
  };
  if (!config.is_object()) fail("the config must be a JSON object");
  try {
    if (config.contains("_class_name") && config["_class_name"] != "AutoencoderKL")
      fail(fmt::format("_class_name is {}; runner reads AutoencoderKL configs", config["_class_name"].dump()));
    auto read_int = [&](const char* key, std::int64_t& field) {
      if (config.contains(key)) field = config[key].get<std::int64_t>();
    };
    read_int("in_channels", o.in_channels);
    read_int("out_channels", o.out_channels);
    read_int("latent_channels", o.latent_channels);
    read_int("layers_per_block", o.layers_per_block);
    read_int("norm_num_groups", o.norm_num_groups);
    if (config.contains("block_out_channels"))
      o.block_out_channels = config["block_out_channels"].get<std::vector<std::int64_t>>();
    if (config.contains("scaling_factor")) o.scaling_factor = config["scaling_factor"].get<double>();
    if (config.contains("shift_factor") && !config["shift_factor"].is_null())
      o.shift_factor = config["shift_factor"].get<double>();
    if (config.contains("use_quant_conv")) o.use_quant_conv = config["use_quant_conv"].get<bool>();
    if (config.contains("use_post_quant_conv")) o.use_post_quant_conv = config["use_post_quant_conv"].get<bool>();
    if (config.contains("mid_block_add_attention"))
      o.mid_block_add_attention = config["mid_block_add_attention"].get<bool>();
    if (config.contains("act_fn") && config["act_fn"] != "silu")
      fail(fmt::format("act_fn {} is not supported (runner's AutoencoderKL uses silu)", config["act_fn"].dump()));
    const std::pair<const char*, const char*> kBlockTypes[] = {{"down_block_types", "DownEncoderBlock2D"},
                                                               {"up_block_types", "UpDecoderBlock2D"}};
    for (const auto& [key, supported] : kBlockTypes) {
      if (!config.contains(key)) continue;
      const auto types = config[key].get<std::vector<std::string>>();
      for (const auto& type : types)
        if (type != supported)
          fail(fmt::format("{} lists \"{}\"; runner's AutoencoderKL has {} only", key, type, supported));
      if (types.size() != o.block_out_channels.size())
        fail(
            fmt::format("{} has {} entries for {} block_out_channels", key, types.size(), o.block_out_channels.size()));
    }
    if (config.contains("latents_mean") && !config["latents_mean"].is_null())
      fail("latents_mean / latents_std (per-channel latent normalisation) are not supported");
  } catch (const nlohmann::json::exception& error) {
    fail(fmt::format("a field has the wrong type: {}", error.what()));
  }
  try {
    check_autoencoder_kl_options(o);
  } catch (const std::invalid_argument& error) {
    fail(error.what());
  }
  return o;
}

LoadedAutoencoder load_autoencoder_kl(const std::string& path, const AutoencoderKLOptions& options) {
  AutoencoderKLOptions resolved = options;
  std::string weights = path;
  if (is_directory(path)) {
    const std::string config = path + "/config.json";
    if (!exists(config)) throw std::invalid_argument(fmt::format("{}: a diffusers VAE folder needs config.json", path));
    resolved = read_autoencoder_kl_config(config, options);
    weights = path + "/diffusion_pytorch_model.safetensors";
    if (!exists(weights))
      throw std::invalid_argument(
          fmt::format("{}: no diffusion_pytorch_model.safetensors beside config.json (runner reads "
                      "safetensors weights, not .bin)",
                      path));
  } else if (!exists(path)) {
    throw std::invalid_argument(fmt::format("{}: no such file or folder", path));
  }
  AutoencoderKL model(resolved);
  StateLoadOptions load_options;
  load_options.rename = current_name;
  load_options.squeeze_1x1 = true;  // the oldest checkpoints store the attention projections as 1x1 convolutions
  load_state(
      *model, ckpt::read_weights_file(weights), weights,
      fmt::format("AutoencoderKL(block_out_channels={{{}}}, layers_per_block={}, latent_channels={})",
                  fmt::join(resolved.block_out_channels, ","), resolved.layers_per_block, resolved.latent_channels),
      load_options);
  model->eval();
  return {model, weights};
}

}  // namespace runner::nn
