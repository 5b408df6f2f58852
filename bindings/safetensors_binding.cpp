// torch.save(tensors, path [, metadata]) and torch.load(path) over runtime/ckpt/safetensors.
#include <algorithm>

#include "bindings/tensor_binding.h"
#include "runtime/ckpt/safetensors.h"

namespace runner::bindings {
namespace {

std::map<std::string, std::string> check_metadata(lua_State* L, int index) {
  std::map<std::string, std::string> metadata;
  if (lua_isnoneornil(L, index)) return metadata;
  luaL_checktype(L, index, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, index)) {
    if (lua_type(L, -2) != LUA_TSTRING || (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER))
      luaL_argerror(L, index, "metadata must map strings to strings");
    metadata[lua_tostring(L, -2)] = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  return metadata;
}

// torch.save({name = tensor, ...}, path [, metadata]): tensors written in name order, atomically.
int torch_save(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  const std::string path = check_string(L, 2);
  std::vector<ckpt::NamedTensor> tensors;
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    at::Tensor* tensor = test_tensor(L, -1);
    if (lua_type(L, -2) != LUA_TSTRING || !tensor)
      luaL_argerror(L, 1, "table mapping names to Tensors expected");
    tensors.push_back({lua_tostring(L, -2), tensor->detach()});
    lua_pop(L, 1);
  }
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  ckpt::save_safetensors(path, tensors, check_metadata(L, 3));
  return 0;
}

// torch.load(path) -> {name = tensor, ...}, metadata
int torch_load(lua_State* L) {
  const ckpt::SafetensorsContents contents = ckpt::load_safetensors(check_string(L, 1));
  lua_createtable(L, 0, static_cast<int>(contents.tensors.size()));
  for (const auto& [name, tensor] : contents.tensors) {
    push_tensor(L, tensor);
    lua_setfield(L, -2, name.c_str());
  }
  lua_createtable(L, 0, static_cast<int>(contents.metadata.size()));
  for (const auto& [key, value] : contents.metadata) {
    lua_pushlstring(L, value.data(), value.size());
    lua_setfield(L, -2, key.c_str());
  }
  return 2;
}

}  // namespace

void open_safetensors(lua_State* L) {
  lua_getglobal(L, "torch");
  set_functions(L, {{"save", wrap<torch_save>}, {"load", wrap<torch_load>}});
  lua_pop(L, 1);
}

}  // namespace runner::bindings
