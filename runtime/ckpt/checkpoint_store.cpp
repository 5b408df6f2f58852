// Background checkpoint saves with verification, index rows and rotation; choosing what to restore.
#include "runtime/ckpt/checkpoint_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "runtime/core/clock.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_removal.h"
#include "runtime/index/writer_fence.h"

namespace runner::ckpt {
namespace {

std::vector<CheckpointFileRecord> file_records(const index::CheckpointRecord& record) {
  std::vector<CheckpointFileRecord> files;
  for (const auto& f : record.files) files.push_back({f.name, f.bytes, f.hash});
  return files;
}

}  // namespace

CheckpointSaver::CheckpointSaver(index::IndexLocation index, int64_t run, std::string run_dir, RotationPolicy rotation)
    : index_(std::move(index)), run_(run), run_dir_(std::move(run_dir)), rotation_(rotation) {}

CheckpointSaver::~CheckpointSaver() { wait(); }

void CheckpointSaver::wait() {
  if (worker_.joinable()) worker_.join();
}

bool CheckpointSaver::busy() {
  std::lock_guard lock(mutex_);
  return running_;
}

std::vector<SaveReport> CheckpointSaver::take_reports() {
  std::lock_guard lock(mutex_);
  std::vector<SaveReport> reports;
  reports.swap(reports_);
  return reports;
}

void CheckpointSaver::submit(SaveRequest request) {
  wait();
  {
    std::lock_guard lock(mutex_);
    running_ = true;
  }
  worker_ = std::thread([this, request = std::move(request)]() mutable {
    SaveReport report = save(request);
    request.files.clear();  // frees the host copies on this thread
    std::lock_guard lock(mutex_);
    reports_.push_back(std::move(report));
    running_ = false;
  });
}

SaveReport CheckpointSaver::save(SaveRequest& request) {
  const double start = core::steady_seconds();
  SaveReport report;
  report.step = request.step;
  report.path = checkpoint_path(request.step);
  try {
    if (request.wait_ready) request.wait_ready();
    index::Database db = index::open_index_for_writing(index_);
    index::check_write_access(db);  // no files into the folder of a run resumed elsewhere; again before the rename
    const WrittenCheckpoint written = write_checkpoint(run_dir_, request.step, request.files, request.manifest_extra,
                                                       [&] { index::check_write_access(db); });
    report.bytes = written.bytes;
    const auto problems = verify_checkpoint(run_dir_, written.path, written.files);
    if (!problems.empty())
      throw CheckpointWriteError(
          fmt::format("{}/{} does not read back as written: {}", run_dir_, written.path, fmt::join(problems, "; ")));

    if (request.before_record) request.before_record();
    index::CheckpointRecord record;
    record.run = run_;
    record.step = request.step;
    record.path = written.path;
    record.bytes = written.bytes;
    record.hash = written.sha256;
    record.metric = request.metric;
    record.metric_value = request.metric_value;
    for (const auto& f : written.files) record.files.push_back({f.name, f.bytes, f.sha256});
    const int64_t id = index::add_checkpoint(db, record);

    std::vector<RotationCandidate> candidates;
    std::map<int64_t, std::string> paths;
    for (const auto& c : index::checkpoints(db, run_)) {
      if (!c.kept) continue;
      // Rotation ranks by the metric this save names; checkpoints recorded with another metric have no value.
      std::optional<double> value;
      if (c.metric && request.metric && *c.metric == *request.metric) value = c.metric_value;
      candidates.push_back({c.checkpoint, c.step, value, true});
      paths[c.checkpoint] = c.path;
    }
    for (int64_t drop : checkpoints_to_drop(candidates, rotation_)) {
      if (drop == id) continue;
      index::set_checkpoint_kept(db, drop, false);
      try {
        index::remove_tree(run_dir_ + "/" + paths[drop]);
        index::delete_checkpoint(db, drop);
        report.dropped.push_back(paths[drop]);
      } catch (const std::exception& error) {
        report.undeleted.push_back(error.what());
      }
    }
  } catch (const std::exception& error) {
    report.error = error.what();
  }
  report.write_seconds = core::steady_seconds() - start;
  return report;
}

RestoreChoice choose_checkpoint(index::Database& db, int64_t run, const std::string& run_dir,
                                std::optional<int64_t> step) {
  RestoreChoice choice;
  auto records = index::checkpoints(db, run);
  std::stable_sort(records.begin(), records.end(),
                   [](const index::CheckpointRecord& a, const index::CheckpointRecord& b) { return a.step > b.step; });
  for (const auto& record : records)
    if (record.kept) choice.steps.insert(choice.steps.begin(), record.step);
  for (const auto& record : records) {
    if (!record.kept || (step && record.step != *step)) continue;
    const auto problems = verify_checkpoint(run_dir, record.path, file_records(record));
    if (problems.empty()) {
      choice.checkpoint = record;
      choice.directory = run_dir + "/" + record.path;
      return choice;
    }
    choice.rejected.push_back(fmt::format("{}: {}", record.path, fmt::join(problems, "; ")));
  }
  return choice;
}

RestoreChoice require_checkpoint(index::Database& db, int64_t run, const std::string& run_name,
                                 const std::string& run_dir, std::optional<int64_t> step) {
  RestoreChoice choice = choose_checkpoint(db, run, run_dir, step);
  if (choice.checkpoint) return choice;
  if (choice.steps.empty()) throw std::invalid_argument(fmt::format("run {} has no checkpoint", run_name));
  if (step && std::find(choice.steps.begin(), choice.steps.end(), *step) == choice.steps.end())
    throw std::invalid_argument(
        fmt::format("run {} has no checkpoint of step {} (it has {})", run_name, *step, fmt::join(choice.steps, ", ")));
  throw std::invalid_argument(fmt::format("run {}: {} is damaged: {}", run_name,
                                          step ? "its checkpoint" : "every checkpoint",
                                          fmt::join(choice.rejected, "; ")));
}

}  // namespace runner::ckpt
