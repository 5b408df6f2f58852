// nn: the built-in layers and models (Linear ... Identity, UNet, DiT, AutoencoderKL) as module userdata; open_nn.
#include <torch/nn.h>

#include <filesystem>
#include <fmt/format.h>
#include <functional>
#include <sstream>
#include <type_traits>

#include "bindings/bindings.h"
#include "bindings/nn_binding.h"
#include "bindings/nn_functional_binding.h"
#include "bindings/option_table.h"
#include "bindings/run_binding.h"
#include "bindings/tensor_binding.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/sha256.h"
#include "runtime/nn/autoencoder_kl.h"
#include "runtime/nn/dit.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/state_loading.h"
#include "runtime/nn/unet.h"
#include "runtime/train/ema.h"

namespace runner::bindings {
namespace {

constexpr const char* kModuleType = "runner.NativeModule";

struct ModuleBox {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::shared_ptr<runner::nn::Denoiser> denoiser;              // set for UNet and DiT: forward(x, t [, labels])
  std::shared_ptr<runner::nn::AutoencoderKLImpl> autoencoder;  // set for AutoencoderKL: encode, decode
};

template <class Holder>
void push_module(lua_State* L, Holder holder) {
  new_userdata<ModuleBox>(
      L, kModuleType, ModuleBox{holder.ptr(), [holder](const at::Tensor& x) mutable { return holder->forward(x); }});
}

ModuleBox& check_module(lua_State* L, int index) { return *check_userdata<ModuleBox>(L, index, kModuleType, "Module"); }

// Factories -------------------------------------------------------------------------------------

// The keyword options of the layers: each struct is the keyword part of the torch::nn options it fills, with
// PyTorch's defaults.
struct LinearOptions {
  bool bias = true;
};
const OptionTable<LinearOptions> kLinearOptions("Linear", "LinearOptions", {option("bias", &LinearOptions::bias)});

// nn.Linear(in_features, out_features [, LinearOptions])
int nn_linear(lua_State* L) {
  const LinearOptions o = kLinearOptions.read(L, 3);
  torch::nn::Linear linear(torch::nn::LinearOptions(check_integer(L, 1), check_integer(L, 2)).bias(o.bias));
  new_userdata<ModuleBox>(L, kModuleType, ModuleBox{linear.ptr(), [linear](const at::Tensor& x) {
                                                      return runner::nn::linear_forward(*linear, x);
                                                    }});
  return 1;
}

struct Conv2dOptions {
  std::vector<std::int64_t> stride{1};  // one number for both sides, or {height, width}
  std::vector<std::int64_t> padding{0};
  std::vector<std::int64_t> dilation{1};
  std::int64_t groups = 1;
  bool bias = true;
  torch::nn::detail::conv_padding_mode_t padding_mode = torch::kZeros;
};

OptionField<Conv2dOptions> pair_option(const char* key, std::vector<std::int64_t> Conv2dOptions::*member) {
  return option_with<Conv2dOptions>(key, [member](lua_State* L, const char* k, Conv2dOptions& o) {
    read_option_value(L, k, o.*member);
    if ((o.*member).size() != 1 && (o.*member).size() != 2)
      raise_error(L, fmt::format("option '{}' must be a number or two numbers", k));
  });
}

const OptionTable<Conv2dOptions> kConv2dOptions(
    "Conv2d", "Conv2dOptions",
    {
        pair_option("stride", &Conv2dOptions::stride),
        pair_option("padding", &Conv2dOptions::padding),
        pair_option("dilation", &Conv2dOptions::dilation),
        option("groups", &Conv2dOptions::groups),
        option("bias", &Conv2dOptions::bias),
        option_with<Conv2dOptions>("padding_mode",
                                   [](lua_State* L, const char* key, Conv2dOptions& o) {
                                     std::string mode;
                                     read_option_value(L, key, mode);
                                     if (mode == "zeros")
                                       o.padding_mode = torch::kZeros;
                                     else if (mode == "reflect")
                                       o.padding_mode = torch::kReflect;
                                     else if (mode == "replicate")
                                       o.padding_mode = torch::kReplicate;
                                     else if (mode == "circular")
                                       o.padding_mode = torch::kCircular;
                                     else
                                       throw std::invalid_argument(
                                           "padding_mode must be zeros, reflect, replicate or circular, got '" + mode +
                                           "'");
                                   }),
    });

torch::ExpandingArray<2> pair(const std::vector<std::int64_t>& values) {
  return values.size() == 1 ? torch::ExpandingArray<2>(values[0]) : torch::ExpandingArray<2>({values[0], values[1]});
}

// nn.Conv2d(in, out, kernel [, Conv2dOptions])
int nn_conv2d(lua_State* L) {
  const Conv2dOptions o = kConv2dOptions.read(L, 4);
  torch::ExpandingArray<2> kernel(1);
  if (lua_istable(L, 3)) {
    int next = 3;
    const auto sizes = check_sizes(L, 3, &next);
    if (sizes.size() != 2) luaL_argerror(L, 3, "kernel size must be a number or two numbers");
    kernel = torch::ExpandingArray<2>({sizes[0], sizes[1]});
  } else {
    kernel = torch::ExpandingArray<2>(check_integer(L, 3));
  }
  push_module(L, torch::nn::Conv2d(torch::nn::Conv2dOptions(check_integer(L, 1), check_integer(L, 2), kernel)
                                       .stride(pair(o.stride))
                                       .padding(pair(o.padding))
                                       .dilation(pair(o.dilation))
                                       .groups(o.groups)
                                       .bias(o.bias)
                                       .padding_mode(o.padding_mode)));
  return 1;
}

struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;
};
const OptionTable<GroupNormOptions> kGroupNormOptions("GroupNorm", "GroupNormOptions",
                                                      {option("eps", &GroupNormOptions::eps),
                                                       option("affine", &GroupNormOptions::affine)});

// nn.GroupNorm(num_groups, num_channels [, GroupNormOptions])
int nn_group_norm(lua_State* L) {
  const GroupNormOptions o = kGroupNormOptions.read(L, 3);
  push_module(L,
              torch::nn::GroupNorm(
                  torch::nn::GroupNormOptions(check_integer(L, 1), check_integer(L, 2)).eps(o.eps).affine(o.affine)));
  return 1;
}

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;
};
const OptionTable<LayerNormOptions> kLayerNormOptions(
    "LayerNorm", "LayerNormOptions",
    {option("eps", &LayerNormOptions::eps), option("elementwise_affine", &LayerNormOptions::elementwise_affine)});

