// The index of a C++ test: in the test's own folder, on the test run's PostgreSQL server when the launch context
// names one (index_test.cpp's PostgreSQL variants), else the SQLite file there.
#pragma once

#include <string>

#include "runtime/core/launch_context.h"
#include "runtime/index/index_database.h"

namespace runner::testing {

inline index::IndexLocation index_at(const std::string& home) { return {home, core::launch_context().index_url}; }

// The process's launch context with the index's home at `home`, for run::start_run.
inline core::LaunchContext launch_at(const std::string& home, core::LaunchContext launch = core::launch_context()) {
  launch.home = home;
  return launch;
}

}  // namespace runner::testing
