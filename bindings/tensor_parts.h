// The parts of the Tensor binding, each in its own file; open_tensor (tensor_binding.cpp) registers them. Each
// add_* sets its functions in the table on the top of the Lua stack.
#pragma once

#include <optional>
#include <string>

#include "bindings/binding.h"
#include "bindings/option_table.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"

namespace runner::bindings {

void add_tensor_constructors(lua_State* L);  // torch: zeros ... full_like, tensor (tensor_construction_binding.cpp)
int tensor_index(lua_State* L);              // Tensor __index, upvalue 1 the methods (tensor_indexing_binding.cpp)
int tensor_newindex(lua_State* L);           // Tensor __newindex (tensor_indexing_binding.cpp)
void add_tensor_metamethods(lua_State* L);  // the metatable: arithmetic ... __tostring (tensor_metamethods_binding.cpp)
void add_tensor_conversions(
    lua_State* L);                        // methods: item, tolist, to, casts, cpu, cuda (tensor_conversion_binding.cpp)
void add_autograd_methods(lua_State* L);  // methods: backward ... set_data (autograd_binding.cpp)
void add_autograd_functions(lua_State* L);  // torch: no_grad, enable_grad, is_grad_enabled (autograd_binding.cpp)
void add_process_state_functions(lua_State* L);
// A dtype name ("float32", "int64", ...) and a device name ("cpu", "cuda:1", "auto") as options.
template <class Struct>
OptionField<Struct> dtype_option(const char* key, std::optional<at::ScalarType> Struct::*member) {
  return option_with<Struct>(key, [member](lua_State* L, const char* k, Struct& s) {
    std::string name;
    read_option_value(L, k, name);
    s.*member = core::parse_dtype(name);
  });
}

template <class Struct>
OptionField<Struct> device_option(const char* key, std::optional<c10::Device> Struct::*member) {
  return option_with<Struct>(key, [member](lua_State* L, const char* k, Struct& s) {
    std::string name;
    read_option_value(L, k, name);
    s.*member = core::parse_device(name);
  });
}

// A full Lua collection that restarts the tensor byte count (tensor_binding.cpp): after a backward, the
// unreachable tensors of earlier steps hold autograd graphs the count does not see.
void collect_tensors(lua_State* L);  // torch: manual_seed ... held_bytes, torch.cuda (torch_state_binding.cpp)

}  // namespace runner::bindings
