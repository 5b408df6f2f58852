// Run deletion through a trash directory, and garbage collection of the index's home.
#include "runtime/index/run_removal.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <map>
#include <set>
#include <utility>

#include "runtime/core/disk_usage.h"
#include "runtime/index/run_records.h"

namespace runner::index {
namespace {

thread_local int removal_error = 0;
thread_local std::string removal_failed_path;

int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  const int result = (type == FTW_DP || type == FTW_D) ? ::rmdir(path) : ::unlink(path);
  if (result != 0 && errno != ENOENT) {
    removal_error = errno;
    removal_failed_path = path;
    return 1;
  }
  return 0;
}

bool is_directory(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return names;
  while (dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

int64_t count_rows(Database& db, const char* table, int64_t run) {
  Statement statement = db.prepare(fmt::format("SELECT count(*) FROM {} WHERE run = ?", table));
  statement.bind(1, run);
  statement.step();
  return statement.integer(0);
}

void delete_run_rows(Database& db, int64_t run) {
  with_transaction(
      db,
      [&] {
        Statement statement = db.prepare("DELETE FROM runs WHERE run = ?");  // its other rows cascade
        statement.bind(1, run);
        statement.run();
      },
      TransactionScope::own_rows);
}

std::string trash_directory(const std::string& home) { return home + "/.trash"; }

}  // namespace

void remove_tree(const std::string& path) {
  removal_error = 0;
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && removal_error != 0)
    throw IndexError(fmt::format("{}: cannot delete: {}", removal_failed_path, std::strerror(removal_error)));
}

RemovedRun remove_run(Database& db, const std::string& home, const RunRecord& run) {
  RemovedRun removed{run.id,
                     run.name,
                     count_rows(db, "metrics", run.run),
                     count_rows(db, "checkpoints", run.run),
                     count_rows(db, "artifacts", run.run),
                     0};
  const std::string directory = home + "/" + run.dir;
  const std::string trash = trash_directory(home);
  const std::string trashed = trash + "/" + run.id + "-" + run.dir;
  if (is_directory(directory)) {
    removed.bytes = core::disk_usage(directory);
    if (::mkdir(trash.c_str(), 0777) != 0 && errno != EEXIST)
      throw IndexError(fmt::format("{}: cannot create the directory: {}", trash, std::strerror(errno)));
    if (::rename(directory.c_str(), trashed.c_str()) != 0)
      throw IndexError(fmt::format("{}: cannot move the run directory aside: {}", directory, std::strerror(errno)));
  }
  delete_run_rows(db, run.run);
  if (is_directory(trashed)) remove_tree(trashed);
  return removed;
}

std::set<int64_t> unneeded_checkpoints(Database& db, const RunRecord& run) {
  std::set<int64_t> unneeded;
  if (run.status != "paused" && run.status != "pruned") return unneeded;
  Statement select =
      db.prepare("SELECT checkpoint FROM checkpoints WHERE run = ? AND kept = 1 ORDER BY step DESC, checkpoint DESC");
  select.bind(1, run.run);
  for (bool latest = true; select.step(); latest = false)
    if (!latest || run.status == "pruned") unneeded.insert(select.integer(0));
  return unneeded;
}

void drop_checkpoints(Database& db, const std::string& home, const RunRecord& run, bool dry_run,
                      GarbageReport& report) {
  const std::set<int64_t> unneeded = unneeded_checkpoints(db, run);
  for (const CheckpointRecord& checkpoint : checkpoints(db, run.run)) {
    if (checkpoint.kept && !unneeded.count(checkpoint.checkpoint)) continue;
    const std::string path = home + "/" + run.dir + "/" + checkpoint.path;
    struct stat info {};
    const bool on_disk = ::lstat(path.c_str(), &info) == 0;
    if (on_disk) {  // else rotation deleted its files and not yet its rows (an index from before it did both)
      report.dropped_checkpoints.push_back(run.dir + "/" + checkpoint.path);
      report.bytes_freed += core::disk_usage(path);
    }
    if (dry_run) continue;
    if (checkpoint.kept) set_checkpoint_kept(db, checkpoint.checkpoint, false);  // never restored from once half gone
    if (is_directory(path))
      remove_tree(path);
    else if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      throw IndexError(fmt::format("{}: cannot delete: {}", path, std::strerror(errno)));
    delete_checkpoint(db, checkpoint.checkpoint);
  }
}

GarbageReport collect_garbage(Database& db, const std::string& home, bool dry_run, bool remove_orphans) {
  GarbageReport report;
  const double now = now_seconds();

  // Deletions that stopped half-way: the directory is in the trash, the rows may still be there.
  const std::string trash = trash_directory(home);
  for (const std::string& entry : list_directory(trash)) {
    const std::string path = trash + "/" + entry;
    report.finished_removals.push_back(entry);
    report.bytes_freed += core::disk_usage(path);
    if (dry_run) continue;
    const std::string id = entry.substr(0, entry.find('-'));
    Statement find = db.prepare("SELECT run FROM runs WHERE id = ?");
    find.bind(1, id);
    if (find.step()) {
      const int64_t run = find.integer(0);
      find.reset();
      delete_run_rows(db, run);
    }
    remove_tree(path);
  }

  std::vector<RunRecord> runs = list_runs(db, {});
  std::set<std::string> known_directories;
  for (const RunRecord& run : runs) {
    known_directories.insert(run.dir);
    if (run.status == "running" && effective_status(run, now) == "interrupted")
      report.interrupted_runs.push_back(run.name);
    if (!is_directory(home + "/" + run.dir)) report.missing_directories.push_back(run.name);
    drop_checkpoints(db, home, run, dry_run, report);
  }
  if (!dry_run) reap_stale_runs(db, now, home);

  // A run directory always holds config.json and script.lua; other folders under home are not touched.
  for (const std::string& entry : list_directory(home)) {
    const std::string path = home + "/" + entry;
    if (entry[0] == '.' || known_directories.count(entry) || !is_directory(path)) continue;
    struct stat info {};
    if (::stat((path + "/config.json").c_str(), &info) != 0 || ::stat((path + "/script.lua").c_str(), &info) != 0)
      continue;
    report.orphan_directories.push_back(entry);
    if (!remove_orphans) continue;
    report.bytes_freed += core::disk_usage(path);
    if (!dry_run) remove_tree(path);
  }

  if (!dry_run) db.connection().tidy_after_deleting();
  return report;
}

}  // namespace runner::index
