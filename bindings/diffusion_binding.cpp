// Gaussian diffusion in Lua: schedules, the training loss with keyed random streams, DDPM/DDIM sampling with
// classifier-free guidance (natives in runner._diffusion, wrapped by stdlib/runner/diffusion.lua).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <optional>

#include "bindings/bindings.h"
#include "bindings/diffusion_binding.h"
#include "bindings/data_binding.h"
#include "bindings/nn_binding.h"
#include "bindings/option_table.h"
#include "bindings/tensor_binding.h"
#include "bindings/train_binding.h"
#include "runtime/diffusion/diffusion_objective.h"
#include "runtime/diffusion/gaussian_diffusion.h"
#include "runtime/diffusion/noise_schedule.h"
#include "runtime/diffusion/sample_streams.h"
#include "runtime/diffusion/gaussian_sampler.h"

namespace runner::bindings {

namespace diff = runner::diffusion;

// A seed given as a Lua number: an integer in [0, 2^64). A process that never called torch.manual_seed has a random
// 64-bit default seed, which torch.initial_seed() (the default seed of diffusion.gaussian) returns rounded to a
// double; such values are taken as they are rather than refused by the 2^53 limit of check_integer.
std::uint64_t seed_value(double value) {
  if (!(value >= 0) || !(value < 18446744073709551616.0) || std::floor(value) != value) {
    throw std::invalid_argument(fmt::format("seed must be an integer in [0, 2^64), got {}", value));
  }
  return static_cast<std::uint64_t>(value);
}

std::uint64_t check_seed(lua_State* L, int index) { return seed_value(luaL_checknumber(L, index)); }

std::optional<at::Tensor> opt_tensor(lua_State* L, int index) {
  if (lua_isnoneornil(L, index)) return std::nullopt;
  return check_tensor(L, index);
}

// The model at `index` as a diffusion::ModelFunction: a built-in UNet/DiT is called directly; anything else
// (a Lua module or function) is called as model(x, t, labels) on this thread.
diff::ModelFunction model_function_at(lua_State* L, int index) {
  if (auto native = test_denoiser(L, index)) {
    return [native](const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) {
      return native->forward(x, t, labels);
    };
  }
  const int type = lua_type(L, index);
  if (type != LUA_TFUNCTION && type != LUA_TTABLE && type != LUA_TUSERDATA) raise_type_error(L, index, "model");
  const int model = index > 0 ? index : lua_gettop(L) + index + 1;
  return [L, model](const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) {
    lua_pushvalue(L, model);
    push_tensor(L, x);
    push_tensor(L, t);
    if (labels)
      push_tensor(L, *labels);
    else
      lua_pushnil(L);
    lua_call(L, 3, 1);
    at::Tensor* out = test_tensor(L, -1);
    if (out == nullptr) {
      const std::string got = luaL_typename(L, -1);
      lua_pop(L, 1);
      throw std::invalid_argument("the model returned " + got + ", expected a tensor");
    }
    at::Tensor result = *out;
    lua_pop(L, 1);
    return result;
  };
}

// What the model at `index` takes as labels: a built-in denoiser's, or the fields of the table `info` at
// info_index (model:info() of a Lua module); unknown (nullopt) for a plain function.
diff::ModelLabels denoiser_labels(const runner::nn::Denoiser& model) {
  diff::ModelLabels labels{model.classes(), model.class_dropout(), std::nullopt};
  if (model.has_null_label()) labels.null_label = model.classes();
  return labels;
}

namespace {

// The fields of the table `info` at info_index (model:info()); nullopt when it is not a table.
std::optional<diff::ModelLabels> info_labels(lua_State* L, int info_index) {
  if (!lua_istable(L, info_index)) return std::nullopt;
  diff::ModelLabels labels;
  lua_getfield(L, info_index, "classes");
  labels.classes = lua_isnumber(L, -1) ? static_cast<std::int64_t>(lua_tonumber(L, -1)) : 0;
  lua_getfield(L, info_index, "class_dropout");
  labels.class_dropout = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : 0.0;
  lua_getfield(L, info_index, "null_label");
  if (lua_isnumber(L, -1)) labels.null_label = static_cast<std::int64_t>(lua_tonumber(L, -1));
  lua_pop(L, 3);
  return labels;
}

}  // namespace

std::optional<diff::ModelLabels> model_labels(lua_State* L, int index, int info_index) {
  if (auto native = test_denoiser(L, index)) return denoiser_labels(*native);
  return info_labels(L, info_index);
}

ObjectiveModel objective_model(lua_State* L, int index, const char* loss_call) {
  std::shared_ptr<runner::nn::Denoiser> native = test_denoiser(L, index);
  if (!native) {
    throw std::invalid_argument(fmt::format(
        "objective: the model must be a built-in denoiser (nn.UNet, nn.DiT); for another model give the trainer a "
        "loss function: train:step(batch, function(micro) return {}(model, micro) end)",
        loss_call));
  }
  ObjectiveModel out;
  out.model = [native](const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) {
    return native->forward(x, t, labels);
  };
  out.labels = denoiser_labels(*native);
  out.capture_check = [native]() -> std::optional<std::string> {
    if (!native->checkpointing()) return std::nullopt;
    return "the model recomputes activations (checkpoint = true), whose random-state swaps a CUDA graph cannot hold";
  };
  return out;
}

diff::NoiseSource sample_noise(lua_State* L, int options_index, int seed_index, const at::Tensor& x_T) {
  lua_getfield(L, options_index, "noise");
  const std::optional<at::Tensor> given_noise = opt_tensor(L, -1);
  lua_pop(L, 1);
  if (given_noise) {
    const at::Tensor given = *given_noise;
    return [given](std::int64_t step, const at::Tensor& like) {
      if (given.dim() != like.dim() + 1 || step >= given.size(0) || given[step].sizes() != like.sizes()) {
        throw std::invalid_argument(fmt::format("sample: noise must be [steps, {}], got [{}]",
                                                fmt::join(like.sizes(), ", "), fmt::join(given.sizes(), ", ")));
      }
      return given[step].to(like.options());
    };
  }
  auto generator = at::globalContext().defaultGenerator(x_T.device()).clone();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(check_seed(L, seed_index) ^ 0x5a17c0de5a17c0deULL);
  }
  return
      [generator](std::int64_t, const at::Tensor& like) { return at::randn(like.sizes(), generator, like.options()); };
}

