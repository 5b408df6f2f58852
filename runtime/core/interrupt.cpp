// The process-wide interrupt flag.
#include "runtime/core/interrupt.h"

#include <atomic>

namespace runner::core {
namespace {
std::atomic<bool> interrupt_flag{false};
std::atomic<bool> graceful_flag{false};
std::atomic<int> stop_signal_number{0};
static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<int>::is_always_lock_free);
}  // namespace

void request_interrupt() noexcept { interrupt_flag.store(true, std::memory_order_relaxed); }
bool interrupt_requested() noexcept { return interrupt_flag.load(std::memory_order_relaxed); }
bool take_interrupt() noexcept { return interrupt_flag.exchange(false, std::memory_order_relaxed); }

void set_graceful_stop(bool enabled) noexcept {
  graceful_flag.store(enabled, std::memory_order_relaxed);
  if (!enabled) stop_signal_number.store(0, std::memory_order_relaxed);
}
bool graceful_stop_enabled() noexcept { return graceful_flag.load(std::memory_order_relaxed); }
bool request_stop(int signal_number) noexcept {
  int expected = 0;
  return stop_signal_number.compare_exchange_strong(expected, signal_number, std::memory_order_relaxed);
}
int stop_signal() noexcept { return stop_signal_number.load(std::memory_order_relaxed); }

}  // namespace runner::core
