// The binding idiom shared by every bound area: C++ errors become Lua errors at the user's file:line,
// argument and option-table checks, userdata helpers. The only layer that sees lua_State.
#pragma once

#include <lua.hpp>

#include <c10/util/Exception.h>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/did_you_mean.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/interrupt.h"

namespace runner::bindings {

// "exp.lua:12: " for the innermost frame of user code (skipping C functions and the stdlib), or "".
std::string user_where(lua_State* L);
// Whether a frame's source is a stdlib file, whose frames error positions and tracebacks skip.
bool is_stdlib_source(const char* source);
// The name of a frame's source as errors show it: a file's path whole (LuaJIT's short_src cuts paths past 60
// characters), else short_src.
std::string source_name(const lua_Debug& frame);

// Raises a Lua error with message prefixed by user_where. Never returns.
int raise_error(lua_State* L, const std::string& message);

// Raised by every wrapped binding when Ctrl-C was pressed; the host maps it to exit status 130.
int raise_interrupt(lua_State* L);
bool is_interrupt_error(lua_State* L, int index);

// A Lua error raised inside a Lua callback that runtime code called (a loss function): its message already
// says where, so wrap() raises it unchanged.
struct LuaCallbackError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The lua_State of the innermost wrapped binding running on this thread: where runtime code that calls back
// into Lua (a loss function, the named state of a checkpoint) runs its callbacks.
lua_State* calling_lua_state();

// Ends the script as os.exit(status) does (an unwind the host turns into the exit status). Never returns.
int raise_exit(lua_State* L, int status);

namespace detail {
// Sets calling_lua_state() for the extent of one wrapped call.
class CallingState {
 public:
  explicit CallingState(lua_State* L);
  ~CallingState();
  CallingState(const CallingState&) = delete;
  CallingState& operator=(const CallingState&) = delete;

 private:
  lua_State* previous_;
};
}  // namespace detail

// LibTorch's message with a note that it counts from 0, where it names a dimension, position or list entry by
// number ("except in dimension 0"); other messages unchanged.
std::string with_zero_based_note(std::string message);
inline constexpr bool kCountsFromZero = true;

// Every lua_CFunction is registered through wrap<F>: C++ exceptions (c10::Error included) turn into Lua
// errors with the user's file:line after the C++ frames have unwound; a pending Ctrl-C is raised first;
// core::ExitRequest ends the script as os.exit does. wrap<F, kCountsFromZero> is for calls whose LibTorch
// errors may name dims or list entries (calls that take dims, tensor lists, broadcasting): those messages
// count from 0 and get a note that says so.
// Lua errors pass through untouched (they are foreign exceptions; never catch(...) here).
template <lua_CFunction F, bool CountsFromZero = false>
int wrap(lua_State* L) {
  if (core::take_interrupt()) return raise_interrupt(L);
  std::string message;
  bool interrupted = false;
  bool located = false;
  int exit_status = -1;
  try {
    detail::CallingState calling(L);
    return F(L);
  } catch (const core::ExitRequest& request) {
    exit_status = request.status;
  } catch (const core::Interrupted&) {
    core::take_interrupt();
    interrupted = true;
  } catch (const LuaCallbackError& error) {
    message = error.what();
    located = true;
  } catch (const c10::Error& error) {
    message = error.what_without_backtrace();
    if constexpr (CountsFromZero) message = with_zero_based_note(std::move(message));
  } catch (const std::exception& error) {
    message = error.what();
  }
  if (interrupted) return raise_interrupt(L);
  if (exit_status >= 0) return raise_exit(L, exit_status);
  if (located) {
    lua_pushlstring(L, message.data(), message.size());
    return lua_error(L);
  }
  return raise_error(L, message);
}

struct Function {
  const char* name;
  lua_CFunction function;
};

// Sets each function as a field of the table at the top of the stack.
void set_functions(lua_State* L, std::initializer_list<Function> functions);

// Arguments ------------------------------------------------------------------------------------
std::int64_t check_integer(lua_State* L, int index);
std::int64_t opt_integer(lua_State* L, int index, std::int64_t fallback);
bool opt_boolean(lua_State* L, int index, bool fallback);
std::string check_string(lua_State* L, int index);

// runner._did_you_mean in Lua.
using core::did_you_mean;

// Option tables are declared once in bindings/option_table.h, which checks them with this:
// "unknown option 'x' to 'adamw' (known: a, b, c); did you mean 'b'?".
// Raises the error for the key at the top of the stack (of the table at absolute index `table`, as in a lua_next
// loop) that is not one of `names`: a did-you-mean for a misspelt name, "takes named options only" for a list entry.
int raise_unknown_option(lua_State* L, int table, const std::string& function, const std::vector<std::string>& names);
bool has_field(lua_State* L, int index, const char* key);
std::string field_string(lua_State* L, int index, const char* key, const std::string& fallback);

// Userdata -------------------------------------------------------------------------------------
// A full userdata holding a T constructed in place; its metatable (registered under `type_name` by
// new_metatable) has __gc calling ~T.
template <class T, class... Args>
T* new_userdata(lua_State* L, const char* type_name, Args&&... args) {
  void* memory = lua_newuserdata(L, sizeof(T));
  T* object = new (memory) T(std::forward<Args>(args)...);
  luaL_getmetatable(L, type_name);
  lua_setmetatable(L, -2);
  return object;
}

template <class T>
T* test_userdata(lua_State* L, int index, const char* type_name) {
  void* memory = lua_touserdata(L, index);
  if (memory == nullptr || !lua_getmetatable(L, index)) return nullptr;
  luaL_getmetatable(L, type_name);
  const bool same = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return same ? static_cast<T*>(memory) : nullptr;
}

// Raises "bad argument #i to 'f' (<display_name> expected, got <type>)".
int raise_type_error(lua_State* L, int index, const char* display_name);

// The userdata of metatable `type_name` at `index`, or an argument error naming `display_name`.
template <class T>
T* check_userdata(lua_State* L, int index, const char* type_name, const char* display_name) {
  T* object = test_userdata<T>(L, index, type_name);
  if (!object) raise_type_error(L, index, display_name);
  return object;
}

template <class T>
int destroy_userdata(lua_State* L) {
  static_cast<T*>(lua_touserdata(L, 1))->~T();
  return 0;
}

// Creates the metatable `type_name` with __gc = ~T, __name, and an __index table of methods that it leaves
// on the stack (the metatable is popped).
template <class T>
void new_metatable(lua_State* L, const char* type_name, std::initializer_list<Function> methods) {
  luaL_newmetatable(L, type_name);
  lua_pushcfunction(L, &destroy_userdata<T>);
  lua_setfield(L, -2, "__gc");
  lua_pushstring(L, type_name);
  lua_setfield(L, -2, "__name");
  lua_newtable(L);
  set_functions(L, methods);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "__index");
  lua_remove(L, -2);
}

}  // namespace runner::bindings
