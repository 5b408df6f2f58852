// The trainer's progress line: a StepObserver over ProgressDisplay.
#include "runtime/train/progress_line.h"

#include <ATen/core/Tensor.h>

#include "runtime/core/clock.h"
#include "runtime/core/device.h"
#include "runtime/train/trainer.h"

namespace runner::train {

ProgressLine::ProgressLine(ProgressOptions options, c10::Device device, std::FILE* out)
    : display_(options, core::steady_seconds(), out), device_(device) {}

std::optional<double> ProgressLine::memory_bytes() const {
  if (!device_.is_cuda()) return std::nullopt;
  return static_cast<double>(core::cuda_memory(device_.has_index() ? device_.index() : 0).allocated);
}

void ProgressLine::after_step(const StepResult& result) {
  const double now = core::steady_seconds();
  if (!display_.tick(result.step, now)) return;
  ProgressSnapshot snapshot;
  snapshot.step = result.step;
  snapshot.values.emplace_back("loss", result.loss.item<double>());
  snapshot.lr = result.lr;
  snapshot.memory_bytes = memory_bytes();
  display_.show(snapshot, now);
}

void ProgressLine::finish(std::int64_t step, double lr) {
  ProgressSnapshot snapshot;
  snapshot.step = step;
  snapshot.lr = lr;
  snapshot.memory_bytes = memory_bytes();
  display_.finish(snapshot, core::steady_seconds());
}

}  // namespace runner::train