// nn.LayerNorm(shape [, LayerNormOptions]): shape a number or a table.
int nn_layer_norm(lua_State* L) {
  int next = 1;
  const auto shape = check_sizes(L, 1, &next);
  if (shape.empty()) luaL_argerror(L, 1, "normalized shape expected");
  const LayerNormOptions o = kLayerNormOptions.read(L, next);
  push_module(
      L, torch::nn::LayerNorm(torch::nn::LayerNormOptions(shape).eps(o.eps).elementwise_affine(o.elementwise_affine)));
  return 1;
}

struct EmbeddingOptions {
  std::optional<std::int64_t> padding_idx;  // none: every id is trained
};
const OptionTable<EmbeddingOptions> kEmbeddingOptions("Embedding", "EmbeddingOptions",
                                                      {option("padding_idx", &EmbeddingOptions::padding_idx)});

// nn.Embedding(num_embeddings, embedding_dim [, EmbeddingOptions]): ids are 0-based tensor contents.
int nn_embedding(lua_State* L) {
  const EmbeddingOptions o = kEmbeddingOptions.read(L, 3);
  auto options = torch::nn::EmbeddingOptions(check_integer(L, 1), check_integer(L, 2));
  if (o.padding_idx) options.padding_idx(*o.padding_idx);
  push_module(L, torch::nn::Embedding(options));
  return 1;
}

int nn_dropout(lua_State* L) {
  const double p = luaL_optnumber(L, 1, 0.5);
  if (p < 0 || p > 1) luaL_argerror(L, 1, "dropout probability must be in [0, 1]");
  push_module(L, torch::nn::Dropout(torch::nn::DropoutOptions(p)));
  return 1;
}

struct GELUOptions {
  std::string approximate = "none";  // or "tanh"
};
const OptionTable<GELUOptions> kGELUOptions("GELU", "GELUOptions", {option("approximate", &GELUOptions::approximate)});

// nn.GELU([GELUOptions])
int nn_gelu(lua_State* L) {
  push_module(L, torch::nn::GELU(torch::nn::GELUOptions().approximate(kGELUOptions.read(L, 1).approximate)));
  return 1;
}

