// The REPL's chunks (in the host, or in a training script's scope for runner attach) and completions.
#include "bindings/repl_session.h"

#include <fmt/format.h>
#include <lua.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>

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
// and then the values; a statement chunk leaves whatever it returned. With `error`, a failure of the printing
// (a __tostring that raises) goes there (call_capturing_error) instead of to the terminal.
int print_results(lua_State* L, LuaHost& host, int base, bool expression, std::string* error) {
  int count = lua_gettop(L) - base;
  if (expression) {
    count = static_cast<int>(lua_tointeger(L, base + 1));
    lua_remove(L, base + 1);
    lua_settop(L, base + count);
  }
  if (count == 0) return kExitOk;
  lua_getglobal(L, "runner");
  lua_getfield(L, -1, "pretty");
  lua_getfield(L, -1, "print");
  lua_insert(L, base + 1);
  lua_pop(L, 2);
  return error ? host.call_capturing_error(count, 0, *error) : host.call(count, 0);
}

// Compiles the chunk as an expression (then as a statement) and leaves the function on the stack; on failure
// returns the outcome (incomplete, syntax_error) with the stack as it was.
std::optional<ReplOutcome> load_chunk(LuaHost& host, const std::string& chunk, bool& expression) {
  lua_State* L = host.state();
  expression = true;
  if (host.load_text(as_expression(chunk, false), "=stdin") == 0) return std::nullopt;
  lua_pop(L, 1);
  if (host.load_text(as_expression(chunk, true), "=stdin") == 0) return std::nullopt;
  lua_pop(L, 1);
  expression = false;
  if (host.load_text(chunk, "=stdin") == 0) return std::nullopt;
  ReplOutcome outcome;
  outcome.kind = is_incomplete(L) ? ReplOutcome::Kind::incomplete : ReplOutcome::Kind::syntax_error;
  if (const char* message = lua_tostring(L, -1)) outcome.message = message;
  lua_pop(L, 1);
  return outcome;
}

// print and io.write append to text() while one lives (an attached chunk's output goes to its client, not to the
// training's terminal and log); the previous functions come back when it ends.
class OutputCapture {
 public:
  explicit OutputCapture(lua_State* L) : L_(L) {
    lua_getglobal(L, "print");
    print_ = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getglobal(L, "io");
    lua_getfield(L, -1, "write");
    write_ = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushlightuserdata(L, this);
    lua_pushcclosure(L, capture_write, 1);
    lua_setfield(L, -2, "write");
    lua_pop(L, 1);
    lua_pushlightuserdata(L, this);
    lua_pushcclosure(L, capture_print, 1);
    lua_setglobal(L, "print");
  }
  ~OutputCapture() {
    lua_rawgeti(L_, LUA_REGISTRYINDEX, print_);
    lua_setglobal(L_, "print");
    lua_getglobal(L_, "io");
    lua_rawgeti(L_, LUA_REGISTRYINDEX, write_);
    lua_setfield(L_, -2, "write");
    lua_pop(L_, 1);
    luaL_unref(L_, LUA_REGISTRYINDEX, print_);
    luaL_unref(L_, LUA_REGISTRYINDEX, write_);
  }
  OutputCapture(const OutputCapture&) = delete;
  OutputCapture& operator=(const OutputCapture&) = delete;
  // What was printed, cut at kMostBytes with a note of how much more there was.
  std::string text() const {
    if (dropped_ == 0) return text_;
    return text_ + fmt::format("\n[runner attach: the output was cut at {} MiB; {} more bytes were not sent]\n",
                               kMostBytes >> 20, dropped_);
  }

 private:
  static OutputCapture& of(lua_State* L) {
    return *static_cast<OutputCapture*>(lua_touserdata(L, lua_upvalueindex(1)));
  }

  // print(...): tostring of each value, tab-separated, then a newline (Lua's print).
  static int capture_print(lua_State* L) {
    OutputCapture& capture = of(L);
    const int count = lua_gettop(L);
    lua_getglobal(L, "tostring");
    for (int i = 1; i <= count; ++i) {
      lua_pushvalue(L, -1);
      lua_pushvalue(L, i);
      lua_call(L, 1, 1);
      size_t length = 0;
      const char* text = lua_tolstring(L, -1, &length);
      if (!text) return luaL_error(L, "'tostring' must return a string to 'print'");
      if (i > 1) capture.append("\t", 1);
      capture.append(text, length);
      lua_pop(L, 1);
    }
    capture.append("\n", 1);
    return 0;
  }

  // io.write(...): strings and numbers as they are (io.write's rules).
  static int capture_write(lua_State* L) {
    OutputCapture& capture = of(L);
    for (int i = 1; i <= lua_gettop(L); ++i) {
      size_t length = 0;
      const char* text = luaL_checklstring(L, i, &length);
      capture.append(text, length);
    }
    return 0;
  }

  // The output goes to the client in one message (attach_protocol's limit is 64 MiB), for a person to read: past
  // kMostBytes it is counted, not kept, and the chunk and the run go on.
  static constexpr std::size_t kMostBytes = std::size_t{1} << 20;

  void append(const char* text, std::size_t length) {
    const std::size_t room = text_.size() < kMostBytes ? kMostBytes - text_.size() : 0;
    text_.append(text, std::min(room, length));
    dropped_ += length - std::min(room, length);
  }

  lua_State* L_;
  std::size_t dropped_ = 0;
  int print_ = LUA_NOREF;
  int write_ = LUA_NOREF;
  std::string text_;
};

}  // namespace

ReplOutcome run_repl_chunk(LuaHost& host, const std::string& chunk) {
  lua_State* L = host.state();
  const int base = lua_gettop(L);
  bool expression = true;
  if (std::optional<ReplOutcome> failed = load_chunk(host, chunk, expression)) return *failed;
  ReplOutcome outcome;
  outcome.status = host.call(0, LUA_MULTRET);
  if (outcome.status == kExitOk) print_results(L, host, base, expression, nullptr);
  lua_settop(L, base);
  return outcome;
}

ReplOutcome run_attached_chunk(LuaHost& host, const std::string& chunk, int environment) {
  lua_State* L = host.state();
  if (environment < 0) environment = lua_gettop(L) + environment + 1;
  const int base = lua_gettop(L);
  bool expression = true;
  if (std::optional<ReplOutcome> failed = load_chunk(host, chunk, expression)) return *failed;
  lua_pushvalue(L, environment);
  lua_setfenv(L, -2);
  ReplOutcome outcome;
  {
    OutputCapture capture(L);
    outcome.status = host.call_capturing_error(0, LUA_MULTRET, outcome.message);
    if (outcome.status == kExitOk) outcome.status = print_results(L, host, base, expression, &outcome.message);
    outcome.output = capture.text();
  }
  lua_settop(L, base);
  return outcome;
}

std::vector<std::string> repl_completions(LuaHost& host, const std::string& text, int environment) {
  lua_State* L = host.state();
  std::vector<std::string> matches;
  if (environment < 0) environment = lua_gettop(L) + environment + 1;
  const int top = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "runner.repl");
  if (lua_pcall(L, 1, 1, 0) == 0) {
    lua_getfield(L, -1, "complete");
    lua_pushlstring(L, text.data(), text.size());
    if (environment != 0)
      lua_pushvalue(L, environment);
    else
      lua_pushnil(L);
    if (lua_pcall(L, 2, 1, 0) == 0 && lua_istable(L, -1)) {
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
