// What watches a trainer's steps, installed on the trainer once and called in one order: the step metrics logged
// into the run (step_metrics.h), the profiled step ranges, the progress line, and the training run's bookkeeping
// (checkpoints and stops, training_run.h) while one is attached. The run they write to is given once: a function
// that names it at each step (a script's active run), or else the attached training run's.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/run/run_context.h"
#include "runtime/run/step_metrics.h"
#include "runtime/train/progress_observer.h"
#include "runtime/train/step_observer.h"
#include "runtime/train/step_profiler.h"
#include "runtime/train/trainer.h"

namespace runner::run {

class TrainerObservers : public train::StepObserver {
 public:
  // The trainer's observers: the ones installed on it, or new ones installed now with `run` (empty: the attached
  // training run's).
  static std::shared_ptr<TrainerObservers> of(train::Trainer& trainer, std::function<RunContext*()> run = {});

  TrainerObservers(train::Trainer& trainer, std::function<RunContext*()> run);

  // The progress line after every step from now on, in place of an earlier one (its sharding text the trainer's).
  void show_progress(train::ProgressOptions options, std::FILE* out = stdout);
  train::ProgressObserver* progress() const { return progress_.get(); }
  // Steps `range` profiled; the trace goes into the run's folder (recorded as its artifact) or, without a run, the
  // working directory.
  void profile(train::StepRange range);
  // The training run's bookkeeping from now on (nullptr: none), and the run it writes to.
  void attach_training(train::StepObserver* training, RunContext* run);

  void before_step(const train::StepStart& start) override;
  void after_step(const train::StepResult& result) override;

 private:
  RunContext* current_run() const;

  train::Trainer& trainer_;
  std::function<RunContext*()> run_;
  std::shared_ptr<StepMetrics> metrics_;
  std::vector<std::shared_ptr<train::ProfiledSteps>> profiles_;
  std::shared_ptr<train::ProgressObserver> progress_;
  train::StepObserver* training_ = nullptr;
  RunContext* training_run_ = nullptr;
};

}  // namespace runner::run
