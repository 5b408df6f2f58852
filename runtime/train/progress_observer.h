// The progress line of a trainer's steps: after each step, the loss, learning rate and device memory in use on a
// ProgressRenderer, read from the device only when the line is shown.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <cstdio>

#include "runtime/train/progress_renderer.h"
#include "runtime/train/step_observer.h"

namespace runner::train {

class ProgressObserver : public StepObserver {
 public:
  ProgressObserver(ProgressOptions options, c10::Device device, std::FILE* out = stdout);
  void after_step(const StepResult& result) override;
  // The final line now (train:finish_progress): `step` steps done at learning rate `lr`.
  void finish(std::int64_t step, double lr);

 private:
  std::optional<double> memory_bytes() const;

  ProgressRenderer display_;
  c10::Device device_;
};

}  // namespace runner::train
