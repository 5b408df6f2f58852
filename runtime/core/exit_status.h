// The exit statuses of the runner process, and the request with which runtime code ends it on purpose.
#pragma once

#include <csignal>
#include <stdexcept>
#include <string>

namespace runner::core {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInterrupted = 130;  // Ctrl-C; other signals give 128 + their number
// The run failed after a write failed for want of space (core::storage_was_full): EX_TEMPFAIL, to be tried again.
inline constexpr int kExitStorageFull = 75;
// The run this process wrote was resumed by another process, or the sweep trial it ran was taken over by another
// worker, while this one was silent (index/writer_fence.h): the process ended without writing anything more.
inline constexpr int kExitTakenOver = 76;

// 130 for SIGINT, 128 + the number for SIGTERM (143), SIGHUP (129), SIGUSR1 (138).
inline int exit_status_for_signal(int signal_number) { return 128 + signal_number; }

// Whether a process that ends with `status` was stopped by a signal rather than failing.
inline bool is_interrupt_status(int status) {
  return status == kExitInterrupted || status == 128 + SIGTERM || status == 128 + SIGHUP || status == 128 + SIGUSR1;
}

// Thrown by runtime code that has finished its work and wants the process to end with `status` (a graceful
// stop after its checkpoint). Hosts unwind the script as for os.exit(status): finalizers run, logs flush.
struct ExitRequest : std::runtime_error {
  ExitRequest(int status, const std::string& reason) : std::runtime_error(reason), status(status) {}
  int status;
};

}  // namespace runner::core
