// What runs around each trainer step without being part of it (a training run's bookkeeping and timing metrics,
// the progress line, the profiler, the last step's stop): observers the trainer calls before and after every step.
#pragma once

#include <cstdint>
#include <optional>

namespace runner::train {

struct StepResult;

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