int nn_leaky_relu(lua_State* L) {
  push_module(L, torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(luaL_optnumber(L, 1, 0.01))));
  return 1;
}

template <class Holder>
int simple_module(lua_State* L) {
  push_module(L, Holder());
  return 1;
}

void push_denoiser(lua_State* L, const std::shared_ptr<runner::nn::Denoiser>& denoiser) {
  new_userdata<ModuleBox>(L, kModuleType, ModuleBox{denoiser, nullptr, denoiser});
}

using runner::nn::DiTOptions;
using runner::nn::UNetOptions;

const OptionTable<UNetOptions> kUNetOptions("UNet", "UNetOptions",
                                            {
                                                option("channels", &UNetOptions::channels),
                                                option("mults", &UNetOptions::mults),
                                                option("blocks", &UNetOptions::blocks),
                                                option("attention", &UNetOptions::attention),
                                                option("dropout", &UNetOptions::dropout),
                                                option("image", &UNetOptions::image),
                                                option("in_channels", &UNetOptions::in_channels),
                                                option("out_channels", &UNetOptions::out_channels),
                                                option("learn_sigma", &UNetOptions::learn_sigma),
                                                option("classes", &UNetOptions::classes),
                                                option("class_dropout", &UNetOptions::class_dropout),
                                                option("groups", &UNetOptions::groups),
                                                option("checkpoint", &UNetOptions::checkpoint),
                                            });

// nn.UNet{...}: UNetOptions.
int nn_unet(lua_State* L) {
  push_denoiser(L, std::make_shared<runner::nn::UNetImpl>(kUNetOptions.read(L, 1)));
  return 1;
}

const OptionTable<DiTOptions> kDiTOptions("DiT", "DiTOptions",
                                          {
                                              lua_option<DiTOptions>("size"),  // the preset, read first
                                              option("depth", &DiTOptions::depth),
                                              option("hidden", &DiTOptions::hidden),
                                              option("heads", &DiTOptions::heads),
                                              option("patch", &DiTOptions::patch),
                                              option("image", &DiTOptions::image),
                                              option("in_channels", &DiTOptions::in_channels),
                                              option("classes", &DiTOptions::classes),
                                              option("class_dropout", &DiTOptions::class_dropout),
                                              option("mlp_ratio", &DiTOptions::mlp_ratio),
                                              option("learn_sigma", &DiTOptions::learn_sigma),
                                              option("checkpoint", &DiTOptions::checkpoint),
                                              option("fused", &DiTOptions::fused),
                                          });

// nn.DiT{size = "DiT-XL/2" | depth, hidden, heads; ...}: DiTOptions, explicit fields over the size preset.
int nn_dit(lua_State* L) {
  if (!lua_istable(L, 1) || (!has_field(L, 1, "size") &&
                             (!has_field(L, 1, "depth") || !has_field(L, 1, "hidden") || !has_field(L, 1, "heads")))) {
    if (lua_istable(L, 1)) kDiTOptions.read(L, 1);  // an unknown key is the first thing to report
    throw std::invalid_argument("DiT: give a size (e.g. size = \"DiT-S/2\") or depth, hidden and heads");
  }
  DiTOptions preset;
  if (has_field(L, 1, "size")) {
    std::string size;
    lua_getfield(L, 1, "size");
    read_option_value(L, "size", size);
    lua_pop(L, 1);
    preset = runner::nn::dit_preset(size);
  }
  push_denoiser(L, std::make_shared<runner::nn::DiTImpl>(kDiTOptions.read(L, 1, preset)));
  return 1;
}

// nn.dit_size(name): {depth, hidden, heads, patch} of a preset, or nil and "unknown DiT size ... (known: ...)".
int nn_dit_size(lua_State* L) {
  DiTOptions preset;
  try {
    preset = runner::nn::dit_preset(check_string(L, 1));
  } catch (const std::invalid_argument& error) {
    lua_pushnil(L);
    lua_pushstring(L, error.what());
    return 2;
  }
  lua_createtable(L, 0, 4);
  for (const auto& [key, value] : {std::pair{"depth", preset.depth}, std::pair{"hidden", preset.hidden},
                                   std::pair{"heads", preset.heads}, std::pair{"patch", preset.patch}}) {
    lua_pushinteger(L, static_cast<lua_Integer>(value));
    lua_setfield(L, -2, key);
  }
  return 1;
}

