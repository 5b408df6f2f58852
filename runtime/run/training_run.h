// A run that trains: the trainer, loader and named state a checkpoint holds, attached to a RunContext (whose system
// metrics sample the loader while attached).
// It saves checkpoints (the stall on the training thread, the files on a background thread), restores the
// newest good one, reports finished saves, and acts on a stop request (SIGINT/SIGTERM/SIGUSR1/SIGHUP) when
// the script asks for its next step or next batch, so the loop body of the last step (its metrics) has run:
// checkpoint, mark the run interrupted, end the process (core::ExitRequest).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/ckpt/checkpoint_rotation.h"
#include "runtime/ckpt/checkpoint_store.h"
#include "runtime/ckpt/staged_files.h"
#include "runtime/data/loader.h"
#include "runtime/run/run_context.h"
#include "runtime/run/trainer_observers.h"
#include "runtime/train/trainer.h"

namespace runner::run {

enum class CheckpointFailurePolicy {
  stop,       // on_error = "stop": a failed save is raised at the next step (the previous checkpoint is intact)
  continue_,  // on_error = "continue": a failed save is logged and the run goes on
};
CheckpointFailurePolicy parse_checkpoint_failure_policy(const std::string& name);  // "stop" or "continue"

struct CheckpointPolicy {
  ckpt::RotationPolicy rotation;      // keep_last 3, keep_best 0, "min"
  std::optional<std::string> metric;  // what keep_best ranks by, unless a checkpoint names its own
  CheckpointFailurePolicy on_error = CheckpointFailurePolicy::stop;
};

struct CheckpointRequest {
  std::optional<std::string> metric;
  std::optional<double> value;
  bool wait = false;  // return once the files are written, verified and indexed
};

// The script's named state objects (early stopping, counters) as a JSON object, collected at each save.
using NamedStateFunction = std::function<nlohmann::json()>;

class TrainingRun {
 public:
  // From now on the first stop signal waits for the end of the step (core::set_graceful_stop). `loader`
  // and `named_state` may be empty. Throws std::invalid_argument for a bad policy.
  TrainingRun(RunContext& run, std::shared_ptr<train::Trainer> trainer, std::shared_ptr<data::Loader> loader,
              NamedStateFunction named_state, CheckpointPolicy policy);
  ~TrainingRun();  // waits for the save in flight, detaches from the trainer, graceful stops off
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  struct Restored {
    std::int64_t step = 0;
    std::string directory;
    nlohmann::json named_state = nlohmann::json::object();  // name -> state, for the script's objects
  };
  // Continues from the newest good checkpoint of this run, or else of the run it forks; damaged ones are
  // logged and skipped. Restores the trainer and the loader and sets the run's step; nothing when there
  // is no checkpoint. Throws when the forked run has no good checkpoint.
  std::optional<Restored> restore();

  // Saves the state at the run's step; returns the stall in seconds (also logged as time/checkpoint_stall_ms).
  // The previous save is waited for first (part of the stall). Raises a previous save's failure first
  // under CheckpointFailurePolicy::stop. A step saved already is not saved again (0 stall) unless the
  // request ranks it by a metric value.
  double checkpoint(const CheckpointRequest& request = {});

  // After each trainer step (its observer calls it): the run's step and finished saves.
  void after_step(const train::StepResult& result);
  // Before the trainer's next step and the attached loader's next batch (they call it): a pending stop
  // ends the run here, with a checkpoint when a step was taken since the start.
  void before_next_step();

  // run:stop(): the run stops before the next step as on a stop signal (a checkpoint, status interrupted, exit
  // status 0). On every rank of a data-parallel job, at the same step: the ranks agree on stops there.
  void request_stop() { stop_requested_ = true; }

  // Waits for the save in flight and reports it; graceful stops off. Returns the failure of a save when the
  // policy stops on failed saves (the run must then fail with it); under continue_ it is logged.
  std::optional<std::string> finish();

  // runner attach in a data-parallel job. Rank 0 answers a client only after a step whose start every rank agreed
  // on it (the agreement on stops carries it: `waiting` on rank 0 says a request is there), and the other ranks wait
  // for it at the end of that step, outside every collective, so that no collective times out however long rank 0
  // answers (a chunk in one long C call included).
  void set_attach_waiting(std::function<bool()> waiting) { attach_waiting_ = std::move(waiting); }
  // Whether the step that just ran is followed by rank 0 answering runner attach (on every rank).
  bool attach_turn() const { return attach_turn_; }
  // Ends the turn: rank 0 says it has answered (in the job's store); the other ranks wait for that, logging once
  // after 10 s what they wait for.
  void end_attach_turn();

  // Whether the trainer is one rank of several (a data-parallel job).
  bool distributed() const { return trainer_->process_group() != nullptr; }

  train::Trainer& trainer() { return *trainer_; }
  const CheckpointPolicy& policy() const { return policy_; }

 private:
  class Observer;
  void report_saves(bool wait);
  // Saves a checkpoint (when a step was taken), ends the run with `status` (interrupted, or paused at a sweep's
  // ASHA rung) "stopped by <name> at step N ..." and ends the process with exit_status.
  [[noreturn]] void stop(const std::string& name, int exit_status, const std::string& status = "interrupted");

  RunContext& run_;
  std::shared_ptr<train::Trainer> trainer_;
  std::shared_ptr<data::Loader> loader_;
  NamedStateFunction named_state_;
  CheckpointPolicy policy_;
  std::unique_ptr<ckpt::CheckpointSaver> saver_;
  std::unique_ptr<ckpt::StagedFileWriter> staged_writer_;  // sharded, ranks > 0: their share of each checkpoint
  std::shared_ptr<Observer> observer_;                     // of the trainer's steps, while attached
  std::shared_ptr<TrainerObservers> observers_;            // the trainer's, which call observer_
  std::map<std::int64_t, double> stalls_;                  // by step, for the saved messages
  std::int64_t steps_taken_ = 0;                           // trainer steps in this process
  std::optional<std::int64_t> last_checkpoint_step_;
  bool stop_requested_ = false;
  std::function<bool()> attach_waiting_;
  bool attach_turn_ = false;
  std::int64_t attach_turns_ = 0;  // turns ended, the same on every rank: each one's key in the store
};

}  // namespace runner::run
