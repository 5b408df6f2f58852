// `runner attach RUN`: a REPL whose chunks run in a training process, between its steps.
#pragma once

namespace runner::app {

// argv[0] is "attach". Returns the exit status: 0 detached (or the run ended), 1 the run cannot be reached, 2 a
// usage error.
int run_attach_command(int argc, char** argv);

}  // namespace runner::app
