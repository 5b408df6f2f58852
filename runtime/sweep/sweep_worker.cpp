// The sweep worker's loop: slots, trial processes, stop signals, trial ends and the event lines.
#include "runtime/sweep/sweep_worker.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fstream>
#include <optional>
#include <thread>
#include <type_traits>

#include "runtime/core/byte_size_text.h"
#include "runtime/core/child_process.h"
#include "runtime/core/device.h"
#include "runtime/core/duration_text.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/shell_word.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_removal.h"
#include "runtime/index/run_store.h"
#include "runtime/index/writer_fence.h"
#include "runtime/sweep/host_leases.h"

namespace runner::sweep {
namespace {

using nlohmann::json;

// After a trial stopped for want of disk space, no trial starts for this long (the space may come back).
constexpr int kStorageFullWaitSeconds = 10;

struct Running {
  std::int64_t trial = 0;
  std::int64_t generation = 0;  // of the claim it runs under
  bool lost = false;            // taken over by another worker while this one was silent
  pid_t pid = -1;
  std::optional<std::int64_t> pause_step;
  std::string log_path;
  double started = 0;
  bool stop_sent = false;
  TrialLease lease;                // its cores and GPUs
  std::optional<int> wait_status;  // once it exited and was reaped, until its end is recorded
};

std::string params_text(const json& params) {
  std::string text;
  for (const auto& [key, value] : params.items()) text += (text.empty() ? "" : " ") + key + "=" + override_text(value);
  return text;
}

std::string value_text(const std::optional<double>& value) {
  if (!value) return "-";
  return fmt::format("{:.6g}", *value);
}

void say(const std::string& line) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char stamp[16];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &local);
  std::printf("[%s] %s\n", stamp, core::terminal_text(line).c_str());
  std::fflush(stdout);
}

std::string counts_text(const SweepRecord& sweep, const std::vector<TrialRecord>& trials) {
  const SweepCounts c = count_trials(sweep, trials);
  std::string text = fmt::format("running {}, queued {}", c.running, c.queued);
  if (c.paused) text += fmt::format(", paused {}", c.paused);
  if (c.stopped) text += fmt::format(", stopped {}", c.stopped);
  text += fmt::format(", done {}, pruned {}, failed {}", c.finished, c.pruned, c.failed);
  if (c.best_trial)
    text += fmt::format(" | best {} {} (trial {})", sweep.spec.metric, value_text(c.best_value), *c.best_trial);
  return text;
}

std::string last_lines(const std::string& path, size_t count) {
  std::ifstream file(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(file, line)) {
    if (line.empty()) continue;
    lines.push_back(line);
    if (lines.size() > count) lines.pop_front();
  }
  std::string text;
  for (const std::string& kept : lines) text += "\n  " + kept;
  return text;
}

void make_directories(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      throw std::runtime_error(fmt::format("{}: cannot create the directory: {}", prefix, std::strerror(errno)));
    if (slash == std::string::npos) break;
  }
}

// The GPUs of this worker's slots: those it was given (CUDA_VISIBLE_DEVICES, a Slurm allocation's), else all of the
// host's; at most as many as CUDA sees.
std::vector<std::string> visible_gpus() {
  const int count = core::cuda_device_count();
  std::vector<std::string> ids;
  if (count <= 0) return ids;
  if (const auto& given = core::launch_context().given_gpus) {
    ids.assign(given->begin(), given->begin() + std::min<std::ptrdiff_t>(std::ssize(*given), count));
  } else {
    for (int i = 0; i < count; ++i) ids.push_back(std::to_string(i));
  }
  return ids;
}