namespace {

constexpr const char* kDiffusionType = "runner.Diffusion";

struct DiffusionBox {
  diff::DiffusionTraining training;
  std::string schedule_kind;
};

DiffusionBox& check_diffusion(lua_State* L, int index) {
  return *check_userdata<DiffusionBox>(L, index, kDiffusionType, "Diffusion");
}

// The options of runner.diffusion.gaussian.
struct DiffusionOptions {
  diff::ScheduleOptions schedule;
  diff::LossOptions loss;
  diff::TimestepSampling timestep_sampling;
  std::optional<double> logit_mean;
  std::optional<double> logit_std;
  std::optional<std::uint64_t> seed;
};

const OptionTable<DiffusionOptions> kDiffusionOptions(
    "diffusion.gaussian", "DiffusionOptions",
    {
        option_with<DiffusionOptions>("schedule",
                                      [](lua_State* L, const char* key, DiffusionOptions& o) {
                                        read_option_value(L, key, o.schedule.kind);
                                      }),
        option_with<DiffusionOptions>("timesteps",
                                      [](lua_State* L, const char* key, DiffusionOptions& o) {
                                        read_option_value(L, key, o.schedule.timesteps);
                                      }),
        option_with<DiffusionOptions>("beta_start",
                                      [](lua_State* L, const char* key, DiffusionOptions& o) {
                                        read_option_value(L, key, o.schedule.beta_start);
                                      }),
        option_with<DiffusionOptions>("beta_end",
                                      [](lua_State* L, const char* key, DiffusionOptions& o) {
                                        read_option_value(L, key, o.schedule.beta_end);
                                      }),
        option_with<DiffusionOptions>("prediction",
                                      [](lua_State* L, const char* key, DiffusionOptions& o) {
                                        std::string name;
                                        read_option_value(L, key, name);
                                        o.loss.prediction = diff::parse_prediction(name);
                                      }),
        option_with<DiffusionOptions>("min_snr",
                                      [](lua_State* L, const char* key, DiffusionOptions& o) {
                                        read_option_value(L, key, o.loss.min_snr_gamma);
                                        if (*o.loss.min_snr_gamma <= 0) {
                                          throw std::invalid_argument(
                                              fmt::format("min_snr must be positive, got {}", *o.loss.min_snr_gamma));
                                        }
                                      }),
        option_with<DiffusionOptions>("timestep_sampling",
                                      [](lua_State* L, const char* key, DiffusionOptions& o) {
                                        std::string name;
                                        read_option_value(L, key, name);
                                        o.timestep_sampling.kind = diff::parse_timestep_sampling(name);
                                      }),
        option("logit_mean", &DiffusionOptions::logit_mean),
        option("logit_std", &DiffusionOptions::logit_std),
        option_with<DiffusionOptions>("seed",
                                      [](lua_State* L, const char* key, DiffusionOptions& o) {
                                        double value = 0;
                                        read_option_value(L, key, value);
                                        o.seed = seed_value(value);
                                      }),
    });

// runner._diffusion.new(options, default_seed): runner.diffusion.gaussian.
int diffusion_new(lua_State* L) {
  DiffusionOptions o = kDiffusionOptions.read(L, 1);
  o.timestep_sampling =
      diff::timestep_sampling_of(o.timestep_sampling.kind, o.logit_mean, o.logit_std, "timestep_sampling");
  const std::uint64_t seed = o.seed ? *o.seed : check_seed(L, 2);
  new_userdata<DiffusionBox>(
      L, kDiffusionType,
      DiffusionBox{diff::DiffusionTraining{diff::make_schedule(o.schedule), o.loss, o.timestep_sampling,
                                           std::make_shared<diff::SampleStreams>(seed)},
                   o.schedule.kind});
  return 1;
}

// d:loss's options: labels replace the batch's; label_dropout defaults to the model's class_dropout.
struct DiffusionLossOptions {
  std::optional<at::Tensor> labels;
  std::optional<double> label_dropout;
};
const OptionTable<DiffusionLossOptions> kDiffusionLossOptions(
    "loss", "DiffusionLossOptions",
    {
        option_with<DiffusionLossOptions>("labels",
                                          [](lua_State* L, const char*, DiffusionLossOptions& o) {
                                            o.labels = check_tensor(L, lua_gettop(L));
                                          }),
        option("label_dropout", &DiffusionLossOptions::label_dropout),
    });

// d:objective's options.
struct ObjectiveOptions {
  std::optional<double> label_dropout;  // default: the model's class_dropout
};
const OptionTable<ObjectiveOptions> kObjectiveOptions("objective", "ObjectiveOptions",
                                                      {option("label_dropout", &ObjectiveOptions::label_dropout)});

// d:_loss(model, x0, batch labels|nil, epoch|nil, indices|nil, DiffusionLossOptions|nil, model info|nil)
// -> loss, t, mse, vb. d:loss's label rules, then the keyed draws: keys from (epoch, indices) for loader batches,
// else the next running keys.
int diffusion_loss(lua_State* L) {
  DiffusionBox& box = check_diffusion(L, 1);
  const DiffusionLossOptions o = kDiffusionLossOptions.read(L, 7);
  const diff::ModelFunction model = model_function_at(L, 2);
  const at::Tensor& x0 = check_tensor(L, 3);
  const diff::TrainingLabels labels =
      diff::training_labels(model_labels(L, 2, 8), opt_tensor(L, 4), o.labels, o.label_dropout, x0.device());
  std::optional<at::Tensor> indices = opt_tensor(L, 6);
  std::optional<std::int64_t> epoch;
  if (!lua_isnoneornil(L, 5)) epoch = runtime_epoch(static_cast<lua_Number>(check_integer(L, 5)));
  const auto keyed = diff::keyed_training_loss(box.training, model, x0, labels, indices ? &*indices : nullptr, epoch);
  push_tensor(L, keyed.terms.loss);
  push_tensor(L, keyed.t);
  push_tensor(L, keyed.terms.mse);
  if (keyed.terms.vb.defined())
    push_tensor(L, keyed.terms.vb);
  else
    lua_pushnil(L);
  return 4;
}

// d:_objective(model, ObjectiveOptions|nil) -> Objective: the loss of a built-in denoiser on loader batches, for
// runner.trainer { objective = ... }.
int diffusion_objective(lua_State* L) {
  DiffusionBox& box = check_diffusion(L, 1);
  const ObjectiveOptions o = kObjectiveOptions.read(L, 3);
  ObjectiveModel native = objective_model(L, 2, "d:loss");
  push_objective(L, std::make_shared<diff::DiffusionObjective>(box.training, native.model, native.labels,
                                                               o.label_dropout, native.capture_check));
  return 1;
}

// d:training_loss(model, x0, t, noise [, labels]) -> loss, mse, vb: the loss for given timesteps and noise.
int diffusion_training_loss(lua_State* L) {
  DiffusionBox& box = check_diffusion(L, 1);
  const auto terms = diff::training_loss(box.training.schedule, model_function_at(L, 2), check_tensor(L, 3),
                                         check_tensor(L, 4), check_tensor(L, 5), opt_tensor(L, 6), box.training.loss);
  push_tensor(L, terms.loss);
  push_tensor(L, terms.mse);
  if (terms.vb.defined())
    push_tensor(L, terms.vb);
  else
    lua_pushnil(L);
  return 3;
}

// d:q_sample(x0, t, noise) -> x_t
int diffusion_q_sample(lua_State* L) {
  DiffusionBox& box = check_diffusion(L, 1);
  push_tensor(L, diff::q_sample(box.training.schedule, check_tensor(L, 2), check_tensor(L, 3), check_tensor(L, 4)));
  return 1;
}

// The options of d:sample: n, labels, seed, x_T, noise and device are read by stdlib/runner/diffusion.lua
// (noise also here).
const OptionTable<diff::SampleOptions> kSampleOptions("sample", "SampleOptions",
                                                      {
                                                          lua_option<diff::SampleOptions>("n"),
                                                          lua_option<diff::SampleOptions>("labels"),
                                                          option("steps", &diff::SampleOptions::steps),
                                                          option("sampler", &diff::SampleOptions::sampler),
                                                          option("eta", &diff::SampleOptions::eta),
                                                          option("guidance", &diff::SampleOptions::guidance),
                                                          option("variance", &diff::SampleOptions::variance),
                                                          option("clip", &diff::SampleOptions::clip),
                                                          lua_option<diff::SampleOptions>("seed"),
                                                          lua_option<diff::SampleOptions>("shape"),
                                                          lua_option<diff::SampleOptions>("x_T"),
                                                          lua_option<diff::SampleOptions>("noise"),
                                                          option("trajectory", &diff::SampleOptions::keep_trajectory),
                                                          lua_option<diff::SampleOptions>("device"),
                                                          option("null_label", &diff::SampleOptions::null_label),
                                                          option("autocast", &diff::SampleOptions::autocast),
                                                      });

// d:_sample(model, x_T, labels|nil, options, seed, null_label|nil) -> x [, trajectory]
// options.noise: a tensor [steps, B, ...] of per-step noise; without it, noise comes from a generator seeded
// with seed. null_label: the model's, used when the options give none.
int diffusion_sample(lua_State* L) {
  DiffusionBox& box = check_diffusion(L, 1);
  const diff::ModelFunction model = model_function_at(L, 2);
  const at::Tensor x_T = check_tensor(L, 3);
  const std::optional<at::Tensor> labels = opt_tensor(L, 4);
  diff::SampleOptions defaults;
  defaults.steps = std::min<std::int64_t>(defaults.steps, box.training.schedule.timesteps());
  if (const auto native = test_denoiser(L, 2)) defaults.clip = native->pixel_space();
  if (!lua_isnoneornil(L, 7)) defaults.null_label = check_integer(L, 7);
  diff::SampleOptions o = kSampleOptions.read(L, 5, defaults);
  o.prediction = box.training.loss.prediction;
  const diff::NoiseSource noise = sample_noise(L, 5, 6, x_T);
  const auto result = diff::sample(box.training.schedule, model, x_T, labels, o, noise);
  push_tensor(L, result.x);
  if (!o.keep_trajectory) return 1;
  push_tensor(L, at::stack(result.trajectory));
  return 2;
}

// runner._diffusion.labels_problem(info, labels_given, guidance|nil, what) -> message|nil: the label rules of
// sampling and the likelihood (diffusion::sampling_labels_problem) for a model whose info() is the table `info`.
int diffusion_labels_problem(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  const std::optional<diff::ModelLabels> labels = info_labels(L, 1);
  const std::optional<double> guidance =
      lua_isnoneornil(L, 3) ? std::nullopt : std::optional<double>(luaL_checknumber(L, 3));
  const auto problem = diff::sampling_labels_problem(*labels, lua_toboolean(L, 2) != 0, guidance, check_string(L, 4));
  if (problem)
    lua_pushstring(L, problem->c_str());
  else
    lua_pushnil(L);
  return 1;
}

// runner._diffusion.initial_noise(shape, seed, device) -> x_T: the sampler's starting noise for a seed.
int diffusion_initial_noise(lua_State* L) {
  int next = 1;
  const auto shape = check_sizes(L, 1, &next);
  const std::uint64_t seed = check_seed(L, next);
  const auto device = c10::Device(check_string(L, next + 1));
  auto generator = at::globalContext().defaultGenerator(device).clone();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(seed);
  }
  push_tensor(L, at::randn(shape, generator, at::TensorOptions().device(device)));
  return 1;
}