using runner::nn::AutoencoderKLOptions;

const OptionTable<AutoencoderKLOptions> kAutoencoderKLOptions(
    "AutoencoderKL", "AutoencoderKLOptions",
    {option("in_channels", &AutoencoderKLOptions::in_channels),
     option("out_channels", &AutoencoderKLOptions::out_channels),
     option("latent_channels", &AutoencoderKLOptions::latent_channels),
     option("block_out_channels", &AutoencoderKLOptions::block_out_channels),
     option("layers_per_block", &AutoencoderKLOptions::layers_per_block),
     option("norm_num_groups", &AutoencoderKLOptions::norm_num_groups),
     option("scaling_factor", &AutoencoderKLOptions::scaling_factor),
     option("shift_factor", &AutoencoderKLOptions::shift_factor),
     option("use_quant_conv", &AutoencoderKLOptions::use_quant_conv),
     option("use_post_quant_conv", &AutoencoderKLOptions::use_post_quant_conv),
     option("mid_block_add_attention", &AutoencoderKLOptions::mid_block_add_attention),
     option("decode_batch", &AutoencoderKLOptions::decode_batch)});

void push_autoencoder(lua_State* L, const runner::nn::AutoencoderKL& model) {
  new_userdata<ModuleBox>(L, kModuleType, ModuleBox{model.ptr(), nullptr, nullptr, model.ptr()});
}

// nn.AutoencoderKL{...} (called on the nn.AutoencoderKL table): random weights.
int nn_autoencoder_kl(lua_State* L) {
  push_autoencoder(L, runner::nn::AutoencoderKL(kAutoencoderKLOptions.read(L, 2)));
  return 1;
}

// nn.AutoencoderKL.load(folder_or_file [, options]): a diffusers folder or one safetensors file, in eval mode.
int nn_autoencoder_kl_load(lua_State* L) {
  const std::string path = check_string(L, 1);
  const runner::nn::LoadedAutoencoder loaded = runner::nn::load_autoencoder_kl(path, kAutoencoderKLOptions.read(L, 2));
  record_run_input(L, "vae", path, [&] {  // the encode manifest names its VAE by the same hash
    return nlohmann::json{{"weights", std::filesystem::absolute(loaded.weights_path).string()},
                          {"sha256", runner::core::sha256_file(loaded.weights_path)}};
  });
  push_autoencoder(L, loaded.model);
  return 1;
}

// Module methods ----------------------------------------------------------------------------------

// Timesteps as a tensor, or one number for the whole batch.
at::Tensor check_timesteps(lua_State* L, int index, const at::Tensor& x) {
  if (lua_type(L, index) == LUA_TNUMBER) {
    return at::full({x.dim() > 0 ? x.size(0) : 1}, check_integer(L, index), x.options().dtype(at::kLong));
  }
  return check_tensor(L, index);
}

// A built-in module's child (DiT's x_embedder.proj, ...) as a module of its own, with a forward when it is of a
// type that nn.* builds.
template <class Impl>
bool bind_forward(const std::shared_ptr<torch::nn::Module>& module,
                  std::function<at::Tensor(const at::Tensor&)>& forward) {
  const auto typed = std::dynamic_pointer_cast<Impl>(module);
  if (!typed) return false;
  if constexpr (std::is_same_v<Impl, torch::nn::LinearImpl>)
    forward = [typed](const at::Tensor& x) { return runner::nn::linear_forward(*typed, x); };
  else
    forward = [typed](const at::Tensor& x) { return typed->forward(x); };
  return true;
}

template <class... Impl>
void push_child_module(lua_State* L, const std::shared_ptr<torch::nn::Module>& child) {
  std::function<at::Tensor(const at::Tensor&)> forward;
  static_cast<void>((bind_forward<Impl>(child, forward) || ...));
  new_userdata<ModuleBox>(L, kModuleType, ModuleBox{child, std::move(forward)});
}

