// The REPL: line editing, history and completion on a terminal, plain line-by-line reading otherwise; its chunks
// run in this process's host (runner repl, runner -i) or in a training process (runner attach).
#pragma once

#include <string>
#include <vector>

#include "bindings/lua_host.h"
#include "bindings/repl_session.h"

namespace runner::app {

// Where the REPL's chunks run.
class ReplTarget {
 public:
  virtual ~ReplTarget() = default;
  // Runs a typed chunk ('=' taken off) and shows what it printed and its error; an incomplete chunk or a syntax
  // error as bindings::run_repl_chunk says them (the REPL reads more lines, or prints the message).
  virtual bindings::ReplOutcome run_chunk(const std::string& chunk) = 0;
  virtual std::vector<std::string> completions(const std::string& text) = 0;
  // A line that is a command of the target rather than Lua (runner attach's `.detach`): true when it was one.
  virtual bool command(const std::string&) { return false; }
  // No more chunks can run: os.exit ran, the training process is gone, the session detached.
  virtual bool ended() const = 0;
  // A descriptor that, readable while the terminal waits for a line, ends the reading as Ctrl-D does (runner
  // attach: the training process says the run ended); -1 for none.
  virtual int watched_descriptor() const { return -1; }
};

// Reads and runs lines in the host's state until end of input; returns the process exit status.
int run_repl(bindings::LuaHost& host);

// Reads and runs lines in `target` until end of input or target.ended(); on a terminal `banner` comes first and
// `history` (a file, or "" for none) keeps the lines. Returns the status of a chunk that a stop signal other than
// Ctrl-C ended (the session ends with it), else 0.
int run_repl(ReplTarget& target, const std::string& banner, const std::string& history);

}  // namespace runner::app
