// Tests of the binding idiom: a C++ exception thrown inside a binding reaches Lua as an error with the
// script's file:line after the C++ destructors ran; Lua errors raised through C++ frames run them too.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "bindings/binding.h"

namespace {

int destructor_runs = 0;

struct CountsDestruction {
  ~CountsDestruction() { ++destructor_runs; }
};

int throws_std_exception(lua_State*) {
  CountsDestruction guard;
  throw std::runtime_error("converted boom");
}

int throws_c10_error(lua_State*) {
  CountsDestruction guard;
  TORCH_CHECK(false, "shape mismatch from c10");
  return 0;
}

int raises_lua_error(lua_State* L) {
  CountsDestruction guard;
  return luaL_error(L, "lua error through C++ frames");
}

// Runs `code` as chunk "@exp.lua" under pcall; returns the error message (or "ok").
std::string run_chunk(lua_State* L, const std::string& code) {
  REQUIRE(luaL_loadbuffer(L, code.data(), code.size(), "@exp.lua") == 0);
  if (lua_pcall(L, 0, 0, 0) == 0) return "ok";
  std::string message = lua_tostring(L, -1);
  lua_pop(L, 1);
  return message;
}

struct LuaState {
  LuaState() : L(luaL_newstate()) {
    luaL_openlibs(L);
    lua_pushcfunction(L, runner::bindings::wrap<throws_std_exception>);
    lua_setglobal(L, "throws_std_exception");
    lua_pushcfunction(L, runner::bindings::wrap<throws_c10_error>);
    lua_setglobal(L, "throws_c10_error");
    lua_pushcfunction(L, runner::bindings::wrap<raises_lua_error>);
    lua_setglobal(L, "raises_lua_error");
  }
  ~LuaState() { lua_close(L); }
  lua_State* L;
};

}  // namespace

TEST_CASE("a std::exception in a binding becomes a Lua error at the caller's file:line", "[bindings]") {
  LuaState lua;
  destructor_runs = 0;
  CHECK(run_chunk(lua.L, "local x = 1\nthrows_std_exception()\n") == "exp.lua:2: converted boom");
  CHECK(destructor_runs == 1);
}

TEST_CASE("a c10::Error becomes a Lua error without the C++ backtrace", "[bindings]") {
  LuaState lua;
  destructor_runs = 0;
  CHECK(run_chunk(lua.L, "\n\nthrows_c10_error()") == "exp.lua:3: shape mismatch from c10");
  CHECK(destructor_runs == 1);
}

TEST_CASE("a Lua error raised inside a binding unwinds its C++ frames", "[bindings]") {
  LuaState lua;
  destructor_runs = 0;
  CHECK(run_chunk(lua.L, "raises_lua_error()") == "exp.lua:1: lua error through C++ frames");
  CHECK(destructor_runs == 1);
}

TEST_CASE("errors from bindings can be caught by pcall in the script and the state stays usable", "[bindings]") {
  LuaState lua;
  destructor_runs = 0;
  CHECK(run_chunk(lua.L,
                  "for i = 1, 100 do\n"
                  "  local ok, err = pcall(throws_std_exception)\n"
                  "  assert(not ok and err == 'exp.lua:2: converted boom', err)\n"
                  "end") == "ok");
  CHECK(destructor_runs == 100);
}
