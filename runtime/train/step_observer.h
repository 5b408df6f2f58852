// What runs around each trainer step without being part of it (a training run's bookkeeping and timing metrics,
// the progress line, the profiler, the last step's stop): observers the trainer calls before and after every step,
// and what they are told of it (its start, its result, its timing).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace runner::train {

// Wall time of the parts of a step, in seconds. On a CUDA device the forward/backward, optimizer and EMA
// parts are measured with device events and are those of the latest step whose events have completed
// (reading them never waits for the device). A step replayed from a CUDA graph is timed as a whole, under
// forward_backward. batch_wait and between_steps are the host's time since the previous step returned: waiting
// for the loader's batch (at most its wait_seconds), and the rest of the loop's own work.
struct StepTiming {
  double forward_backward = 0;
  double optimizer = 0;
  double ema = 0;
  double batch_wait = 0;
  double between_steps = 0;
};

// What a step returns. The tensors stay on the device: nothing is read back unless the caller reads it.
struct StepResult {
  at::Tensor loss;        // float32 scalar: the mean of the micro-batch losses
  at::Tensor grad_norm;   // float32 scalar: the global L2 norm of the gradients before clipping (after unscaling)
  at::Tensor loss_scale;  // float32 [1] (fp16); undefined otherwise
  at::Tensor skipped;     // int64 scalar: optimizer steps skipped so far (non-finite values or fp16 overflow)
  double lr = 0;          // the first group's learning rate used by this step
  std::int64_t step = 0;  // optimizer steps done, this one included
};

// What observers learn of a step before it runs.
struct StepStart {
  std::int64_t step = 0;                   // the step about to run, 1-based
  std::optional<std::int64_t> batch_size;  // this rank's samples ("data"'s rows); unset for a step without a batch
  double batch_wait_seconds = 0;           // how long the loop waited for the loader's batch; 0 when unknown
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Before any work of the step. May throw (a stop request): the step does not run.
  virtual void before_step(const StepStart&) {}
  // After a completed step. May throw; the step itself is complete.
  virtual void after_step(const StepResult&) {}
};

}  // namespace runner::train
