// The Lua side of the REPL (app/repl.cpp reads the lines): a typed chunk compiled as an expression first, run
// in the host (or, for runner attach, in a training script's scope), its values printed through runner.pretty; and
// tab completions from runner.repl.
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
  std::string message;  // run_attached_chunk: also the runtime error, with its traceback
  std::string output;   // run_attached_chunk: what the chunk and its printed values wrote
};

// Compiles `chunk` (chunk name "stdin") as an expression, whose values are printed (trailing nils too), else
// as a statement, whose returned values are printed; runs it under host.call (Ctrl-C stops it).
ReplOutcome run_repl_chunk(LuaHost& host, const std::string& chunk);

// For `runner attach` (bindings/attach_session.cpp): the same chunk compiled and printed the same way, with the
// table at stack index `environment` as its globals, and what it writes (print, io.write, its printed values) and
// its error with the traceback above it returned instead of printed (the status says which). A chunk that calls
// os.exit leaves host.exit_requested() set, for the caller to continue the exit once it has answered.
ReplOutcome run_attached_chunk(LuaHost& host, const std::string& chunk, int environment);

// The completions of `text` (runner.repl's complete()); none when it fails, e.g. in a failing __index. Names are
// looked up in the table at stack index `environment` when it is not 0 (runner attach's scope), else in the globals.
std::vector<std::string> repl_completions(LuaHost& host, const std::string& text, int environment = 0);

}  // namespace runner::bindings
