// Flow matching in Lua: runner.diffusion.flow's natives (the flow, its loss with keyed draws, the trainer
// objective and the ODE/SDE samplers), wrapped by stdlib/runner/diffusion.lua.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <optional>

#include "bindings/data_binding.h"
#include "bindings/diffusion_binding.h"
#include "bindings/nn_binding.h"
#include "bindings/option_table.h"
#include "bindings/tensor_binding.h"
#include "bindings/train_binding.h"
#include "runtime/diffusion/flow.h"
#include "runtime/diffusion/flow_sampler.h"

namespace runner::bindings {
namespace {

namespace diff = runner::diffusion;

constexpr const char* kFlowType = "runner.Flow";

diff::FlowTraining& check_flow(lua_State* L, int index) {
  return *check_userdata<diff::FlowTraining>(L, index, kFlowType, "Flow");
}

template <class Parse>
auto named_choice(lua_State* L, const char* key, Parse parse) {
  std::string name;
  read_option_value(L, key, name);
  return parse(name);
}

// The options of runner.diffusion.flow.
struct FlowOptions {
  diff::FlowOptions flow;
  diff::TimestepSampling time;
  std::optional<double> logit_mean;
  std::optional<double> logit_std;
  std::optional<std::uint64_t> seed;
};

const OptionTable<FlowOptions> kFlowOptions(
    "diffusion.flow", "FlowOptions",
    {
        option_with<FlowOptions>("path",
                                 [](lua_State* L, const char* key, FlowOptions& o) {
                                   o.flow.path = named_choice(L, key, diff::parse_interpolant_path);
                                 }),
        option_with<FlowOptions>("prediction",
                                 [](lua_State* L, const char* key, FlowOptions& o) {
                                   o.flow.prediction = named_choice(L, key, diff::parse_flow_prediction);
                                 }),
        option_with<FlowOptions>("loss_weight",
                                 [](lua_State* L, const char* key, FlowOptions& o) {
                                   o.flow.loss_weight = named_choice(L, key, diff::parse_flow_loss_weight);
                                 }),
        option_with<FlowOptions>("time",
                                 [](lua_State* L, const char* key, FlowOptions& o) {
                                   std::string name;
                                   read_option_value(L, key, name);
                                   o.time.kind = diff::parse_timestep_sampling(name, "time");
                                 }),
        option("logit_mean", &FlowOptions::logit_mean),
        option("logit_std", &FlowOptions::logit_std),
        option_with<FlowOptions>("train_eps", [](lua_State* L, const char* key,
                                                 FlowOptions& o) { read_option_value(L, key, o.flow.train_eps); }),
        option_with<FlowOptions>("sample_eps", [](lua_State* L, const char* key,
                                                  FlowOptions& o) { read_option_value(L, key, o.flow.sample_eps); }),
        option_with<FlowOptions>("seed",
                                 [](lua_State* L, const char* key, FlowOptions& o) {
                                   double value = 0;
                                   read_option_value(L, key, value);
                                   o.seed = seed_value(value);
                                 }),
    });

// runner._diffusion.new_flow(options, default_seed): runner.diffusion.flow.
int flow_new(lua_State* L) {
  FlowOptions o = kFlowOptions.read(L, 1);
  o.time = diff::timestep_sampling_of(o.time.kind, o.logit_mean, o.logit_std, "time");
  const std::uint64_t seed = o.seed ? *o.seed : check_seed(L, 2);
  new_userdata<diff::FlowTraining>(
      L, kFlowType, diff::FlowTraining{diff::Flow(o.flow), o.time, std::make_shared<diff::SampleStreams>(seed)});
  return 1;
}

// flow:loss's options: labels replace the batch's; label_dropout defaults to the model's class_dropout.
struct FlowLossOptions {
  std::optional<at::Tensor> labels;
  std::optional<double> label_dropout;
};
const OptionTable<FlowLossOptions> kFlowLossOptions(
    "loss", "FlowLossOptions",
    {
        option_with<FlowLossOptions>("labels", [](lua_State* L, const char*,
                                                  FlowLossOptions& o) { o.labels = check_tensor(L, lua_gettop(L)); }),
        option("label_dropout", &FlowLossOptions::label_dropout),
    });

// flow:_loss(model, x1, batch labels|nil, epoch|nil, indices|nil, FlowLossOptions|nil, model info|nil)
// -> loss, t, mse: d:loss's label rules and keys, then the flow loss.
int flow_loss(lua_State* L) {
  diff::FlowTraining& flow = check_flow(L, 1);
  const FlowLossOptions o = kFlowLossOptions.read(L, 7);
  const diff::ModelFunction model = model_function_at(L, 2);
  const at::Tensor& x1 = check_tensor(L, 3);
  if (x1.dim() < 2)
    throw std::invalid_argument(fmt::format("loss: x1 must be a batch [B, C, ...], got {} dimensions", x1.dim()));
  const diff::TrainingLabels labels =
      diff::training_labels(model_labels(L, 2, 8), opt_tensor(L, 4), o.labels, o.label_dropout, x1.device());
  std::optional<at::Tensor> indices = opt_tensor(L, 6);
  std::optional<std::int64_t> epoch;
  if (!lua_isnoneornil(L, 5)) epoch = runtime_epoch(static_cast<lua_Number>(check_integer(L, 5)));
  const at::Tensor keys = diff::training_keys(*flow.streams, x1.size(0), indices ? &*indices : nullptr, epoch);
  const auto keyed = diff::keyed_flow_loss(flow, model, x1, labels, keys);
  push_tensor(L, keyed.terms.loss);
  push_tensor(L, keyed.t);
  push_tensor(L, keyed.terms.mse);
  return 3;
}

struct FlowObjectiveOptions {
  std::optional<double> label_dropout;  // default: the model's class_dropout
};
const OptionTable<FlowObjectiveOptions> kFlowObjectiveOptions("objective", "FlowObjectiveOptions",
                                                              {option("label_dropout",
                                                                      &FlowObjectiveOptions::label_dropout)});

// flow:_objective(model, FlowObjectiveOptions|nil) -> Objective
int flow_objective(lua_State* L) {
  diff::FlowTraining& flow = check_flow(L, 1);
  const FlowObjectiveOptions o = kFlowObjectiveOptions.read(L, 3);
  ObjectiveModel native = objective_model(L, 2, "flow:loss");
  push_objective(L, std::make_shared<diff::FlowObjective>(flow, native.model, native.labels, o.label_dropout,
                                                          native.capture_check));
  return 1;
}

// flow:training_loss(model, x1, t, noise [, labels]) -> loss, mse: the loss at given times and noise.
int flow_training_loss(lua_State* L) {
  diff::FlowTraining& flow = check_flow(L, 1);
  const at::Tensor t = check_tensor(L, 4);
  if (t.numel() > 0 && at::isFloatingType(t.scalar_type())) {
    const at::Tensor outside = t.lt(0).logical_or(t.gt(1)).logical_or(t.isnan());
    if (outside.any().item<bool>())
      throw std::invalid_argument(fmt::format("training_loss: t must hold times in [0, 1] (0 noise, 1 data), got {}",
                                              t.masked_select(outside)[0].item<double>()));
  }
  const auto terms = diff::flow_training_loss(flow.flow, model_function_at(L, 2), check_tensor(L, 3), t,
                                              check_tensor(L, 5), opt_tensor(L, 6));
  push_tensor(L, terms.loss);
  push_tensor(L, terms.mse);
  return 2;
}

// flow:path(t) -> {alpha, d_alpha, sigma, d_sigma} float64 tensors shaped like t.
int flow_path(lua_State* L) {
  const diff::PathCoefficients c = check_flow(L, 1).flow.coefficients(check_tensor(L, 2));
  lua_createtable(L, 0, 4);
  for (const auto& [name, tensor] : {std::pair{"alpha", &c.alpha}, std::pair{"d_alpha", &c.d_alpha},
                                     std::pair{"sigma", &c.sigma}, std::pair{"d_sigma", &c.d_sigma}}) {
    push_tensor(L, *tensor);
    lua_setfield(L, -2, name);
  }
  return 1;
}

// The options of flow:sample: n, labels, seed, shape, x_T, noise and device are read by stdlib/runner/diffusion.lua
// (noise also here).
const OptionTable<diff::FlowSampleOptions> kFlowSampleOptions(
    "sample", "FlowSampleOptions",
    {
        lua_option<diff::FlowSampleOptions>("n"),
        lua_option<diff::FlowSampleOptions>("labels"),
        option("steps", &diff::FlowSampleOptions::steps),
        option_with<diff::FlowSampleOptions>("sampler",
                                             [](lua_State* L, const char* key, diff::FlowSampleOptions& o) {
                                               o.sampler = named_choice(L, key, diff::parse_integrator);
                                             }),
        option("sde", &diff::FlowSampleOptions::sde),
        option("reverse", &diff::FlowSampleOptions::reverse),
        option_with<diff::FlowSampleOptions>("diffusion_form",
                                             [](lua_State* L, const char* key, diff::FlowSampleOptions& o) {
                                               o.diffusion_form = named_choice(L, key, diff::parse_diffusion_form);
                                             }),
        option("diffusion_norm", &diff::FlowSampleOptions::diffusion_norm),
        option_with<diff::FlowSampleOptions>("last_step",
                                             [](lua_State* L, const char* key, diff::FlowSampleOptions& o) {
                                               o.last_step = named_choice(L, key, diff::parse_last_step);
                                             }),
        option("last_step_size", &diff::FlowSampleOptions::last_step_size),
        option("rtol", &diff::FlowSampleOptions::rtol),
        option("atol", &diff::FlowSampleOptions::atol),
        option("guidance", &diff::FlowSampleOptions::guidance),
        option("guidance_channels", &diff::FlowSampleOptions::guidance_channels),
        lua_option<diff::FlowSampleOptions>("seed"),
        lua_option<diff::FlowSampleOptions>("shape"),
        lua_option<diff::FlowSampleOptions>("x_T"),
        lua_option<diff::FlowSampleOptions>("noise"),
        option("trajectory", &diff::FlowSampleOptions::keep_trajectory),
        lua_option<diff::FlowSampleOptions>("device"),
        option("null_label", &diff::FlowSampleOptions::null_label),
        option("autocast", &diff::FlowSampleOptions::autocast),
    });

// flow:_sample(model, x_T, labels|nil, options, seed, null_label|nil) -> x [, trajectory]
int flow_sample(lua_State* L) {
  diff::FlowTraining& flow = check_flow(L, 1);
  const diff::ModelFunction model = model_function_at(L, 2);
  const at::Tensor x_T = check_tensor(L, 3);
  const std::optional<at::Tensor> labels = opt_tensor(L, 4);
  diff::FlowSampleOptions defaults;
  if (!lua_isnoneornil(L, 7)) defaults.null_label = check_integer(L, 7);
  const diff::FlowSampleOptions o = kFlowSampleOptions.read(L, 5, defaults);
  const auto result = diff::sample_flow(flow.flow, model, x_T, labels, o, sample_noise(L, 5, 6, x_T));
  push_tensor(L, result.x);
  if (!o.keep_trajectory) return 1;
  push_tensor(L, at::stack(result.trajectory));
  return 2;
}

const OptionTable<diff::FlowLikelihoodOptions> kFlowLikelihoodOptions(
    "likelihood", "FlowLikelihoodOptions",
    {
        lua_option<diff::FlowLikelihoodOptions>("labels"),
        option("steps", &diff::FlowLikelihoodOptions::steps),
        option_with<diff::FlowLikelihoodOptions>("sampler",
                                                 [](lua_State* L, const char* key, diff::FlowLikelihoodOptions& o) {
                                                   o.sampler = named_choice(L, key, diff::parse_integrator);
                                                 }),
        option("rtol", &diff::FlowLikelihoodOptions::rtol),
        option("atol", &diff::FlowLikelihoodOptions::atol),
        lua_option<diff::FlowLikelihoodOptions>("seed"),
        lua_option<diff::FlowLikelihoodOptions>("probes"),
        option("autocast", &diff::FlowLikelihoodOptions::autocast),
    });

// flow:_likelihood(model, x, labels|nil, options, seed) -> logp, z. options.probes: the Rademacher probes
// [evaluations, B, ...] of the model evaluations in order; without it they come from a generator seeded with seed.
int flow_likelihood(lua_State* L) {
  diff::FlowTraining& flow = check_flow(L, 1);
  const diff::ModelFunction model = model_function_at(L, 2);
  const at::Tensor x = check_tensor(L, 3);
  const std::optional<at::Tensor> labels = opt_tensor(L, 4);
  const diff::FlowLikelihoodOptions o = kFlowLikelihoodOptions.read(L, 5);
  lua_getfield(L, 5, "probes");
  const std::optional<at::Tensor> given = opt_tensor(L, -1);
  lua_pop(L, 1);
  const diff::NoiseSource probes = diff::likelihood_probes(given, check_seed(L, 6), x.device());
  const auto result = diff::flow_likelihood(flow.flow, model, x, labels, o, probes);
  push_tensor(L, result.logp);
  push_tensor(L, result.z);
  return 2;
}

int flow_info(lua_State* L) {
  const diff::FlowTraining& flow = check_flow(L, 1);
  const diff::FlowOptions& o = flow.flow.options();
  lua_createtable(L, 0, 9);
  const std::pair<const char*, std::string> names[] = {
      {"objective", "flow"},
      {"path", diff::interpolant_path_name(o.path)},
      {"prediction", diff::flow_prediction_name(o.prediction)},
      {"loss_weight", diff::flow_loss_weight_name(o.loss_weight)},
      {"time", diff::timestep_sampling_name(flow.time.kind)},
  };
  for (const auto& [key, value] : names) {
    lua_pushstring(L, value.c_str());
    lua_setfield(L, -2, key);
  }
  if (flow.time.kind == diff::TimestepSampling::Kind::logit_normal) {
    lua_pushnumber(L, flow.time.logit_mean);
    lua_setfield(L, -2, "logit_mean");
    lua_pushnumber(L, flow.time.logit_std);
    lua_setfield(L, -2, "logit_std");
  }
  lua_pushnumber(L, flow.flow.train_eps());
  lua_setfield(L, -2, "train_eps");
  lua_pushnumber(L, flow.flow.sample_eps());
  lua_setfield(L, -2, "sample_eps");
  lua_pushnumber(L, static_cast<lua_Number>(flow.streams->seed()));
  lua_setfield(L, -2, "seed");
  return 1;
}

// flow:stream_counter([value]) -> the running key counter (part of a resumable state)
int flow_stream_counter(lua_State* L) {
  diff::FlowTraining& flow = check_flow(L, 1);
  if (!lua_isnoneornil(L, 2)) flow.streams->set_counter(check_integer(L, 2));
  lua_pushnumber(L, static_cast<lua_Number>(flow.streams->counter()));
  return 1;
}

}  // namespace

void add_flow(lua_State* L) {
  new_metatable<diff::FlowTraining>(L, kFlowType,
                                    {{"_loss", wrap<flow_loss>},
                                     {"_objective", wrap<flow_objective>},
                                     {"training_loss", wrap<flow_training_loss>},
                                     {"path", wrap<flow_path>},
                                     {"_sample", wrap<flow_sample>},
                                     {"_likelihood", wrap<flow_likelihood>},
                                     {"_info", wrap<flow_info>},
                                     {"stream_counter", wrap<flow_stream_counter>}});
  lua_setfield(L, -2, "flow_methods");
  lua_pushcfunction(L, wrap<flow_new>);
  lua_setfield(L, -2, "new_flow");
}

}  // namespace runner::bindings
