// `runner serve`: the dashboard over the index, until Ctrl-C (or SIGTERM, SIGHUP).
#pragma once

namespace runner::serve {

// argv[0] is "serve". Reports its errors as the index commands do (cli::run_reporting_errors): usage errors with
// exit status 2, others as one line "runner serve: ..." with 1.
int run_serve_command(int argc, char** argv);

}  // namespace runner::serve