std::string module_type_text(const torch::nn::Module& module) {
  std::string name = module.name();
  for (const std::string prefix : {"torch::nn::", "runner::nn::"}) {
    if (name.rfind(prefix, 0) == 0) name.erase(0, prefix.size());
  }
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

// m.key: a method; else the module's own parameter, buffer or child named key (m[k], a number: the child named
// k - 1, as Sequential's children are indexed); else nil. The method table is upvalue 1.
int module_index(lua_State* L) {
  lua_pushvalue(L, 2);
  lua_rawget(L, lua_upvalueindex(1));
  if (!lua_isnil(L, -1)) return 1;
  const ModuleBox& box = check_module(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    const std::string name = lua_tostring(L, 2);
    if (const at::Tensor* parameter = box.module->named_parameters(false).find(name)) {
      push_tensor(L, *parameter);
      return 1;
    }
    if (const at::Tensor* buffer = box.module->named_buffers(false).find(name)) {
      push_tensor(L, *buffer);
      return 1;
    }
  }
  std::string child_name;
  if (lua_type(L, 2) == LUA_TSTRING)
    child_name = lua_tostring(L, 2);
  else if (lua_type(L, 2) == LUA_TNUMBER && lua_tonumber(L, 2) >= 1)
    child_name = std::to_string(static_cast<std::int64_t>(lua_tonumber(L, 2)) - 1);
  if (const auto* child = box.module->named_children().find(child_name)) {
    push_child_module<torch::nn::LinearImpl, torch::nn::Conv2dImpl, torch::nn::GroupNormImpl, torch::nn::LayerNormImpl,
                      torch::nn::EmbeddingImpl, torch::nn::DropoutImpl, torch::nn::GELUImpl, torch::nn::LeakyReLUImpl,
                      torch::nn::ReLUImpl, torch::nn::SiLUImpl, torch::nn::TanhImpl, torch::nn::SigmoidImpl,
                      torch::nn::MishImpl, torch::nn::IdentityImpl>(L, *child);
    return 1;
  }
  lua_pushnil(L);
  return 1;
}

int module_forward(lua_State* L) {
  ModuleBox& box = check_module(L, 1);
  if (box.autoencoder)
    throw std::invalid_argument("AutoencoderKL is not called: use vae:encode(images) and vae:decode(latents)");
  if (!box.forward && !box.denoiser)
    throw std::invalid_argument(
        fmt::format("this {} is a part of a built-in model with no forward of its own in Lua; call the model",
                    module_type_text(*box.module)));
  if (box.denoiser) {
    const at::Tensor& x = check_tensor(L, 2);
    std::optional<at::Tensor> labels;
    if (!lua_isnoneornil(L, 4)) labels = check_tensor(L, 4);
    push_tensor(L, box.denoiser->forward(x, check_timesteps(L, 3, x), labels));
    return 1;
  }
  push_tensor(L, box.forward(check_tensor(L, 2)));
  return 1;
}

// __call(self, x) == forward(x)
int module_call(lua_State* L) { return module_forward(L); }

// A parameter that sharding over the weights released between steps holds no storage: reading or writing it is
// refused.
bool released(const at::Tensor& tensor) {
  return tensor.defined() && tensor.numel() > 0 && tensor.has_storage() && tensor.storage().nbytes() == 0;
}

void raise_released(lua_State* L, const std::string& name) {
  raise_error(L, fmt::format("the model's parameter '{}' is not whole on this rank between steps: runner.trainer "
                             "with shard = \"weights\" keeps each rank's rows of it (train:model_state() gathers "
                             "the weights, called on every rank)",
                             name));
}

void raise_if_released(lua_State* L, torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(true))
    if (released(item.value())) raise_released(L, item.key());
}

// m:_named_tensors(kind) -> names, tensors (kind: "parameters" or "buffers"), recursive, in registration order.
int module_named_tensors(lua_State* L) {
  ModuleBox& box = check_module(L, 1);
  const std::string kind = check_string(L, 2);
  if (kind != "parameters" && kind != "buffers") luaL_argerror(L, 2, "'parameters' or 'buffers' expected");
  const auto items = kind == "parameters" ? box.module->named_parameters(true) : box.module->named_buffers(true);
  lua_createtable(L, static_cast<int>(items.size()), 0);
  lua_createtable(L, static_cast<int>(items.size()), 0);
  int i = 0;
  for (const auto& item : items) {
    ++i;
    lua_pushstring(L, item.key().c_str());
    lua_rawseti(L, -3, i);
    push_tensor(L, item.value());
    lua_rawseti(L, -2, i);
  }
  return 2;
}

int module_set_training(lua_State* L) {
  check_module(L, 1).module->train(opt_boolean(L, 2, true));
  lua_settop(L, 1);
  return 1;
}

