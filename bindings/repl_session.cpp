// The REPL's chunks and completions in the Lua host.
#include "bindings/repl_session.h"

#include <lua.hpp>

#include <cstring>

namespace runner::bindings {
namespace {

bool is_incomplete(lua_State* L) {
  const char* message = lua_tostring(L, -1);
  const char* eof = "'<eof>'";
  const size_t length = message ? std::strlen(message) : 0;
  return length >= std::strlen(eof) && std::strcmp(message + length - std::strlen(eof), eof) == 0;
}

// An expression is evaluated as an argument of a call rather than returned directly: a returned call
// would be a tail call, and errors inside it would lose their stdin:line position. The wrapper also
// counts the values so that trailing nils print.
// `own_line`: the closing parenthesis on a line of its own, for a chunk ending in a comment (which would
// swallow it); otherwise on the same line, so that an error in a one-line expression is at stdin:1.
std::string as_expression(const std::string& chunk, bool own_line) {
  return "return (function(...) return select('#', ...), ... end)(" + chunk + (own_line ? "\n)" : ")");
}

// Prints the values left above `base` through runner.pretty.print: an expression chunk leaves a count
// and then the values; a statement chunk leaves whatever it returned.
void print_results(lua_State* L, LuaHost& host, int base, bool expression) {
  int count = lua_gettop(L) - base;
  if (expression) {
    count = static_cast<int>(lua_tointeger(L, base + 1));
    lua_remove(L, base + 1);
    lua_settop(L, base + count);
  }
  if (count == 0) return;
  lua_getglobal(L, "runner");
  lua_getfield(L, -1, "pretty");
  lua_getfield(L, -1, "print");
  lua_insert(L, base + 1);
  lua_pop(L, 2);
  host.call(count, 0);
}

}  // namespace

ReplOutcome run_repl_chunk(LuaHost& host, const std::string& chunk) {
  lua_State* L = host.state();
  const int base = lua_gettop(L);
  ReplOutcome outcome;
  bool expression = true;
  if (host.load_text(as_expression(chunk, false), "=stdin") != 0) {
    lua_pop(L, 1);
    if (host.load_text(as_expression(chunk, true), "=stdin") != 0) {
      lua_pop(L, 1);
      expression = false;
      if (host.load_text(chunk, "=stdin") != 0) {
        outcome.kind = is_incomplete(L) ? ReplOutcome::Kind::incomplete : ReplOutcome::Kind::syntax_error;
        if (const char* message = lua_tostring(L, -1)) outcome.message = message;
        lua_settop(L, base);
        return outcome;
      }
    }
  }
  outcome.status = host.call(0, LUA_MULTRET);
  if (outcome.status == kExitOk) print_results(L, host, base, expression);
  lua_settop(L, base);
  return outcome;
}

std::vector<std::string> repl_completions(LuaHost& host, const std::string& text) {
  lua_State* L = host.state();
  std::vector<std::string> matches;
  const int top = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "runner.repl");
  if (lua_pcall(L, 1, 1, 0) == 0) {
    lua_getfield(L, -1, "complete");
    lua_pushlstring(L, text.data(), text.size());
    if (lua_pcall(L, 1, 1, 0) == 0 && lua_istable(L, -1)) {
      const int count = static_cast<int>(lua_objlen(L, -1));
      for (int i = 1; i <= count; ++i) {
        lua_rawgeti(L, -1, i);
        if (const char* match = lua_tostring(L, -1)) matches.emplace_back(match);
        lua_pop(L, 1);
      }
    }
  }
  lua_settop(L, top);
  return matches;
}

}  // namespace runner::bindings
