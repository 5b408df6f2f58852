// The process-wide interrupt flag.
#include "runtime/core/interrupt.h"

#include <atomic>

namespace runner::core {
namespace {
std::atomic<bool> interrupt_flag{false};
static_assert(std::atomic<bool>::is_always_lock_free);
}  // namespace

void request_interrupt() noexcept { interrupt_flag.store(true, std::memory_order_relaxed); }
bool interrupt_requested() noexcept { return interrupt_flag.load(std::memory_order_relaxed); }
bool take_interrupt() noexcept { return interrupt_flag.exchange(false, std::memory_order_relaxed); }

}  // namespace runner::core