int module_is_training(lua_State* L) {
  lua_pushboolean(L, check_module(L, 1).module->is_training());
  return 1;
}

// m:_set_matmul_precision("fp8" | "autocast") -> how many of its runner Linear layers were set (nn/linear.h).
int module_set_matmul_precision(lua_State* L) {
  const std::string name = luaL_checkstring(L, 2);
  if (name != "fp8" && name != "autocast")
    throw std::invalid_argument(fmt::format("matmul precision must be \"fp8\" or \"autocast\", got \"{}\"", name));
  const auto precision = name == "fp8" ? runner::nn::MatmulPrecision::fp8 : runner::nn::MatmulPrecision::autocast;
  lua_pushnumber(L, static_cast<lua_Number>(runner::nn::set_matmul_precision(*check_module(L, 1).module, precision)));
  return 1;
}

// m:_to(device_or_dtype ...): in place, parameters keep their identity.
int module_to(lua_State* L) {
  ModuleBox& box = check_module(L, 1);
  raise_if_released(L, *box.module);
  for (int i = 2; i <= lua_gettop(L); ++i) {
    const std::string name = check_string(L, i);
    try {
      box.module->to(core::parse_dtype(name));
    } catch (const std::invalid_argument&) {
      box.module->to(core::parse_device(name));
    }
  }
  lua_settop(L, 1);
  return 1;
}

int module_tostring(lua_State* L) {
  std::ostringstream text;
  check_module(L, 1).module->pretty_print(text);
  std::string description = text.str();
  if (description.rfind("torch::nn::", 0) == 0) description.erase(0, 11);
  lua_pushstring(L, description.c_str());
  return 1;
}

runner::nn::AutoencoderKLImpl& check_autoencoder(lua_State* L, int index) {
  ModuleBox& box = check_module(L, index);
  if (!box.autoencoder) raise_type_error(L, index, "AutoencoderKL");
  return *box.autoencoder;
}

// vae:encode(images) -> mean, logvar
int module_encode(lua_State* L) {
  auto [mean, logvar] = check_autoencoder(L, 1).encode(check_tensor(L, 2));
  push_tensor(L, mean);
  push_tensor(L, logvar);
  return 2;
}

// vae:decode(latents) -> images
int module_decode(lua_State* L) {
  push_tensor(L, check_autoencoder(L, 1).decode(check_tensor(L, 2)));
  return 1;
}

runner::nn::Denoiser& check_denoiser(lua_State* L, int index) {
  ModuleBox& box = check_module(L, index);
  if (!box.denoiser) raise_type_error(L, index, "UNet or DiT");
  return *box.denoiser;
}

// m:set_checkpointing(on): recompute each block's activations in backward instead of storing them.
int module_set_checkpointing(lua_State* L) {
  check_denoiser(L, 1).set_checkpointing(opt_boolean(L, 2, true));
  lua_settop(L, 1);
  return 1;
}

// vae:info() -> {in_channels, out_channels, latent_channels, downsample, scaling_factor [, shift_factor]}
int autoencoder_info(lua_State* L, const runner::nn::AutoencoderKLImpl& vae) {
  const AutoencoderKLOptions& o = vae.options();
  lua_createtable(L, 0, 6);
  const std::pair<const char*, std::int64_t> integers[] = {{"in_channels", o.in_channels},
                                                           {"out_channels", o.out_channels},
                                                           {"latent_channels", o.latent_channels},
                                                           {"downsample", vae.downsample()}};
  for (const auto& [key, value] : integers) {
    lua_pushnumber(L, static_cast<lua_Number>(value));
    lua_setfield(L, -2, key);
  }
  lua_pushnumber(L, o.scaling_factor);
  lua_setfield(L, -2, "scaling_factor");
  if (o.shift_factor) {
    lua_pushnumber(L, *o.shift_factor);
    lua_setfield(L, -2, "shift_factor");
  }
  return 1;
}