// d:schedule() -> {betas =, alphas_cumprod =, ...} float64 tensors [T]
int diffusion_schedule(lua_State* L) {
  const diff::NoiseSchedule& s = check_diffusion(L, 1).training.schedule;
  lua_createtable(L, 0, 8);
  const std::pair<const char*, const at::Tensor*> fields[] = {
      {"betas", &s.betas},
      {"alphas_cumprod", &s.alphas_cumprod},
      {"alphas_cumprod_prev", &s.alphas_cumprod_prev},
      {"posterior_variance", &s.posterior_variance},
      {"posterior_log_variance_clipped", &s.posterior_log_variance_clipped},
      {"posterior_mean_coef1", &s.posterior_mean_coef1},
      {"posterior_mean_coef2", &s.posterior_mean_coef2},
  };
  for (const auto& [name, tensor] : fields) {
    push_tensor(L, *tensor);
    lua_setfield(L, -2, name);
  }
  return 1;
}

int diffusion_info(lua_State* L) {
  const DiffusionBox& box = check_diffusion(L, 1);
  lua_createtable(L, 0, 5);
  lua_pushnumber(L, static_cast<lua_Number>(box.training.schedule.timesteps()));
  lua_setfield(L, -2, "timesteps");
  lua_pushstring(L, box.schedule_kind.c_str());
  lua_setfield(L, -2, "schedule");
  lua_pushstring(L, diff::prediction_name(box.training.loss.prediction).c_str());
  lua_setfield(L, -2, "prediction");
  if (box.training.loss.min_snr_gamma) {
    lua_pushnumber(L, *box.training.loss.min_snr_gamma);
    lua_setfield(L, -2, "min_snr");
  }
  lua_pushstring(L, diff::timestep_sampling_name(box.training.timestep_sampling.kind).c_str());
  lua_setfield(L, -2, "timestep_sampling");
  if (box.training.timestep_sampling.kind == diff::TimestepSampling::Kind::logit_normal) {
    lua_pushnumber(L, box.training.timestep_sampling.logit_mean);
    lua_setfield(L, -2, "logit_mean");
    lua_pushnumber(L, box.training.timestep_sampling.logit_std);
    lua_setfield(L, -2, "logit_std");
  }
  lua_pushnumber(L, static_cast<lua_Number>(box.training.streams->seed()));
  lua_setfield(L, -2, "seed");
  return 1;
}

