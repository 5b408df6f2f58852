// What the flow binding shares with the diffusion binding: models as model functions, their labels, seeds, the
// sampler's noise, and the registration of runner.diffusion.flow's natives.
#pragma once

#include <ATen/core/Tensor.h>
#include <lua.hpp>

#include <cstdint>
#include <optional>

#include "runtime/diffusion/diffusion_objective.h"
#include "runtime/diffusion/gaussian_diffusion.h"
#include "runtime/diffusion/gaussian_sampler.h"
#include "runtime/nn/denoiser.h"

namespace runner::bindings {

// A seed given as a Lua number: an integer in [0, 2^64) (see diffusion_binding.cpp).
std::uint64_t seed_value(double value);
std::uint64_t check_seed(lua_State* L, int index);
std::optional<at::Tensor> opt_tensor(lua_State* L, int index);

// The model at `index` as a diffusion::ModelFunction: a built-in UNet/DiT is called directly; anything else (a Lua
// module or function) is called as model(x, t, labels) on this thread.
diffusion::ModelFunction model_function_at(lua_State* L, int index);
// What the model at `index` takes as labels: a built-in denoiser's, or the fields of the table model:info() at
// info_index; unknown (nullopt) for a plain function.
std::optional<diffusion::ModelLabels> model_labels(lua_State* L, int index, int info_index);
diffusion::ModelLabels denoiser_labels(const runner::nn::Denoiser& model);
// A built-in denoiser at `index` as the model of a trainer objective with its capture check; raises the message
// `objective:` names for anything else.
struct ObjectiveModel {
  diffusion::ModelFunction model;
  diffusion::ModelLabels labels;
  diffusion::CaptureCheck capture_check;
};
ObjectiveModel objective_model(lua_State* L, int index, const char* loss_call);

// The sampler's step noise: options.noise (a tensor [steps, B, ...]) of the options table at `options_index`, else a
// generator seeded from the seed at `seed_index`.
diffusion::NoiseSource sample_noise(lua_State* L, int options_index, int seed_index, const at::Tensor& x_T);

// Adds runner.diffusion.flow's natives (new_flow, flow_methods) to the table at the top of the stack
// (flow_binding.cpp).
void add_flow(lua_State* L);

}  // namespace runner::bindings
