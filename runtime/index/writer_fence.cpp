// The checks that a process still holds the run attempt and the sweep trial it writes, run at the start of each of its
// write transactions.
#include "runtime/index/writer_fence.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <mutex>
#include <vector>

#include "runtime/core/exit_status.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/logging.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/run_store.h"

namespace runner::index {
namespace {

struct HeldOn {
  std::string index;
  RunFence fence;
};

// The attempts this process holds, read by every thread's write transactions. Never destroyed: a thread may still
// write while the process exits.
struct HeldAttempts {
  std::mutex mutex;
  std::vector<HeldOn> held;
};

HeldAttempts& held_attempts() {
  static auto* attempts = new HeldAttempts;
  return *attempts;
}

std::vector<RunFence> attempts_held_on(const std::string& index) {
  HeldAttempts& attempts = held_attempts();
  std::lock_guard lock(attempts.mutex);
  std::vector<RunFence> fences;
  for (const HeldOn& held : attempts.held)
    if (held.index == index) fences.push_back(held.fence);
  return fences;
}

// Ended here rather than thrown: the process's other threads (the metric writer, a checkpoint save) and its unwinding
// (the run's end, a checkpoint on stop) would write; the open transaction dies with the connection.
[[noreturn]] void stop_without_writing(const std::string& why) {
  core::log_to_file(core::LogLevel::error, why);
  std::fprintf(stderr, "runner: %s\n", core::terminal_text(why).c_str());
  std::fflush(stderr);
  std::_Exit(core::kExitTakenOver);
}

}  // namespace

std::optional<TrialFence> this_process_trial() {
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

std::optional<std::string> run_resumed_elsewhere(Database& db, const RunFence& fence) {
  // Locked for update, not shared: the run's own writes change its row, and two of them holding it shared (the metric
  // writer's heartbeat, a summary) would each wait for the other.
  Statement select = db.prepare(std::string("SELECT attempts FROM runs WHERE run = ?") + db.lock_rows());
  select.bind(1, fence.run);
  if (!select.step())
    return fmt::format("run {} is no longer in the index; this process stops without writing", fence.name);
  const int64_t attempt = select.integer(0);
  select.reset();
  if (attempt == fence.attempt) return std::nullopt;
  Statement host = db.prepare("SELECT host FROM attempts WHERE run = ? AND attempt = ?");
  host.bind(1, fence.run).bind(2, attempt);
  const std::string by = host.step() ? "by host " + host.text(0) : std::string("by another process");
  return fmt::format(
      "run {} was resumed {} (attempt {}, this process has attempt {}); this process stops without "
      "writing",
      fence.name, by, attempt, fence.attempt);
}

HeldAttempt::HeldAttempt(const Database& db, RunFence fence)
    : index_(db.path()), run_(fence.run), attempt_(fence.attempt) {
  HeldAttempts& attempts = held_attempts();
  std::lock_guard lock(attempts.mutex);
  // A later attempt of the run made by this process replaces the earlier one.
  std::erase_if(attempts.held, [&](const HeldOn& held) { return held.index == index_ && held.fence.run == run_; });
  attempts.held.push_back({index_, std::move(fence)});
}

HeldAttempt::~HeldAttempt() {
  HeldAttempts& attempts = held_attempts();
  std::lock_guard lock(attempts.mutex);
  std::erase_if(attempts.held, [&](const HeldOn& held) {
    return held.index == index_ && held.fence.run == run_ && held.fence.attempt == attempt_;
  });
}

void fence_this_process(Database& db) {
  db.set_write_check([trial = this_process_trial()](Database& db) {
    if (trial)
      if (const std::optional<std::string> lost = trial_taken_over(db, *trial)) stop_without_writing(*lost);
    for (const RunFence& fence : attempts_held_on(db.path()))
      if (const std::optional<std::string> lost = run_resumed_elsewhere(db, fence)) stop_without_writing(*lost);
  });
}

void check_write_access(Database& db) {
  with_transaction(
      db, [] {}, TransactionScope::own_rows);
}

}  // namespace runner::index
