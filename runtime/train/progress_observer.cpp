// The trainer's progress line: a StepObserver over ProgressRenderer.
#include "runtime/train/progress_observer.h"

#include <ATen/core/Tensor.h>

#include "runtime/core/clock.h"
#include "runtime/core/device.h"
#include "runtime/train/trainer.h"

namespace runner::train {

ProgressObserver::ProgressObserver(ProgressOptions options, c10::Device device, std::FILE* out)
    : display_(options, core::steady_seconds(), out), device_(device) {}

std::optional<double> ProgressObserver::memory_bytes() const {
  if (!device_.is_cuda()) return std::nullopt;
  return static_cast<double>(core::cuda_memory(device_.has_index() ? device_.index() : 0).allocated);
}

void ProgressObserver::after_step(const StepResult& result) {
  const double now = core::steady_seconds();
  if (!display_.tick(result.step, now)) return;
  ProgressSnapshot snapshot;
  snapshot.step = result.step;
  snapshot.values.emplace_back("loss", result.loss.item<double>());
  snapshot.lr = result.lr;
  snapshot.memory_bytes = memory_bytes();
  display_.show(snapshot, now);
}

void ProgressObserver::finish(std::int64_t step, double lr) {
  ProgressSnapshot snapshot;
  snapshot.step = step;
  snapshot.lr = lr;
  snapshot.memory_bytes = memory_bytes();
  display_.finish(snapshot, core::steady_seconds());
}

}  // namespace runner::train
