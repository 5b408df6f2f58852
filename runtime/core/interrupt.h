// The process-wide interrupt request (Ctrl-C): set from a signal handler, polled by long-running work.
#pragma once

#include <stdexcept>

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

}  // namespace runner::core
