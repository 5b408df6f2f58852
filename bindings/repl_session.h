// The Lua side of the REPL (app/repl.cpp reads the lines): a typed chunk compiled as an expression first, run
// in the host, its values printed through runner.pretty; and tab completions from runner.repl.
#pragma once

#include <string>
#include <vector>

#include "bindings/lua_host.h"

namespace runner::bindings {

struct ReplOutcome {
  enum class Kind {
    ran,           // compiled and run: `status` is its exit status (0, or 1 / an interrupt with the error printed)
    incomplete,    // the chunk ends before its end (an open block or string): read another line and try again
    syntax_error,  // `message` is the compiler's error, e.g. "stdin:1: unexpected symbol near ')'"
  };
  Kind kind = Kind::ran;
  int status = kExitOk;
  std::string message;
};

// Compiles `chunk` (chunk name "stdin") as an expression, whose values are printed (trailing nils too), else
// as a statement, whose returned values are printed; runs it under host.call (Ctrl-C stops it).
ReplOutcome run_repl_chunk(LuaHost& host, const std::string& chunk);

// The completions of `text` (runner.repl's complete()); none when it fails, e.g. in a failing __index.
std::vector<std::string> repl_completions(LuaHost& host, const std::string& text);

}  // namespace runner::bindings
