// What a trainer's steps log into a run by themselves: the learning rate of every step (`lr`, so that a change by
// the schedule or train:set_lr is on a curve) and the step timings (train::StepTiming) as time/<part>_ms, the means
// over every kTimingEvery steps and over those before the last step.
#pragma once

#include <cstdint>
#include <functional>

#include "runtime/run/run_context.h"
#include "runtime/train/trainer.h"

namespace runner::run {

class StepMetrics : public train::StepObserver {
 public:
  static constexpr std::int64_t kTimingEvery = 25;

  // `run()` is the run a step's values go to at its end (nullptr: none).
  StepMetrics(train::Trainer& trainer, std::function<RunContext*()> run);
  void after_step(const train::StepResult& result) override;

 private:
  train::Trainer& trainer_;
  std::function<RunContext*()> run_;
  train::StepTiming sums_;
  std::int64_t steps_ = 0;
};

}  // namespace runner::run
