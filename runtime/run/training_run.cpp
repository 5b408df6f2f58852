// A training run: checkpoints, restore, save reports and graceful stops.
#include "runtime/run/training_run.h"

#include "runtime/core/enum_table.h"
#include "runtime/dist/process_group.h"

#include <csignal>
#include <chrono>
#include <cstdio>
#include <thread>
#include <fmt/format.h>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/ckpt/staged_files.h"
#include "runtime/core/clock.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/logging.h"
#include "runtime/core/open_line.h"
#include "runtime/index/run_store.h"
#include "runtime/run/checkpoint_format.h"
#include "runtime/train/rng_state.h"

namespace runner::run {
namespace {

// run:stop() where before_next_step counts stop signals: above every signal number.
constexpr int kStopRequested = 1000;

std::string signal_name(int signal_number) {
  return signal_number == kStopRequested ? "run:stop()" : core::signal_name(signal_number);
}

void log_rejected(const std::vector<std::string>& rejected, const std::string& of) {
  for (const auto& message : rejected)
    core::log(core::LogLevel::warn, fmt::format("checkpoint{} skipped, it is damaged: {}", of, message));
}

}  // namespace

class TrainingRun::Observer : public train::StepObserver {
 public:
  explicit Observer(TrainingRun& run) : run_(run) {}
  void before_step(const train::StepStart&) override { run_.before_next_step(); }
  void after_step(const train::StepResult& result) override { run_.after_step(result); }