Running start_trial(const index::IndexLocation& where, const SweepRecord& sweep, const Claim& claim, TrialLease lease,
                    const std::string& log_directory, index::Database& db) {
  const SweepSpec& spec = sweep.spec;
  core::ChildProcess child;
  if (spec.gpus_per_trial > 1) child.arguments = {"--nproc", std::to_string(spec.gpus_per_trial)};
  if (claim.resume_run) {
    child.arguments.push_back("--resume");
    child.arguments.push_back(index::load_run(db, *claim.resume_run).id);
  } else {
    child.arguments.push_back("--fresh");
  }
  child.arguments.push_back(spec.script);
  for (const std::string& item : trial_overrides(spec, claim.trial.params)) child.arguments.push_back(item);
  child.environment = {{"RUNNER_HOME", where.home},
                       {"RUNNER_SWEEP", std::to_string(sweep.sweep)},
                       {"RUNNER_TRIAL", std::to_string(claim.trial.trial)},
                       {"RUNNER_TRIAL_GENERATION", std::to_string(claim.trial.generation)},
                       {"OMP_NUM_THREADS", std::to_string(lease.threads())},
                       {"RUNNER_CORES", std::to_string(lease.threads())},
                       {"RUNNER_NO_BROWSER", "1"}};
  if (!lease.gpus().empty())
    child.environment["CUDA_VISIBLE_DEVICES"] = fmt::format("{}", fmt::join(lease.gpus(), ","));
  child.cpus = lease.cpus();
  if (!where.url.empty()) child.environment["RUNNER_INDEX"] = where.url;
  // A trial is one process (or the ranks of its --nproc), not a task of the worker's Slurm job.
  for (const char* task_variable : {"SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"})
    child.environment[task_variable] = "";
  if (claim.pause_step) child.environment["RUNNER_SWEEP_PAUSE"] = fmt::format("{}@{}", spec.metric, *claim.pause_step);

  Running running;
  running.trial = claim.trial.trial;
  running.generation = claim.trial.generation;
  running.pause_step = claim.pause_step;
  running.log_path = fmt::format("{}/trial-{:04d}.log", log_directory, claim.trial.trial);
  const int fd = ::open(running.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  if (fd < 0)
    throw std::runtime_error(
        fmt::format("{}: cannot open the trial's log: {}", running.log_path, std::strerror(errno)));
  const std::string banner =
      fmt::format("==== trial {} ({}): runner {}\n", claim.trial.trial, claim.reason, fmt::join(child.arguments, " "));
  [[maybe_unused]] const ssize_t written = ::write(fd, banner.data(), banner.size());
  child.output_fd = fd;
  try {
    running.pid = core::start_child(child);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  running.started = index::now_seconds();
  running.lease = std::move(lease);
  return running;
}

std::string ended_text(const TrialRecord& trial, const SweepSpec& spec, const Running& running,
                       const std::string& how) {
  const std::string took = core::duration_text(index::now_seconds() - running.started);
  if (trial.status == "finished")
    return fmt::format("trial {} finished: {} {} at step {} in {}", trial.trial, spec.metric, value_text(trial.metric),
                       trial.step, took);
  if (trial.status == "paused")
    return fmt::format(
        "trial {} reached rung {} at step {}: {} {} (paused with a checkpoint; goes on if it ranks in the "
        "best 1/{})",
        trial.trial, trial.rung, trial.step, spec.metric, value_text(trial.metric),
        spec.asha ? spec.asha->reduction : 1);
  if (trial.status == "stopped" && trial.error)
    return fmt::format("trial {} was {}: it goes on from its last checkpoint (retry {} of {})", trial.trial,
                       *trial.error, trial.retries, spec.retries);
  if (trial.status == "stopped")
    return fmt::format("trial {} stopped at step {} (continues from its checkpoint when the sweep runs again)",
                       trial.trial, trial.step);
  return fmt::format("trial {} failed ({}): {}{}", trial.trial, how, trial.error.value_or("no error recorded"),
                     last_lines(running.log_path, 12));
}

// What the sweep's failed trials that a later worker continues (continuable_out_of_space) are told, none without.
std::optional<std::string> out_of_space_text(const SweepSpec& spec, const std::vector<TrialRecord>& trials) {
  std::vector<std::int64_t> numbers;
  for (const TrialRecord& trial : continuable_out_of_space(spec, trials)) numbers.push_back(trial.trial);
  if (numbers.empty()) return std::nullopt;
  const bool one = numbers.size() == 1;
  return fmt::format(
      "trial{} {} failed for want of disk space: once space is freed, the same command (or runner sweep --join {}) "
      "continues {} from {} last checkpoint{}",
      one ? "" : "s", fmt::join(numbers, ", "), spec.name, one ? "it" : "them", one ? "its" : "their", one ? "" : "s");
}

// An exported OMP_NUM_THREADS: every trial's thread count, whatever the other workers on the host.
std::optional<int> exported_thread_count() {
  const char* text = std::getenv("OMP_NUM_THREADS");
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long threads = std::strtol(text, &end, 10);
  if (*end != '\0' || errno != 0 || threads < 1 || threads > 4096)
    throw std::runtime_error(fmt::format(
        "OMP_NUM_THREADS='{}' is not a whole number of threads from 1 to 4096 (each trial's threads)", text));
  return static_cast<int>(threads);
}

std::string lease_text(const TrialLease& lease) {
  std::string text = fmt::format("{} thread{}", lease.threads(), lease.threads() == 1 ? "" : "s");
  if (!lease.cpus().empty())
    text += fmt::format(" on CPU{} {}", lease.cpus().size() == 1 ? "" : "s", fmt::join(lease.cpus(), ","));
  if (!lease.gpus().empty())
    text += fmt::format(", GPU{} {}", lease.gpus().size() == 1 ? "" : "s", fmt::join(lease.gpus(), ","));
  return text;
}

}  // namespace

std::vector<Slot> sweep_slots(const SweepSpec& spec) {
  std::vector<Slot> slots;
  const core::UsableCores usable = core::usable_cores(core::launch_context());
  const unsigned cores = static_cast<unsigned>(usable.count);
  const std::vector<std::string> gpus = visible_gpus();
  if (!gpus.empty()) {
    const int available = static_cast<int>(gpus.size()) / spec.gpus_per_trial;
    if (available == 0)
      throw SweepError(fmt::format("{}: gpus_per_trial = {} but {} GPU{} visible", where_of(spec, "gpus_per_trial"),
                                   spec.gpus_per_trial, gpus.size(), gpus.size() == 1 ? " is" : "s are"));
    const int count = spec.slots == 0 ? available : spec.slots;
    if (count > available)
      throw SweepError(fmt::format("{}: slots = {} needs {} GPUs ({} per trial); {} visible", where_of(spec, "slots"),
                                   count, std::int64_t{count} * spec.gpus_per_trial, spec.gpus_per_trial, gpus.size()));
    for (int s = 0; s < count; ++s) {
      Slot slot;
      for (int g = 0; g < spec.gpus_per_trial; ++g)
        slot.cuda_devices += (g ? "," : "") + gpus[static_cast<size_t>(s * spec.gpus_per_trial + g)];
      slot.threads = static_cast<int>(std::max(1u, cores / static_cast<unsigned>(count)));
      slots.push_back(slot);
    }
    return slots;
  }
  const int count = spec.slots == 0 ? 1 : spec.slots;
  const std::int64_t processes = std::int64_t{count} * spec.gpus_per_trial;
  if (processes > static_cast<std::int64_t>(cores))  // as `runner --nproc` refuses more ranks than cores
    throw SweepError(fmt::format(
        "{}: slots = {}{} runs {} processes at once on the CPU, more than {}",
        where_of(spec, spec.slots == 0 ? "gpus_per_trial" : "slots"), count,
        spec.gpus_per_trial > 1 ? fmt::format(" of gpus_per_trial = {} ranks", spec.gpus_per_trial) : "", processes,
        usable.source.empty()
            ? fmt::format("this host's {} cores", cores)
            : fmt::format("the {} core{} this worker may use ({})", cores, cores == 1 ? "" : "s", usable.source)));
  for (int s = 0; s < count; ++s)
    slots.push_back(Slot{"", static_cast<int>(std::max(1u, cores / static_cast<unsigned>(count)))});
  return slots;
}

std::string best_trial_command(const SweepRecord& sweep, const std::vector<TrialRecord>& trials) {
  const SweepCounts counts = count_trials(sweep, trials);
  if (!counts.best_trial) return "";
  std::string command = "runner " + core::shell_word(sweep.spec.script);
  for (const TrialRecord& trial : trials)
    if (trial.trial == *counts.best_trial)
      for (const std::string& item : trial_overrides(sweep.spec, trial.params)) command += " " + core::shell_word(item);
  return command;
}

// Why a trial taken over from another worker cannot continue here: its run folder (with the checkpoints) is not
// visible from this host. None when it is, or when the trial starts a new run.
std::optional<std::string> unreachable_checkpoints(const std::string& home, const Claim& claim, index::Database& db) {
  if (!claim.resume_run) return std::nullopt;
  const index::RunRecord run = index::load_run(db, *claim.resume_run);
  const std::string folder = home + "/" + run.dir;
  if (::access(folder.c_str(), F_OK) == 0) return std::nullopt;
  return fmt::format(
      "trial {} cannot continue on host {}: its run folder {} (with its checkpoints, written on {}) is not visible "
      "here; the hosts of a sweep need RUNNER_HOME on a filesystem they share, at the same path",
      claim.trial.trial, index::host_name(), folder, run.host);
}

namespace {

// The trials this worker runs, one per slot, the stop signals they are sent, and the signals the worker receives.
class TrialProcesses {
 public:
  explicit TrialProcesses(std::size_t slots) : running_(slots), stop_signals_(std::in_place) {}

  std::vector<std::optional<Running>>& slots() { return running_; }
  int running() const {
    return static_cast<int>(
        std::count_if(running_.begin(), running_.end(), [](const auto& r) { return r.has_value(); }));
  }
  // Running and not yet exited.
  bool alive() const {
    return std::any_of(running_.begin(), running_.end(), [](const auto& r) { return r && !r->wait_status; });
  }
  void stop_all(int signal_number) {
    for (auto& r : running_)
      if (r) {
        ::kill(r->pid, signal_number);
        r->stop_sent = true;
      }
  }
  // Reaps the trials that exited, also while the index cannot be written (none stays a zombie); the worker's loop
  // records their ends.
  void reap() {
    int status = 0;
    pid_t pid = 0;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0)
      for (auto& r : running_)
        if (r && r->pid == pid) r->wait_status = status;
  }
  // The stop signal received (0: none).
  int stop_signal() const { return stop_signal_; }
  // Takes the stop signals that arrived and sends each to the trials; true when one came after an earlier one.
  bool take_stop_signals() {
    bool again = false;
    for (const int received : stop_signals_->take()) {
      if (stop_signal_ == 0)
        say(fmt::format("{}: stopping the running trials with a checkpoint (again: at once)", strsignal(received)));
      again = again || stop_signal_ != 0;
      stop_signal_ = received;
      stop_all(received);
    }
    return again;
  }
  // Waits up to `milliseconds` for a stop signal.
  void wait(int milliseconds) {
    pollfd fd{stop_signals_->fd(), POLLIN, 0};
    ::poll(&fd, 1, milliseconds);
  }
  void close_signals() { stop_signals_.reset(); }

 private:
  std::vector<std::optional<Running>> running_;
  std::optional<core::StopSignalPipe> stop_signals_;
  int stop_signal_ = 0;
};

// One run of the worker over a sweep; each policy of the multi-host rules is one method: claiming trials into free
// slots under the host's leases, recording the trials' ends, heartbeats and takeovers, retrying the index, and the
// sweep's or the worker's end.
class SweepWorker {
 public:
  SweepWorker(const index::IndexLocation& where, const SweepRecord& sweep)
      : where_(where),
        sweep_(sweep),
        spec_(sweep.spec),
        db_(index::open_index_for_writing(where)),
        slots_(sweep_slots(spec_)),
        usable_(core::usable_cores(core::launch_context())),
        gpus_(slots_.front().cuda_devices.empty() ? std::vector<std::string>{} : visible_gpus()),
        exported_threads_(exported_thread_count()),
        leases_(static_cast<int>(slots_.size())),
        log_directory_(where.home + "/sweeps/" + sweep.name),
        worker_(worker_name()),
        processes_(slots_.size()) {
    make_directories(log_directory_);
  }

  int run() {
    start();
    while (true) {
      if (processes_.stop_signal() == 0 && !failure_limit_ && index::now_seconds() >= next_claim_) claim_trials();
      if (processes_.running() == 0) {
        if (processes_.stop_signal() != 0) break;
        if (sweep_done()) break;
      }
      processes_.wait(processes_.running() == 0 ? 1000 : 200);
      processes_.take_stop_signals();
      processes_.reap();
      record_trial_ends();
      if (index::now_seconds() >= next_heartbeat_) heartbeat();
    }
    return finish();
  }

 private:
  // The worker's use of the index, retried until it goes through, as run:log's writer does: a failure (a full
  // disk, an I/O error) is said once and tried again after 1, 2, 4 ... 30 s while the trials go on. A stop signal
  // still reaches them; the worker then ends once they have exited (at once on a second signal), with an error,
  // when the index still cannot be written: their ends are left to the next worker, which reads them from their
  // runs.
  template <class Use>
  auto retried(const char* what, Use&& use) {
    for (int failures = 0;; ++failures) {
      try {
        auto recovered = [&] {
          if (failures > 0)
            say(fmt::format("the index takes writes again ({}, after {} failed tr{})", what, failures,
                            failures == 1 ? "y" : "ies"));
        };
        if constexpr (std::is_void_v<decltype(use())>) {
          use();
          recovered();
          return;
        } else {
          auto result = use();
          recovered();
          return result;
        }
      } catch (const index::IndexError& error) {
        if (failures == 0)
          say(fmt::format("cannot write to the index ({}): {}; trying again while the trials go on", what,
                          error.what()));
        const double until = index::now_seconds() + std::min(30, 1 << std::min(failures, 5));
        while (index::now_seconds() < until) {
          processes_.wait(200);
          processes_.reap();
          if (processes_.take_stop_signals() || (processes_.stop_signal() != 0 && !processes_.alive()))
            throw index::IndexError(
                fmt::format("{} (stopped while the index could not be written: the trials were sent the stop signal{}; "
                            "the same command records how they ended and continues the sweep)",
                            error.what(), processes_.alive() ? "" : " and have exited"));
        }
      }
    }
  }

  std::vector<TrialRecord> trials() {
    return retried("reading the trials", [&] { return list_trials(db_, sweep_.sweep); });
  }
  std::string counts() { return counts_text(sweep_, trials()); }

  // The worker joins the sweep, says what it runs where, and continues the trials that failed for want of disk space.
  void start() {
    retried("starting the worker", [&] {
      set_sweep_status(db_, sweep_.sweep, "running");
      add_worker(db_, sweep_, worker_, core::launch_context().slurm_job);
    });
    say(fmt::format(
        "sweep {}: {} trials ({}) of {}, {} ({}){}; {}; trial output in {}/", sweep_.name, spec_.trials,
        method_name(spec_.method), spec_.script, spec_.metric, spec_.minimize ? "min" : "max",
        spec_.asha ? fmt::format(", ASHA from step {} by {}", spec_.asha->min_steps, spec_.asha->reduction) : "",
        slots_text(), log_directory_));
    const std::vector<TrialRecord> continued = retried("continuing the trials that failed for want of disk space",
                                                       [&] { return continue_out_of_space_trials(db_, sweep_); });
    for (const TrialRecord& trial : continued)
      say(fmt::format(
          "trial {} failed for want of disk space at step {}: it goes on from its last checkpoint (space may "
          "have been freed){}",
          trial.trial, trial.step,
          spec_.retries > 0 ? fmt::format(", with its {} retr{} again", spec_.retries, spec_.retries == 1 ? "y" : "ies")
                            : ""));
  }

  // Slots and leases: this worker's slots, and the host's shared with every other sweep worker of this user.
  std::string slots_text() const {
    const int slots_on_host = leases_.slots_on_host();
    const std::string shared_text =
        slots_on_host > static_cast<int>(slots_.size())
            ? fmt::format(", sharing the host with other workers' {} slot{}", slots_on_host - std::ssize(slots_),
                          slots_on_host - std::ssize(slots_) == 1 ? "" : "s")
            : "";
    return slots_.front().cuda_devices.empty()
               ? fmt::format("{} CPU slot{} on {} core{}{}", slots_.size(), slots_.size() == 1 ? "" : "s",
                             usable_.count, usable_.count == 1 ? "" : "s", shared_text)
               : fmt::format("{} GPU slot{} ({} GPU{} each){}", slots_.size(), slots_.size() == 1 ? "" : "s",
                             spec_.gpus_per_trial, spec_.gpus_per_trial == 1 ? "" : "s", shared_text);
  }
  // A trial's cores and GPUs: the usable cores divided by the slots of every worker on the host (or an exported
  // OMP_NUM_THREADS); nullopt while other workers' trials hold them.
  std::optional<TrialLease> lease_for_trial() {
    const int threads = exported_threads_.value_or(std::max(1, usable_.count / std::max(1, leases_.slots_on_host())));
    return leases_.try_lease(usable_.count, threads, gpus_, gpus_.empty() ? 0 : spec_.gpus_per_trial);
  }

  // Claiming: a trial into each free slot that gets a lease, until none is left to claim.
  void claim_trials() {
    auto& running = processes_.slots();
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (running[s]) continue;
      std::optional<TrialLease> lease = lease_for_trial();
      if (!lease) {
        if (!waiting_for_lease_)
          say(fmt::format(
              "waiting for free cores{} on this host: other sweep workers' trials hold them (leases in {}/)",
              gpus_.empty() ? "" : " and GPUs", leases_.folder()));
        waiting_for_lease_ = true;
        return;
      }
      waiting_for_lease_ = false;
      std::vector<TrialRecord> unwatched;  // ended on their own after their worker did
      const std::optional<Claim> claim =
          retried("claiming a trial", [&] { return claim_trial(db_, sweep_, worker_, &unwatched); });
      for (const TrialRecord& trial : unwatched) {
        say(
            fmt::format("trial {} ended while no worker watched it: {} at step {}, {} {}{} (recorded from its run, "
                        "not run again) | {}",
                        trial.trial, trial.status, trial.step, spec_.metric, value_text(trial.metric),
                        trial.error ? ": " + *trial.error : "", counts()));
        if (trial.status == "paused") release_checkpoints({trial}, fmt::format("trial {}", trial.trial).c_str());
      }
      if (!claim) return;
      if (const std::optional<std::string> unreachable = unreachable_checkpoints(where_.home, *claim, db_)) {
        TrialEnd end;
        end.failure = *unreachable;
        retried("recording a trial's end",
                [&] { return end_trial(db_, sweep_, claim->trial.trial, end, claim->trial.generation); });
        say(*unreachable);
        continue;
      }
      try {
        running[s] = start_trial(where_, sweep_, *claim, std::move(*lease), log_directory_, db_);
      } catch (const std::exception& error) {
        // Handed back as stopped, so that this worker or another continues it.
        TrialEnd end;
        end.stopped_by_sweep = true;
        retried("handing back a trial",
                [&] { return end_trial(db_, sweep_, claim->trial.trial, end, claim->trial.generation); });
        say(fmt::format("trial {} could not start: {}; trying again in 30 s", claim->trial.trial, error.what()));
        next_claim_ = index::now_seconds() + 30;
        return;
      }
      say(fmt::format("trial {} started ({}{}): {} [{}{}]", claim->trial.trial, claim->reason,
                      claim->trial.step > 0 ? fmt::format(" from step {}", claim->trial.step) : "",
                      params_text(claim->trial.params), slots_.size() > 1 ? fmt::format("slot {}: ", s + 1) : "",
                      lease_text(running[s]->lease)));
    }
  }

  // The end of a sweep: true when finish_if_done ended it (the pruned trials' checkpoints then deleted).
  bool sweep_done() {
    if (!retried("ending the sweep", [&] { return finish_if_done(db_, sweep_); })) return false;
    std::vector<TrialRecord> pruned = trials();
    std::erase_if(pruned, [](const TrialRecord& t) { return t.status != "pruned"; });
    release_checkpoints(pruned, "the pruned trials");
    return true;
  }

  // Trial ends: each reaped trial's end recorded (unless another worker took it over), its line said, and the
  // failure limit and a full disk acted on.
  void record_trial_ends() {
    for (auto& slot : processes_.slots()) {
      if (!slot || !slot->wait_status) continue;
      const int status = *slot->wait_status;
      TrialEnd end;
      end.exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      end.stopped_by_sweep = slot->stop_sent;
      end.pause_step = slot->pause_step;
      end.failure = core::how_it_ended(status);
      end.storage_full = WIFEXITED(status) && WEXITSTATUS(status) == core::kExitStorageFull;
      if (WIFSIGNALED(status))
        end.killed_by = WTERMSIG(status);
      else if (spec_.gpus_per_trial > 1 && WEXITSTATUS(status) > 128)
        end.killed_by = WEXITSTATUS(status) - 128;  // a rank's
      const std::optional<TrialRecord> recorded = retried(
          "recording a trial's end", [&] { return end_trial(db_, sweep_, slot->trial, end, slot->generation); });
      if (!recorded) {
        say(fmt::format("{} while this worker was silent: its process here {} and its end is not recorded here | {}",
                        lost_text(slot->trial, slot->pid), core::how_it_ended(status), counts()));
        slot.reset();
        continue;
      }
      const TrialRecord& trial = *recorded;
      say(ended_text(trial, spec_, *slot, core::how_it_ended(status)) + " | " + counts());
      if (trial.status == "paused") release_checkpoints({trial}, fmt::format("trial {}", trial.trial).c_str());
      slot.reset();
      if (end.storage_full && trial.status == "stopped") {
        say(fmt::format("no trial starts for {} s: the disk was full", kStorageFullWaitSeconds));
        next_claim_ = std::max(next_claim_, index::now_seconds() + kStorageFullWaitSeconds);
      }
      if (trial.status == "failed" && !failure_limit_ && processes_.stop_signal() == 0) {
        const std::vector<TrialRecord> all = trials();
        const auto failed =
            std::count_if(all.begin(), all.end(), [](const TrialRecord& t) { return t.status == "failed"; });
        if (failed >= spec_.max_failures) {
          failure_limit_ = true;
          say(fmt::format("{} trials failed (max_failures = {}): stopping the sweep", failed, spec_.max_failures));
          processes_.stop_all(SIGTERM);
        }
      }
    }
  }

  // Heartbeats and takeover: the trials this worker holds kept alive; those another worker took over while this
  // one was silent marked lost (their processes stop at their next write to the index).
  void heartbeat() {
    std::vector<HeldTrial> held;
    for (const auto& r : processes_.slots())
      if (r && !r->lost) held.push_back({r->trial, r->generation});
    const std::vector<std::int64_t> lost =
        retried("a heartbeat", [&] { return heartbeat_trials(db_, sweep_, worker_, held); });
    for (auto& r : processes_.slots())
      if (r && std::find(lost.begin(), lost.end(), r->trial) != lost.end()) {
        r->lost = true;
        say(fmt::format("{} while this worker was silent: its process here stops at its next write to the index",
                        lost_text(r->trial, r->pid)));
      }
    next_heartbeat_ = index::now_seconds() + index::kHeartbeatSeconds;
  }

  // A trial this worker lost (its process here had `pid`): who took it over.
  std::string lost_text(std::int64_t number, pid_t pid) {
    return retried("reading the trials", [&] {
      const std::vector<TrialRecord> all = list_trials(db_, sweep_.sweep);
      const auto trial = std::find_if(all.begin(), all.end(), [&](const TrialRecord& t) { return t.trial == number; });
      return fmt::format("trial {} was taken over {} (generation {})", number,
                         index::taken_over_by(db_, sweep_.sweep, number, pid),
                         trial == all.end() ? 0 : trial->generation);
    });
  }

  // A paused trial keeps only the checkpoint a promotion continues from, a pruned one none
  // (index::unneeded_checkpoints). A deletion that fails is said and left to `runner gc`.
  void release_checkpoints(const std::vector<TrialRecord>& released_trials, const char* whose) {
    index::GarbageReport released;
    try {
      for (const TrialRecord& trial : released_trials)
        if (trial.run) index::drop_checkpoints(db_, where_.home, index::load_run(db_, *trial.run), false, released);
    } catch (const std::exception& error) {
      say(fmt::format("cannot delete the checkpoints {} no longer need{}: {} (runner gc deletes them)", whose,
                      released_trials.size() == 1 ? "s" : "", error.what()));
    }
    if (!released.dropped_checkpoints.empty())
      say(fmt::format("deleted {} checkpoint{} {} no longer need{} ({} freed)", released.dropped_checkpoints.size(),
                      released.dropped_checkpoints.size() == 1 ? "" : "s", whose,
                      released_trials.size() == 1 ? "s" : "", core::byte_size_text(released.bytes_freed)));
  }

  // The worker's end: it leaves the sweep (a stopped worker stops the sweep unless another live worker holds it,
  // whose trials go on and which takes over the ones this worker handed back) and says how the sweep stands.
  // Returns the exit status.
  int finish() {
    const int stop_signal = processes_.stop_signal();
    std::int64_t other_workers = 0;
    const std::vector<TrialRecord> all = retried("ending the worker", [&] {
      index::with_transaction(
          db_,
          [&] {
            lock_sweep(db_, sweep_.sweep);
            remove_worker(db_, sweep_.sweep, worker_);
            const std::vector<WorkerRecord> others = list_workers(db_, sweep_);
            other_workers = std::count_if(others.begin(), others.end(), [](const WorkerRecord& w) { return w.alive; });
            if (stop_signal != 0 && other_workers == 0) set_sweep_status(db_, sweep_.sweep, "stopped");
          },
          index::TransactionScope::own_rows);
      return list_trials(db_, sweep_.sweep);
    });
    processes_.close_signals();
    const SweepCounts totals = count_trials(sweep_, all);
    const std::string best = best_trial_command(sweep_, all);
    if (stop_signal != 0 && other_workers > 0) {
      say(fmt::format("worker stopped: {}; {} other worker{} of sweep {} go{} on with it and take over its trials",
                      counts_text(sweep_, all), other_workers, other_workers == 1 ? "" : "s", sweep_.name,
                      other_workers == 1 ? "es" : ""));
      return stop_signal == SIGINT ? core::kExitInterrupted : core::kExitOk;
    }
    if (stop_signal != 0) {
      say(fmt::format("sweep {} stopped: {}; the same command (or runner sweep --join {}) continues it", sweep_.name,
                      counts_text(sweep_, all), sweep_.name));
      return stop_signal == SIGINT ? core::kExitInterrupted : core::kExitOk;
    }
    const SweepRecord now = load_sweep(db_, std::to_string(sweep_.sweep));
    if (now.status == "failed" || failure_limit_) {
      std::fprintf(stderr, "runner: sweep %s failed: %s\n", sweep_.name.c_str(),
                   core::terminal_text(now.error.value_or("too many trials failed")).c_str());
      if (const std::optional<std::string> out_of_space = out_of_space_text(spec_, all))
        std::fprintf(stderr, "runner: %s\n", core::terminal_text(*out_of_space).c_str());
      return core::kExitError;
    }
    say(fmt::format("sweep {} {}: {}", sweep_.name,
                    now.status == "finished" ? "finished" : "has no trial left for this worker",
                    counts_text(sweep_, all)));
    if (const std::optional<std::string> out_of_space = out_of_space_text(spec_, all)) say(*out_of_space);
    if (!best.empty())
      say(fmt::format("best: trial {} with {} {}: {}", *totals.best_trial, spec_.metric, value_text(totals.best_value),
                      best));
    else if (now.status == "finished")
      say("no trial finished, so there is no best trial (every one failed or was pruned)");
    return core::kExitOk;
  }

  const index::IndexLocation& where_;
  const SweepRecord& sweep_;
  const SweepSpec& spec_;
  index::Database db_;
  const std::vector<Slot> slots_;
  const core::UsableCores usable_;
  const std::vector<std::string> gpus_;
  const std::optional<int> exported_threads_;
  const HostLeases leases_;
  const std::string log_directory_;
  const std::string worker_;
  TrialProcesses processes_;
  bool waiting_for_lease_ = false;
  bool failure_limit_ = false;
  double next_heartbeat_ = index::now_seconds() + index::kHeartbeatSeconds;
  double next_claim_ = 0;  // after a trial could not start: not before this
};

}  // namespace

int run_sweep_worker(const index::IndexLocation& where, const SweepRecord& sweep) {
  return SweepWorker(where, sweep).run();
}

}  // namespace runner::sweep
