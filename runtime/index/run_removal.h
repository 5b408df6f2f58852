// Deleting runs so that the index and the disk agree, and `runner gc`: finishing interrupted deletions,
// marking dead runs, deleting checkpoints rotated out, and finding run directories the index lost.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "runtime/index/run_store.h"
#include "runtime/index/database.h"

namespace runner::index {

struct RemovedRun {
  std::string id;
  std::string name;
  int64_t metrics = 0;
  int64_t checkpoints = 0;
  int64_t artifacts = 0;
  uint64_t bytes = 0;  // on disk
};

// Moves the run directory into <home>/.trash/, deletes the run's rows (metrics, checkpoints, artifacts) in
// one transaction, then deletes the moved directory. A crash at any point leaves either the whole run or a
// trash entry that collect_garbage() finishes.
RemovedRun remove_run(Database& db, const std::string& home, const RunRecord& run);

struct GarbageReport {
  std::vector<std::string> finished_removals;    // trash entries deleted
  std::vector<std::string> interrupted_runs;     // names of runs marked interrupted
  std::vector<std::string> dropped_checkpoints;  // checkpoint paths no longer kept, deleted with their rows
  std::vector<std::string> orphan_directories;   // run-like directories under home with no run in the index
  std::vector<std::string> missing_directories;  // runs whose directory is gone
  uint64_t bytes_freed = 0;                      // disk space (allocated blocks)
};

// dry_run: report only. remove_orphans: also delete orphan directories.
GarbageReport collect_garbage(Database& db, const std::string& home, bool dry_run, bool remove_orphans);

// The kept checkpoints of a sweep trial's run that nothing can need: every one of a pruned run, and all but the
// latest of a paused run (a promotion continues from that one). Empty for other runs.
std::set<int64_t> unneeded_checkpoints(Database& db, const RunRecord& run);
// Deletes the run's checkpoints that are no longer kept and its unneeded ones (marked not kept first), each file
// before its rows, adding their paths and the space freed to `report` (dry_run: only that).
void drop_checkpoints(Database& db, const std::string& home, const RunRecord& run, bool dry_run, GarbageReport& report);

// Deletes a directory tree without following links; throws IndexError naming the path on failure.
void remove_tree(const std::string& path);

}  // namespace runner::index
