// The process-wide interrupt request (Ctrl-C): set from a signal handler, polled by long-running work.
#pragma once

namespace runner::core {

// Async-signal-safe: only stores to a lock-free atomic.
void request_interrupt() noexcept;
bool interrupt_requested() noexcept;
// Returns whether an interrupt was pending and clears it.
bool take_interrupt() noexcept;

}  // namespace runner::core