// d:stream_counter([value]) -> the running key counter (part of a resumable state)
int diffusion_stream_counter(lua_State* L) {
  DiffusionBox& box = check_diffusion(L, 1);
  if (!lua_isnoneornil(L, 2)) box.training.streams->set_counter(check_integer(L, 2));
  lua_pushnumber(L, static_cast<lua_Number>(box.training.streams->counter()));
  return 1;
}

// runner._diffusion.sampling_timesteps(T, steps) -> list of timesteps (descending)
int diffusion_sampling_timesteps(lua_State* L) {
  const auto steps = diff::sampling_timesteps(check_integer(L, 1), check_integer(L, 2));
  lua_createtable(L, static_cast<int>(steps.size()), 0);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    lua_pushnumber(L, static_cast<lua_Number>(steps[i]));
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

}  // namespace

void open_diffusion(lua_State* L) {
  new_metatable<DiffusionBox>(L, kDiffusionType,
                              {{"_loss", wrap<diffusion_loss>},
                               {"_objective", wrap<diffusion_objective>},
                               {"training_loss", wrap<diffusion_training_loss>},
                               {"q_sample", wrap<diffusion_q_sample>},
                               {"_sample", wrap<diffusion_sample>},
                               {"schedule", wrap<diffusion_schedule>},
                               {"_info", wrap<diffusion_info>},
                               {"stream_counter", wrap<diffusion_stream_counter>}});
  lua_pop(L, 1);
  lua_getglobal(L, "runner");
  lua_newtable(L);
  set_functions(L, {{"new", wrap<diffusion_new>},
                    {"initial_noise", wrap<diffusion_initial_noise>},
                    {"labels_problem", wrap<diffusion_labels_problem>},
                    {"sampling_timesteps", wrap<diffusion_sampling_timesteps>}});
  lua_pushinteger(L, diff::kSampleStreamsGenerator);
  lua_setfield(L, -2, "stream_generator");
  luaL_getmetatable(L, kDiffusionType);
  lua_getfield(L, -1, "__index");
  lua_setfield(L, -3, "methods");
  lua_pop(L, 1);
  add_flow(L);
  lua_setfield(L, -2, "_diffusion");
  lua_pop(L, 1);
}

}  // namespace runner::bindings
