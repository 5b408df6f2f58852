// A trainer's observers in one list: metrics, profiles, the progress line and the training run.
#include "runtime/run/trainer_observers.h"

#include <utility>

namespace runner::run {

std::shared_ptr<TrainerObservers> TrainerObservers::of(train::Trainer& trainer, std::function<RunContext*()> run) {
  for (const std::shared_ptr<train::StepObserver>& observer : trainer.observers())
    if (auto installed = std::dynamic_pointer_cast<TrainerObservers>(observer)) return installed;
  auto made = std::make_shared<TrainerObservers>(trainer, std::move(run));
  trainer.add_observer(made);
  return made;
}

TrainerObservers::TrainerObservers(train::Trainer& trainer, std::function<RunContext*()> run)
    : trainer_(trainer),
      run_(std::move(run)),
      metrics_(std::make_shared<StepMetrics>(trainer, [this] { return current_run(); })) {}

RunContext* TrainerObservers::current_run() const { return run_ ? run_() : training_run_; }

void TrainerObservers::show_progress(train::ProgressOptions options, std::FILE* out) {
  if (const auto sharding = trainer_.sharding_text()) options.sharding = *sharding;
  progress_ = std::make_shared<train::ProgressObserver>(options, trainer_.device(), out);
}

void TrainerObservers::profile(train::StepRange range) {
  const dist::ProcessGroup* group = trainer_.process_group();
  auto output = [this] {
    train::ProfileOutput out;
    if (RunContext* run = current_run()) {
      out.directory = run->directory();
      out.record = [run](const std::string& name, std::int64_t step) { run->record_file("profile", step, name); };
    }
    return out;
  };
  profiles_.push_back(std::make_shared<train::ProfiledSteps>(range, trainer_.device(), group ? group->rank() : 0,
                                                             group ? group->size() : 1, output));
}

void TrainerObservers::attach_training(train::StepObserver* training, RunContext* run) {
  training_ = training;
  training_run_ = training ? run : nullptr;
}

void TrainerObservers::before_step(const train::StepStart& start) {
  metrics_->before_step(start);
  for (const auto& profile : profiles_) profile->before_step(start);
  if (progress_) progress_->before_step(start);
  if (training_) training_->before_step(start);
}

void TrainerObservers::after_step(const train::StepResult& result) {
  metrics_->after_step(result);
  for (const auto& profile : profiles_) profile->after_step(result);
  if (progress_) progress_->after_step(result);
  if (training_) training_->after_step(result);
}

}  // namespace runner::run
