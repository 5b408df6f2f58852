// The check that a sweep trial's process still holds its trial, run at the start of each of its write transactions.
#include "runtime/index/trial_fence.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>

#include "runtime/core/exit_status.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/logging.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/run_store.h"

namespace runner::index {

std::optional<TrialFence> this_process_fence() {
  const core::LaunchContext& context = core::launch_context();
  if (!context.sweep || !context.trial || !context.trial_generation) return std::nullopt;
  return TrialFence{*context.sweep, *context.trial, *context.trial_generation};
}

std::string taken_over_by(Database& db, int64_t sweep, int64_t trial, int64_t lost_pid) {
  Statement holder = db.prepare("SELECT worker FROM trials WHERE sweep = ? AND trial = ? AND status = 'running'");
  holder.bind(1, sweep).bind(2, trial);
  if (holder.step() && !holder.is_null(0)) {
    const std::string worker = holder.text(0);
    return "by host " + worker.substr(0, worker.rfind(':'));
  }
  holder.reset();
  Statement latest = db.prepare(
      "SELECT a.host FROM attempts a JOIN runs r ON r.run = a.run WHERE r.sweep = ? AND r.trial = ? AND NOT "
      "(a.host = ? AND a.pid = ?) ORDER BY a.started_at DESC LIMIT 1");
  latest.bind(1, sweep).bind(2, trial).bind(3, host_name()).bind(4, lost_pid);
  if (latest.step()) return "by host " + latest.text(0);
  return "by another worker";
}

std::optional<std::string> trial_taken_over(Database& db, const TrialFence& fence) {
  Statement select =
      db.prepare(std::string("SELECT generation FROM trials WHERE sweep = ? AND trial = ?") + db.lock_rows_shared());
  select.bind(1, fence.sweep).bind(2, fence.trial);
  const bool found = select.step();
  if (found && select.integer(0) == fence.generation) return std::nullopt;
  const int64_t generation = found ? select.integer(0) : 0;
  select.reset();
  Statement name = db.prepare("SELECT name FROM sweeps WHERE sweep = ?");
  name.bind(1, fence.sweep);
  const std::string sweep = name.step() ? name.text(0) : std::to_string(fence.sweep);
  if (!found)
    return fmt::format("trial {} of sweep {} is no longer in the index; this process stops without writing",
                       fence.trial, sweep);
  const std::string by = taken_over_by(db, fence.sweep, fence.trial, ::getpid());
  return fmt::format(
      "trial {} of sweep {} was taken over {} (generation {}, this process has {}); this process stops "
      "without writing",
      fence.trial, sweep, by, generation, fence.generation);
}

void fence_this_process(Database& db) {
  const std::optional<TrialFence> fence = this_process_fence();
  if (!fence) return;
  db.set_write_check([fence = *fence](Database& db) {
    const std::optional<std::string> lost = trial_taken_over(db, fence);
    if (!lost) return;
    // Ended here rather than thrown: the process's other threads (the metric writer, a checkpoint save) and its
    // unwinding (the run's end, a checkpoint on stop) would write; the open transaction dies with the connection.
    core::log_to_file(core::LogLevel::error, *lost);
    std::fprintf(stderr, "runner: %s\n", core::terminal_text(*lost).c_str());
    std::fflush(stderr);
    std::_Exit(core::kExitTrialTakenOver);
  });
}

void check_write_access(Database& db) {
  with_transaction(db, [] {});
}

}  // namespace runner::index
