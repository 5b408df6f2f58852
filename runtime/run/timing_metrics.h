// A trainer's step timings (train::StepTiming) logged into a run as time/<part>_ms metrics: the means over every
// kLogEvery steps and over the steps before the last one.
#pragma once

#include <cstdint>
#include <functional>

#include "runtime/run/run_context.h"
#include "runtime/train/trainer.h"

namespace runner::run {

class TimingMetrics : public train::StepObserver {
 public:
  static constexpr std::int64_t kLogEvery = 25;

  // `run()` is the run the step's timings go to at the end of each step (nullptr: none).
  TimingMetrics(train::Trainer& trainer, std::function<RunContext*()> run);
  void after_step(const train::StepResult& result) override;

 private:
  train::Trainer& trainer_;
  std::function<RunContext*()> run_;
  train::StepTiming sums_;
  std::int64_t steps_ = 0;
};

}  // namespace runner::run
