// torch.save(tensors, path [, metadata]) over runtime/ckpt/safetensors (or runtime/data/npz); torch.load(path) of
// safetensors, .npz archives and torch.save's .pt files (runtime/ckpt/pytorch_file).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "bindings/tensor_binding.h"
#include "runtime/ckpt/pytorch_file.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/data/npz.h"

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

bool is_npz(const std::string& path) { return path.size() > 4 && path.compare(path.size() - 4, 4, ".npz") == 0; }

// torch.save({name = tensor, ...}, path [, metadata]): tensors written in name order, atomically; a path ending in
// .npz is a NumPy archive (np.load reads it) instead of safetensors.
int torch_save(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  const std::string path = check_string(L, 2);
  std::vector<ckpt::NamedTensor> tensors;
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    at::Tensor* tensor = test_tensor(L, -1);
    if (lua_type(L, -2) != LUA_TSTRING || !tensor) luaL_argerror(L, 1, "table mapping names to Tensors expected");
    tensors.push_back({lua_tostring(L, -2), tensor->detach()});
    lua_pop(L, 1);
  }
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  if (is_npz(path)) {
    if (!lua_isnoneornil(L, 3))
      throw std::invalid_argument(fmt::format("torch.save: {}: an .npz holds no metadata", path));
    std::map<std::string, at::Tensor> arrays;
    for (const auto& [name, tensor] : tensors) arrays[name] = tensor;
    data::save_npz(path, arrays);
    return 0;
  }
  ckpt::save_safetensors(path, tensors, check_metadata(L, 3));
  return 0;
}

// A value of a .pt file as Lua: dicts as tables (string or integer keys), lists and tuples as arrays, None as nil.
void push_ivalue(lua_State* L, const c10::IValue& value) {
  luaL_checkstack(L, 4, "torch.load: the file nests too deep");
  if (value.isTensor()) {
    push_tensor(L, value.toTensor());
  } else if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    lua_createtable(L, 0, static_cast<int>(dict.size()));
    for (const auto& entry : dict) {
      if (entry.key().isString())
        lua_pushstring(L, entry.key().toStringRef().c_str());
      else if (entry.key().isInt())
        lua_pushnumber(L, static_cast<lua_Number>(entry.key().toInt()));
      else
        continue;
      push_ivalue(L, entry.value());
      lua_rawset(L, -3);
    }
  } else if (value.isList() || value.isTuple()) {
    const std::vector<c10::IValue> items =
        value.isList()
            ? value.toListRef().vec()
            : std::vector<c10::IValue>(value.toTupleRef().elements().begin(), value.toTupleRef().elements().end());
    lua_createtable(L, static_cast<int>(items.size()), 0);
    for (size_t i = 0; i < items.size(); ++i) {
      push_ivalue(L, items[i]);
      lua_rawseti(L, -2, static_cast<int>(i + 1));
    }
  } else if (value.isInt()) {
    lua_pushnumber(L, static_cast<lua_Number>(value.toInt()));
  } else if (value.isDouble()) {
    lua_pushnumber(L, value.toDouble());
  } else if (value.isBool()) {
    lua_pushboolean(L, value.toBool());
  } else if (value.isString()) {
    lua_pushstring(L, value.toStringRef().c_str());
  } else {
    lua_pushnil(L);
  }
}

// torch.load(path) -> {name = tensor, ...}, metadata (safetensors); value, {format = "pytorch"} (torch.save files)
int torch_load(lua_State* L) {
  const std::string path = check_string(L, 1);
  if (ckpt::is_torch_save_file(path)) {
    push_ivalue(L, ckpt::read_pytorch_file(path));
    lua_createtable(L, 0, 1);
    lua_pushstring(L, "pytorch");
    lua_setfield(L, -2, "format");
    return 2;
  }
  if (is_npz(path)) {
    const std::map<std::string, at::Tensor> arrays = data::load_npz(path);
    lua_createtable(L, 0, static_cast<int>(arrays.size()));
    for (const auto& [name, tensor] : arrays) {
      push_tensor(L, tensor);
      lua_setfield(L, -2, name.c_str());
    }
    lua_createtable(L, 0, 1);
    lua_pushstring(L, "npz");
    lua_setfield(L, -2, "format");
    return 2;
  }
  const ckpt::SafetensorsContents contents = ckpt::load_safetensors(path);
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
