// The REPL: line editing, history and completion on a terminal, plain line-by-line reading otherwise.
#pragma once

#include "bindings/lua_host.h"

namespace runner::app {

// Reads and runs lines in the host's state until end of input; returns the process exit status.
int run_repl(bindings::LuaHost& host);

}  // namespace runner::app
