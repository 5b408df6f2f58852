// The process-wide interrupt request (Ctrl-C): set from a signal handler, polled by long-running work.
#pragma once

#include <stdexcept>
#include <string>

namespace runner::core {

// Thrown by blocking runtime calls (waiting for a batch) when Ctrl-C was pressed; the pending request is
// left set so that the binding layer reports an interrupt rather than an error.
struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// Async-signal-safe: only stores to a lock-free atomic.
void request_interrupt() noexcept;
bool interrupt_requested() noexcept;
// Returns whether an interrupt was pending and clears it.
bool take_interrupt() noexcept;

// Graceful stops: while enabled (a training loop that can checkpoint), the first stop signal only records
// itself for the loop to act on after its current step; a second one interrupts at once.
void set_graceful_stop(bool enabled) noexcept;
bool graceful_stop_enabled() noexcept;
// Async-signal-safe. Records `signal_number` unless a stop is already pending; returns whether it did.
bool request_stop(int signal_number) noexcept;
// The signal of the pending stop, 0 when none.
int stop_signal() noexcept;
// Async-signal-safe. Whether `signal_number` is SIGTERM arriving again within 2 s of the pending stop's SIGTERM:
// the same stop delivered twice (Slurm signals every process of a job, and a sweep worker or `runner --nproc`
// forwards the signal to its children as well), not a second one that stops at once.
bool repeated_stop(int signal_number) noexcept;

// "SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1"; another as "signal N".
std::string signal_name(int signal_number);

}  // namespace runner::core
