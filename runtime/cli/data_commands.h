// `runner data ...`: dataset preparation commands of the command line.
#pragma once

namespace runner::cli {

// argv[0] is "data"; returns the process exit status (0, 1 error, 2 usage, 130 interrupted).
int run_data_command(int argc, char** argv);

}  // namespace runner::cli