 private:
  TrainingRun& run_;
};

CheckpointFailurePolicy parse_checkpoint_failure_policy(const std::string& name) {
  static const core::EnumTable<CheckpointFailurePolicy, 2> kPolicies{
      {{{CheckpointFailurePolicy::stop, "stop"}, {CheckpointFailurePolicy::continue_, "continue"}}},
      core::NameQuotes::single,
      "on_error must be {list}, got '{got}'"};
  return kPolicies.parse(name);
}

TrainingRun::TrainingRun(RunContext& run, std::shared_ptr<train::Trainer> trainer, std::shared_ptr<data::Loader> loader,
                         NamedStateFunction named_state, CheckpointPolicy policy)
    : run_(run),
      trainer_(std::move(trainer)),
      loader_(std::move(loader)),
      named_state_(std::move(named_state)),
      policy_(std::move(policy)) {
  const ckpt::RotationPolicy& rotation = policy_.rotation;
  if (rotation.keep_last < 0 || rotation.keep_best < 0)
    throw std::invalid_argument("keep_last and keep_best must be 0 or more");
  if (rotation.keep_last == 0 && rotation.keep_best == 0)
    throw std::invalid_argument("keep_last and keep_best cannot both be 0");
  saver_ =
      std::make_unique<ckpt::CheckpointSaver>(run_.index_location(), run_.record().run, run_.directory(), rotation);
  if (run_.follower() && trainer_->shards())
    staged_writer_ = std::make_unique<ckpt::StagedFileWriter>(run_.directory());
  observer_ = std::make_shared<Observer>(*this);
  observers_ = TrainerObservers::of(*trainer_);
  observers_->attach_training(observer_.get(), &run_);
  // Data parallel ranks agree on a stop once per step, before the trainer's step: the loader does not check.
  if (loader_ && !distributed()) loader_->set_before_next([this] { before_next_step(); });
  if (loader_ && run_.system_metrics()) run_.system_metrics()->attach_loader(loader_);
  core::set_graceful_stop(true);
}

TrainingRun::~TrainingRun() {
  observers_->attach_training(nullptr, nullptr);
  if (loader_) loader_->set_before_next(nullptr);
  if (loader_ && run_.system_metrics()) run_.system_metrics()->attach_loader(nullptr);
  core::set_graceful_stop(false);
  saver_->wait();
  if (staged_writer_) staged_writer_->wait();
}

std::optional<TrainingRun::Restored> TrainingRun::restore() {
  if (!run_.follower()) {
    const ckpt::StaleWrites stale = ckpt::clean_stale_writes(run_.directory());
    for (const std::string& path : stale.removed)
      core::log(core::LogLevel::info, fmt::format("{} deleted (a checkpoint write that never finished)", path));
    for (const std::string& path : stale.recovered)
      core::log(core::LogLevel::warn, fmt::format("{} moved back into place (its replacement never finished)", path));
  }
  if (distributed())
    trainer_->process_group()->barrier();  // rank 0 has cleaned up; every rank reads the same checkpoint
  ckpt::RestoreChoice choice = ckpt::choose_checkpoint(run_.database(), run_.record().run, run_.directory());
  log_rejected(choice.rejected, "");
  if (!choice.checkpoint && run_.fork()) {
    const index::RunRecord& source = *run_.fork();
    choice = ckpt::choose_checkpoint(run_.database(), source.run, run_.home() + "/" + source.dir);
    log_rejected(choice.rejected, " of " + source.name);
    if (!choice.checkpoint)
      throw std::invalid_argument(fmt::format("run {} has no good checkpoint to fork from", source.name));
  }
  if (!choice.checkpoint) return std::nullopt;
  const dist::ProcessGroup* group = trainer_->process_group();
  RestoredTraining restored =
      restore_training(choice.directory, *trainer_, group ? group->rank() : 0, group ? group->size() : 1);
  if (loader_ && restored.loader) loader_->restore(*restored.loader);
  run_.continue_from(restored.step);
  core::log(core::LogLevel::info, fmt::format("restored {}: continuing at step {}", choice.directory, restored.step));
  return Restored{restored.step, choice.directory, std::move(restored.named_state)};
}

double TrainingRun::checkpoint(const CheckpointRequest& request) {
  trainer_->raise_pending_stop();  // on_nonfinite = "stop": a checkpoint after a stopped step would hide it
  trainer_->check_ranks_agree();   // a checkpoint of ranks that diverged would hide it
  // Rank 0 saves the state, which is the same on every rank, and every rank's random generators.
  std::vector<train::NamedTensorList> rank_rng_states;
  if (distributed())
    for (const std::string& bytes :
         trainer_->process_group()->all_gather_bytes(train::encode_rng_states(train::capture_rng_states())))
      rank_rng_states.push_back(train::decode_rng_states(bytes));
  // Sharded, every rank writes its rows of the optimizer state and EMAs.
  const bool every_rank_writes = trainer_->shards() != nullptr;
  if (run_.follower() && !every_rank_writes) return 0.0;
  if (!run_.follower()) report_saves(false);
  // This step is saved already (e.g. by `every` in the loop, then once more after it): the state is the same.
  bool saved_already = last_checkpoint_step_ == run_.step() && !request.value;
  if (every_rank_writes)  // rank 0 decides for every rank
    saved_already = trainer_->process_group()->broadcast_text(saved_already ? "saved" : "save", 0) == "saved";
  if (saved_already) {
    if (request.wait && !run_.follower()) report_saves(true);
    return 0.0;
  }
  const double start = core::steady_seconds();
  if (run_.follower()) {
    staged_writer_->wait();
    for (const std::string& error : staged_writer_->take_errors())
      core::log(core::LogLevel::error, fmt::format("this rank's share of a checkpoint could not be saved: {}", error));
    TrainingSnapshot snapshot = snapshot_rank_shard(*trainer_);
    staged_writer_->submit(run_.step(), std::move(snapshot.files), std::move(snapshot.wait_ready));
    if (request.wait) staged_writer_->wait();
    return core::steady_seconds() - start;
  }
  saver_->wait();
  const nlohmann::json named_state = named_state_ ? named_state_() : nlohmann::json::object();
  TrainingSnapshot snapshot =
      snapshot_training(*trainer_, loader_.get(), named_state, rank_rng_states, run_.directory(), run_.step());
  ckpt::SaveRequest save;
  save.step = run_.step();
  save.files = std::move(snapshot.files);
  save.wait_ready = std::move(snapshot.wait_ready);
  save.manifest_extra = std::move(snapshot.manifest_extra);
  save.manifest_extra["run"] = run_.record().id;
  // A resume starts after this step: every value logged up to it must be in the index before it counts.
  save.before_record = [&metrics = run_.metrics()] { metrics.flush(); };
  save.metric = request.metric ? request.metric : policy_.metric;
  save.metric_value = request.value;
  saver_->submit(std::move(save));
  last_checkpoint_step_ = run_.step();
  const double stall = core::steady_seconds() - start;
  stalls_[run_.step()] = stall;
  run_.metrics().log("time/checkpoint_stall_ms", run_.step(), stall * 1000, index::now_seconds());
  if (request.wait) report_saves(true);
  return stall;
}

void TrainingRun::report_saves(bool wait) {
  if (wait) saver_->wait();
  for (const ckpt::SaveReport& report : saver_->take_reports()) {
    if (report.error) {
      if (last_checkpoint_step_ == report.step) last_checkpoint_step_.reset();  // a later call may try again
      const std::string message = fmt::format("checkpoint {} could not be saved: {}", report.path, *report.error);
      if (policy_.on_error == CheckpointFailurePolicy::continue_) {
        core::log(core::LogLevel::error, message + " (the run continues; the previous checkpoint is intact)");
        continue;
      }
      throw std::runtime_error(message + " (the previous checkpoint is intact)");
    }
    const auto stall = stalls_.find(report.step);
    core::log(core::LogLevel::info,
              fmt::format("checkpoint {} saved: {:.1f} MB in {:.2f} s (stall {:.1f} ms)", report.path,
                          static_cast<double>(report.bytes) / 1e6, report.write_seconds,
                          stall == stalls_.end() ? 0.0 : stall->second * 1000));
    if (stall != stalls_.end()) stalls_.erase(stall);
    for (const auto& dropped : report.dropped)
      core::log(core::LogLevel::info, fmt::format("checkpoint {} deleted (rotation)", dropped));
    for (const auto& problem : report.undeleted)
      core::log(
          core::LogLevel::warn,
          fmt::format(
              "a checkpoint rotation dropped is no longer listed but its files stay ({}); `runner gc` deletes them",
              problem));
  }
}

void TrainingRun::after_step(const train::StepResult& result) {
  ++steps_taken_;
  if (steps_taken_ == 1 && trainer_->shards()) {  // runner show: how the state was split
    const train::Trainer::StateBytes bytes = trainer_->state_bytes();
    run_.merge_summary({{"shard", dist::shard_mode_name(trainer_->shards()->mode())},
                        {"model_state_mb_per_rank", static_cast<double>(bytes.total()) / 1e6}});
  }
  run_.set_step(result.step);
  report_saves(false);
}

void TrainingRun::before_next_step() {
  int signal_number = core::stop_signal();
  if (signal_number == 0 && stop_requested_) signal_number = kStopRequested;
  bool pause = run_.pause_due();
  // A stop signal or run:stop() on any rank stops every rank after the same step (they outrank a sweep's pause,
  // which outranks an answer to runner attach: rank 0's client waits a step more).
  if (distributed()) {
    const bool attach = attach_waiting_ && attach_waiting_();
    const std::int64_t combined = trainer_->process_group()->max(signal_number != 0 ? 4 * signal_number
                                                                 : pause            ? 2
                                                                 : attach           ? 1
                                                                                    : 0);
    signal_number = static_cast<int>(combined / 4);
    pause = combined == 2;
    attach_turn_ = combined == 1;
  }
  if (signal_number != 0)
    stop(signal_name(signal_number), signal_number == SIGINT ? core::kExitInterrupted : core::kExitOk);
  if (pause) stop("the sweep's ASHA rung", core::kExitOk, "paused");
}

void TrainingRun::end_attach_turn() {
  if (!attach_turn_) return;
  attach_turn_ = false;
  dist::ProcessGroup& group = *trainer_->process_group();
  const std::string key = fmt::format("runner/attach_turn/{}", attach_turns_++);
  if (group.rank() == 0) {
    group.set_note(key, "answered");
    return;
  }
  const double start = core::steady_seconds();
  bool said = false;
  while (!group.note(key)) {
    if (!said && core::steady_seconds() - start > 10) {
      core::log(core::LogLevel::info, fmt::format("rank {} waits for rank 0, which answers runner attach after step {}",
                                                  group.rank(), run_.step()));
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void TrainingRun::stop(const std::string& name, int exit_status, const std::string& status) {
  std::string reason;
  core::end_open_line();
  if (steps_taken_ == 0) {
    // Nothing changed since the start (or the restored checkpoint): there is nothing to save.
    std::fprintf(stderr, "%s: stopping before the first step\n", name.c_str());
    reason = fmt::format("stopped by {} at step {} before the first step", name, run_.step());
  } else {
    std::fprintf(stderr, "%s: saving a checkpoint at step %lld before stopping\n", name.c_str(),
                 static_cast<long long>(run_.step()));
    std::fflush(stderr);
    checkpoint({std::nullopt, std::nullopt, /*wait=*/true});  // reuses a save of this step by the loop body
    reason = fmt::format("stopped by {} at step {} after saving a checkpoint", name, run_.step());
  }
  run_.finish(status, reason);
  throw core::ExitRequest(exit_status, reason);
}

std::optional<std::string> TrainingRun::finish() {
  core::set_graceful_stop(false);
  std::optional<std::string> failure;
  try {
    trainer_->raise_pending_stop();  // on_nonfinite = "stop" after the last step
  } catch (const train::NonFiniteError& error) {
    failure = error.what();
  }
  if (staged_writer_) {
    staged_writer_->wait();
    for (const std::string& error : staged_writer_->take_errors())
      core::log(core::LogLevel::error, fmt::format("this rank's share of a checkpoint could not be saved: {}", error));
  }
  try {
    report_saves(true);
  } catch (const std::exception& error) {
    return failure ? *failure + "; " + error.what() : std::string(error.what());
  }
  return failure;
}

}  // namespace runner::run
