// The process-wide interrupt flag.
#include "runtime/core/interrupt.h"

#include <time.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <fmt/format.h>

namespace runner::core {
namespace {
std::atomic<bool> interrupt_flag{false};
std::atomic<bool> graceful_flag{false};
std::atomic<int> stop_signal_number{0};
std::atomic<std::int64_t> stop_requested_at{0};  // CLOCK_MONOTONIC nanoseconds

std::int64_t monotonic_nanoseconds() noexcept {  // clock_gettime is async-signal-safe
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return std::int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}
static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<int>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);
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
  if (!stop_signal_number.compare_exchange_strong(expected, signal_number, std::memory_order_relaxed)) return false;
  stop_requested_at.store(monotonic_nanoseconds(), std::memory_order_relaxed);
  return true;
}
bool repeated_stop(int signal_number) noexcept {
  constexpr std::int64_t kSameStopNanoseconds = 2'000'000'000;
  return signal_number == SIGTERM && stop_signal_number.load(std::memory_order_relaxed) == SIGTERM &&
         monotonic_nanoseconds() - stop_requested_at.load(std::memory_order_relaxed) < kSameStopNanoseconds;
}
int stop_signal() noexcept { return stop_signal_number.load(std::memory_order_relaxed); }

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return fmt::format("signal {}", signal_number);
  }
}

}  // namespace runner::core