// m:info() -> {in_channels, out_channels, image, classes, class_dropout, null_label, learned_sigma, checkpointing}
int module_info(lua_State* L) {
  if (check_module(L, 1).autoencoder) return autoencoder_info(L, *check_module(L, 1).autoencoder);
  const auto& d = check_denoiser(L, 1);
  lua_createtable(L, 0, 8);
  auto set_integer = [&](const char* key, std::int64_t value) {
    lua_pushnumber(L, static_cast<lua_Number>(value));
    lua_setfield(L, -2, key);
  };
  set_integer("in_channels", d.in_channels());
  set_integer("out_channels", d.out_channels());
  set_integer("image", d.image_size());
  set_integer("classes", d.classes());
  lua_pushnumber(L, d.class_dropout());
  lua_setfield(L, -2, "class_dropout");
  if (d.has_null_label()) set_integer("null_label", d.classes());
  lua_pushboolean(L, d.out_channels() == 2 * d.in_channels());
  lua_setfield(L, -2, "learned_sigma");
  lua_pushboolean(L, d.checkpointing());
  lua_setfield(L, -2, "checkpointing");
  return 1;
}

int module_type_name(lua_State* L) {
  lua_pushstring(L, module_type_text(*check_module(L, 1).module).c_str());
  return 1;
}

int nn_is_native(lua_State* L) {
  lua_pushboolean(L, test_userdata<ModuleBox>(L, 1, kModuleType) != nullptr);
  return 1;
}

// getmetatable(m).__has_method(m, name): whether this module has the method (every built-in module shares one
// method table); the REPL completes and help lists only those it has.
int module_has_method(lua_State* L) {
  const ModuleBox& box = check_module(L, 1);
  const std::string name = check_string(L, 2);
  bool has = true;
  if (name == "forward")
    has = box.denoiser || (box.forward && !box.autoencoder);
  else if (name == "set_checkpointing")
    has = box.denoiser != nullptr;
  else if (name == "info")
    has = box.denoiser || box.autoencoder;
  else if (name == "encode" || name == "decode")
    has = box.autoencoder != nullptr;
  lua_pushboolean(L, has);
  return 1;
}

// nn._ema_update(ema_params, params, ema_buffers, buffers, decay): the trainer's EMA rule (train::ema_update)
// on two models' tensors, gathered in order by nn.ema_update.
int nn_ema_update(lua_State* L) {
  const double decay = luaL_checknumber(L, 5);
  try {
    train::ema_update(check_tensor_list(L, 1), check_tensor_list(L, 2), check_tensor_list(L, 3),
                      check_tensor_list(L, 4), decay);
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    throw std::invalid_argument("nn.ema_update: " + message.substr(message.rfind("ema: ", 0) == 0 ? 5 : 0));
  }
  return 0;
}

// The options of m:load_state_dict and m:load.
struct LoadStateOptions {
  bool strict = true;  // false: missing and unexpected keys are not errors
};
const OptionTable<LoadStateOptions> kLoadStateOptions("load_state_dict", "LoadStateOptions",
                                                      {option("strict", &LoadStateOptions::strict)});

struct ModuleLoadOptions {
  bool strict = true;
  std::optional<std::string> key;  // the entry of a file that holds several tables
};
const OptionTable<ModuleLoadOptions> kModuleLoadOptions("load", "ModuleLoadOptions",
                                                        {option("strict", &ModuleLoadOptions::strict),
                                                         option("key", &ModuleLoadOptions::key)});

// nn._load_options(options) -> {strict = bool} (for load_state_dict), key|nil
int nn_load_options(lua_State* L) {
  const ModuleLoadOptions o = kModuleLoadOptions.read(L, 1);
  lua_createtable(L, 0, 1);
  lua_pushboolean(L, o.strict);
  lua_setfield(L, -2, "strict");
  if (o.key)
    lua_pushlstring(L, o.key->data(), o.key->size());
  else
    lua_pushnil(L);
  return 2;
}

// nn._load_state(names, tensors, state, LoadStateOptions|nil): the module's tensors (by name, in order) filled
// from the state dict `state` by runner::nn::load_state, the one strict loader.
int nn_load_state(lua_State* L) {
  const LoadStateOptions o = kLoadStateOptions.read(L, 4);
  luaL_checktype(L, 1, LUA_TTABLE);
  const std::vector<at::Tensor> tensors = check_tensor_list(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  std::vector<ckpt::NamedTensor> targets;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    lua_rawgeti(L, 1, static_cast<int>(i + 1));
    targets.push_back({check_string(L, -1), tensors[i]});
    lua_pop(L, 1);
    if (released(tensors[i])) raise_released(L, targets.back().name);
  }
  std::vector<ckpt::NamedTensor> stored;
  lua_pushnil(L);
  while (lua_next(L, 3)) {
    lua_pushvalue(L, -2);
    const std::string name = lua_tostring(L, -1);
    lua_pop(L, 1);
    at::Tensor* tensor = test_tensor(L, -1);
    if (!tensor) raise_error(L, fmt::format("load_state_dict: {} is a {}, not a Tensor", name, luaL_typename(L, -1)));
    stored.push_back({name, *tensor});
    lua_pop(L, 1);
  }
  runner::nn::StateLoadOptions options;
  options.strict = o.strict;
  runner::nn::load_state(targets, stored, "load_state_dict", "", options);
  return 0;
}

}  // namespace

