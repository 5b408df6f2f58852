// Tensors in Lua: the userdata type, argument conversions shared by every binding that takes tensors,
// and the `torch` namespace (constructors, autograd, seeding, safetensors).
//
// Positions written as Lua numbers are 1-based: dims, indices, slices (negatives count from the end).
// Tensor contents are never shifted: argmax results, class targets, embedding ids stay 0-based as in
// PyTorch, so data files and checkpoints mean the same in both.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/TensorOptions.h>
#include <cstdint>
#include <optional>
#include <vector>

#include "bindings/binding.h"

namespace runner::bindings {

inline constexpr const char* kTensorType = "runner.Tensor";

void push_tensor(lua_State* L, at::Tensor tensor);
// The tensor at `index`; raises a Lua error for a parameter that sharding over the weights released between steps
// (no values behind its shape). check_tensor_handle gives it anyway: for what such a parameter still has (its shape,
// dtype, device, gradient).
at::Tensor& check_tensor(lua_State* L, int index);
at::Tensor& check_tensor_handle(lua_State* L, int index);
at::Tensor* test_tensor(lua_State* L, int index);  // nullptr when not a tensor

// A Lua number as a Scalar: integer-valued numbers become integer scalars, so `int_tensor + 1` stays
// integral while `int_tensor * 0.5` promotes, as in Python. Booleans become boolean scalars.
at::Scalar check_scalar(lua_State* L, int index);
// A tensor argument, or a number/boolean as a wrapped-number tensor on `device` (which takes part in
// type promotion the way a Python scalar does).
at::Tensor check_operand(lua_State* L, int index, const c10::Device& device);

// A tensor's sizes as a Lua array that prints as [2, 3] (t.shape, t:size()).
void push_sizes(lua_State* L, at::IntArrayRef sizes);
// Sizes: numbers from `first` on, or one table of numbers. *next is set to the index after them.
std::vector<std::int64_t> check_sizes(lua_State* L, int first, int* next);
// A 1-based dim (negatives from the end) of a tensor with `ndim` dims, as a 0-based dim.
std::int64_t check_dim(lua_State* L, int index, std::int64_t ndim);
std::int64_t opt_dim(lua_State* L, int index, std::int64_t ndim, std::int64_t fallback);
// One dim or a table of dims; nullopt when absent.
std::optional<std::vector<std::int64_t>> opt_dims(lua_State* L, int index, std::int64_t ndim);
// The options of the tensor factories (---@class TensorOptions): {dtype = "float32", device = "cuda",
// requires_grad = true}; unset dtype and device are the factory's default (float32, or the like-tensor's).
struct TensorFactoryOptions {
  std::optional<at::ScalarType> dtype;
  std::optional<c10::Device> device;
  bool requires_grad = false;  // ATen factories ignore requires_grad in at::TensorOptions: set after creation

  // float32 on the CPU unless given.
  at::TensorOptions tensor_options() const;
};
TensorFactoryOptions check_tensor_options(lua_State* L, int index, const char* function);
std::vector<at::Tensor> check_tensor_list(lua_State* L, int index);
void push_tensor_list(lua_State* L, const std::vector<at::Tensor>& tensors);

// Bytes held by tensors that Lua owns (storage size, counted once per userdata).
std::int64_t lua_held_tensor_bytes();

void open_tensor(lua_State* L);
void open_tensor_ops(lua_State* L);   // tensor_ops_binding.cpp: math, reductions, shapes
void open_safetensors(lua_State* L);  // safetensors_binding.cpp: torch.save / torch.load

}  // namespace runner::bindings
