// Deleting a sweep with its trials' runs, rows and output folder.
#include "runtime/sweep/sweep_removal.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "runtime/core/disk_usage.h"
#include "runtime/index/run_removal.h"
#include "runtime/index/run_store.h"

namespace runner::sweep {

RemovedSweep remove_sweep(index::Database& db, const std::string& home, const SweepRecord& sweep, bool force) {
  const double now = index::now_seconds();
  index::RunFilter filter;
  filter.sweep = sweep.sweep;
  const std::vector<index::RunRecord> runs = index::list_runs(db, filter);
  if (!force) {
    if (worker_presence(db, sweep).alive)
      throw index::IndexError(
          fmt::format("sweep {} has a live worker; stop it first (Ctrl-C in its terminal, or SIGTERM) "
                      "or use --force",
                      sweep.name));
    for (const index::RunRecord& run : runs)
      if (index::effective_status(run, now) == "running")
        throw index::IndexError(
            fmt::format("run {} ({}) of sweep {} is still running (pid {} on {}); stop it first or use "
                        "--force",
                        run.name, run.id, sweep.name, run.pid, run.host));
  }
  RemovedSweep removed;
  removed.trials = static_cast<std::int64_t>(list_trials(db, sweep.sweep).size());
  for (const index::RunRecord& run : runs) {
    const index::RemovedRun gone = index::remove_run(db, home, run);
    ++removed.runs;
    removed.checkpoints += gone.checkpoints;
    removed.bytes += gone.bytes;
  }
  index::with_transaction(
      db,
      [&] {
        index::Statement remove = db.prepare("DELETE FROM sweeps WHERE sweep = ?");  // trials, rungs, workers cascade
        remove.bind(1, sweep.sweep);
        remove.run();
      },
      index::TransactionScope::own_rows);
  const std::string output = home + "/sweeps/" + sweep.name;
  struct stat info {};
  if (::lstat(output.c_str(), &info) == 0) {
    const std::string trash = home + "/.trash";
    const std::string trashed = trash + "/sweep-" + sweep.name;
    if (::lstat(trashed.c_str(), &info) == 0) index::remove_tree(trashed);  // left by a removal that stopped half-way
    if (::mkdir(trash.c_str(), 0777) != 0 && errno != EEXIST)
      throw index::IndexError(fmt::format("{}: cannot create the directory: {}", trash, std::strerror(errno)));
    if (::rename(output.c_str(), trashed.c_str()) != 0)
      throw index::IndexError(
          fmt::format("{}: cannot move the sweep's folder aside: {}", output, std::strerror(errno)));
    removed.bytes += core::disk_usage(trashed);
    index::remove_tree(trashed);
  }
  return removed;
}

}  // namespace runner::sweep
