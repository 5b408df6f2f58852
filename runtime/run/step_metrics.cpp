// The learning rate and step timings as metrics of a run.
#include "runtime/run/step_metrics.h"

#include "runtime/index/run_store.h"

namespace runner::run {

StepMetrics::StepMetrics(train::Trainer& trainer, std::function<RunContext*()> run)
    : trainer_(trainer), run_(std::move(run)) {}

void StepMetrics::after_step(const train::StepResult& result) {
  RunContext* run = run_();
  if (run == nullptr) return;
  const double now = index::now_seconds();
  run->log_metric("lr", result.step, result.lr, now);
  const train::StepTiming timing = trainer_.timing();
  sums_.batch_wait += timing.batch_wait;
  sums_.between_steps += timing.between_steps;
  sums_.forward_backward += timing.forward_backward;
  sums_.optimizer += timing.optimizer;
  sums_.ema += timing.ema;
  ++steps_;
  if (result.step % kTimingEvery != 0 && result.step != trainer_.step_options().steps) return;
  const double scale = 1000.0 / static_cast<double>(steps_);
  run->log_metric("time/batch_wait_ms", result.step, sums_.batch_wait * scale, now);
  run->log_metric("time/between_steps_ms", result.step, sums_.between_steps * scale, now);
  run->log_metric("time/forward_backward_ms", result.step, sums_.forward_backward * scale, now);
  run->log_metric("time/optimizer_ms", result.step, sums_.optimizer * scale, now);
  run->log_metric("time/ema_ms", result.step, sums_.ema * scale, now);
  sums_ = {};
  steps_ = 0;
}

}  // namespace runner::run
