// `runner sweep`: runs a sweep file (or joins a sweep of the index) as a worker; `runner sweep show`.
#pragma once

namespace runner::app {

// argv[0] is "sweep". Returns the exit status: 0 done, 1 an error or failed trials over the limit, 2 a usage
// error or a bad sweep file, 130 stopped by Ctrl-C.
int run_sweep_command(int argc, char** argv);

}  // namespace runner::app
