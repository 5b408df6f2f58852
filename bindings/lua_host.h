// The Lua host: one lua_State with the bindings and stdlib loaded; runs scripts, code strings and the
// REPL under a traceback handler, maps errors, os.exit and Ctrl-C to exit statuses.
#pragma once

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/exit_status.h"

struct lua_State;  // the host's callers in app/ see no Lua C API: they use this class, repl_session.h, sweep_file.h

namespace runner::bindings {

using core::kExitError;
using core::kExitInterrupted;
using core::kExitOk;
using core::kExitUsage;

// "LuaJIT 2.1.x", for version reports and the REPL's banner.
const char* luajit_version();

class LuaHost {
 public:
  LuaHost();
  ~LuaHost();
  LuaHost(const LuaHost&) = delete;
  LuaHost& operator=(const LuaHost&) = delete;

  // `overrides` are key=value strings for config{}; `script_args` become arg[1..].
  int run_file(const std::string& path, const std::vector<std::string>& overrides,
               const std::vector<std::string>& script_args);
  int run_string(const std::string& code, const std::string& chunk_name = "=(command line)");
  // For `runner -i`: the script's top-level locals become globals when it ends (also on an error, as they
  // were at the error), so that the REPL after it sees `model` as well as globals.
  void keep_script_locals() { keep_locals_ = true; }
  // For the REPL: Ctrl-C and the other stop signals also stop a loop of pure Lua that LuaJIT compiled (whose
  // code runs no hooks). Flushes the compiled code; while enabled, LuaJIT's profiler is taken.
  void interrupt_compiled_loops(bool enabled);
  bool compiled_loops_interruptible() const;
  // For `runner --print-config` and sweeps: the script ends (exit status 0) at its config { ... } (after
  // checking the overrides) or at runner.start, and reported_config() then holds its keys as JSON
  // {"keys": {name: {"default": value, "integer": bool}}}.
  void want_config();
  std::optional<std::string> reported_config() const;

  // For bindings/ (these two work on the state's stack): calls the function below `nargs` arguments on the
  // stack under the traceback handler with Ctrl-C enabled; on success leaves `nresults` results (LUA_MULTRET
  // allowed). Returns an exit status; on failure the error has been printed and the stack is restored.
  int call(int nargs, int nresults);

  // For `runner attach` (bindings/repl_session.cpp): the same call, but a failure is neither printed nor kept as
  // the script's error: its message (with the traceback of the frames above the called chunk) goes into `error`.
  int call_capturing_error(int nargs, int nresults, std::string& error);
  // For bindings/: the host whose state `L` is.
  static LuaHost& of(lua_State* L);

  // Compiles source text as a chunk (text only, never bytecode). Returns 0 or a Lua status with the
  // message on the stack.
  int load_text(const std::string& text, const std::string& chunk_name);

  // Ends the run that runner.start opened, if any, with the status the script ended with (0: finished;
  // an interrupt: interrupted; else failed with the last error printed). Returns the process's exit status:
  // `status`, or 1 when the script succeeded but its run could not be recorded whole (printed).
  // A stop signal that arrived after run_file or run_string ended waits until the run is recorded, then takes
  // its usual effect (a SIGTERM from a launcher must not leave the run 'running').
  int end_run(int status);

  // True once os.exit ran: the process must exit with exit_status().
  bool exit_requested() const { return exit_requested_; }
  void request_exit(int status);
  int exit_status() const { return exit_status_; }
  lua_State* state() const { return L_; }  // for bindings/ only

 private:
  int report_failure(int status);
  enum class AfterCall { restore_signals, hold_signals };
  int call(int nargs, int nresults, AfterCall after);
  void release_held_signals();
  lua_State* L_;
  bool exit_requested_ = false;
  bool keep_locals_ = false;
  std::string last_error_;
  std::string* error_sink_ = nullptr;  // call_capturing_error's
  int exit_status_ = kExitOk;
  bool holding_signals_ = false;
  void (*held_previous_[4])(int) = {};  // the handlers before the script, restored by release_held_signals
};

// For runner attach: while one lives, another thread can stop the Lua code that the host runs (in call()) on the
// thread that made it. stop(message) makes that code raise `message`, an ordinary error, at its next Lua instruction
// (a loop that LuaJIT compiled too: interrupt_compiled_loops is on meanwhile) and again at every later one until
// this ends, so that a pcall in it cannot go on. Code inside one C function (a tensor operation) stops when it
// returns to Lua. The signal that reaches the Lua thread is SIGUSR2, handled only while one lives.
class StoppableCode {
 public:
  explicit StoppableCode(LuaHost& host);
  ~StoppableCode();
  StoppableCode(const StoppableCode&) = delete;
  StoppableCode& operator=(const StoppableCode&) = delete;

  // Any thread; the first call counts.
  void stop(const std::string& message);

 private:
  LuaHost& host_;
  pthread_t lua_thread_;
  bool enabled_compiled_loops_ = false;
  std::atomic<bool> stopping_{false};
  std::string message_;
  struct sigaction previous_handler_ {};
};

}  // namespace runner::bindings