std::shared_ptr<runner::nn::Denoiser> test_denoiser(lua_State* L, int index) {
  ModuleBox* box = test_userdata<ModuleBox>(L, index, kModuleType);
  return box ? box->denoiser : nullptr;
}

void open_nn(lua_State* L) {
  new_metatable<ModuleBox>(L, kModuleType,
                           {
                               {"forward", wrap<module_forward>},
                               {"_named_tensors", wrap<module_named_tensors>},
                               {"_set_training", wrap<module_set_training>},
                               {"_is_training", wrap<module_is_training>},
                               {"_set_matmul_precision_native", wrap<module_set_matmul_precision>},
                               {"_to", wrap<module_to>},
                               {"type_name", wrap<module_type_name>},
                               {"set_checkpointing", wrap<module_set_checkpointing>},
                               {"info", wrap<module_info>},
                               {"encode", wrap<module_encode>},
                               {"decode", wrap<module_decode>},
                           });
  lua_pop(L, 1);
  luaL_getmetatable(L, kModuleType);
  lua_pushcfunction(L, wrap<module_has_method>);
  lua_setfield(L, -2, "__has_method");
  lua_pop(L, 1);
  luaL_getmetatable(L, kModuleType);
  set_functions(L, {{"__call", wrap<module_call>}, {"__tostring", wrap<module_tostring>}});
  lua_getfield(L, -1, "__index");  // the methods, kept as `methods` (the REPL completes from it) and __index's upvalue
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "methods");
  lua_pushcclosure(L, wrap<module_index>, 1);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);

  lua_newtable(L);  // nn
  set_functions(L, {
                       {"Linear", wrap<nn_linear>},
                       {"Conv2d", wrap<nn_conv2d>},
                       {"GroupNorm", wrap<nn_group_norm>},
                       {"LayerNorm", wrap<nn_layer_norm>},
                       {"Embedding", wrap<nn_embedding>},
                       {"Dropout", wrap<nn_dropout>},
                       {"GELU", wrap<nn_gelu>},
                       {"LeakyReLU", wrap<nn_leaky_relu>},
                       {"ReLU", wrap<simple_module<torch::nn::ReLU>>},
                       {"SiLU", wrap<simple_module<torch::nn::SiLU>>},
                       {"Tanh", wrap<simple_module<torch::nn::Tanh>>},
                       {"Sigmoid", wrap<simple_module<torch::nn::Sigmoid>>},
                       {"Mish", wrap<simple_module<torch::nn::Mish>>},
                       {"Identity", wrap<simple_module<torch::nn::Identity>>},
                       {"UNet", wrap<nn_unet>},
                       {"DiT", wrap<nn_dit>},
                       {"dit_size", wrap<nn_dit_size>},
                       {"_is_native", wrap<nn_is_native>},
                       {"_ema_update", wrap<nn_ema_update>},
                       {"_load_state", wrap<nn_load_state>},
                       {"_load_options", wrap<nn_load_options>},
                   });
  lua_newtable(L);  // nn.AutoencoderKL: callable, with .load
  set_functions(L, {{"load", wrap<nn_autoencoder_kl_load>}});
  lua_newtable(L);
  set_functions(L, {{"__call", wrap<nn_autoencoder_kl>}});
  lua_setmetatable(L, -2);
  lua_setfield(L, -2, "AutoencoderKL");
  push_nn_functional(L);
  lua_setfield(L, -2, "functional");
  luaL_getmetatable(L, kModuleType);
  lua_getfield(L, -1, "methods");
  lua_setfield(L, -3, "_native_methods");
  lua_pop(L, 1);
  lua_setglobal(L, "nn");
}

}  // namespace runner::bindings
