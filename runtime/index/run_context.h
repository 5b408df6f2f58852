// The active run of a process: its index row, run directory, log file and metric writer, from start to the
// final status. The bindings hold one per `runner.start`.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>

#include "runtime/image/image_grid.h"
#include "runtime/index/metric_writer.h"
#include "runtime/index/run_store.h"
#include "runtime/index/sqlite_database.h"

namespace runner::index {

struct RunStart {
  std::string home;          // RUNNER_HOME (index_database.h: home_directory())
  NewRun run;                // script, config, name, device, seed, versions, parent
  std::string script_text;   // copied into the run directory as script.lua
  MetricWriterOptions writer;
  std::optional<int64_t> resume;  // an ended run to continue (reopen_run) instead of a new one
};

// The script's repository revision and whether tracked files differ from it; both empty outside a git
// repository or without git.
struct GitState {
  std::optional<std::string> revision;
  std::optional<bool> dirty;
};
GitState git_state(const std::string& directory);

class RunContext {
 public:
  // Creates the index row (status running), the directory <home>/<name>/ with script.lua, config.json and
  // log.txt (the process's log from now on), and starts the metric writer. Stale runs of dead processes
  // are marked interrupted on the way. With `resume`, the existing run is reopened instead: its row is
  // running again, script.lua and config.json are rewritten and log.txt is appended to.
  explicit RunContext(const RunStart& start);
  ~RunContext();  // finishes as interrupted if finish() was not called
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;

  const RunRecord& record() const { return record_; }
  bool resumed() const { return resumed_; }
  Database& database() { return db_; }
  // <home>/<name>
  const std::string& directory() const { return directory_; }
  const std::string& home() const { return home_; }
  bool finished() const { return finished_; }

  MetricWriter& metrics() { return *writer_; }
  void merge_summary(const nlohmann::json& values);
  // Saves a sample grid as images/<name>-<step>.png in the run directory and records the artifact;
  // returns the file's path. `name`: letters, digits, '_', '-', '.'.
  std::string save_images(const std::string& name, int64_t step, const at::Tensor& images,
                          const image::GridOptions& options);

  // Flushes the metrics and records the final status (finished, failed, interrupted) with the error text.
  // Idempotent. A failure to flush is reported in the run's error and rethrown.
  void finish(const std::string& status, const std::optional<std::string>& error = std::nullopt);

 private:
  std::string home_;
  Database db_;
  std::string directory_;
  RunRecord record_;
  std::unique_ptr<MetricWriter> writer_;
  bool finished_ = false;
  bool resumed_ = false;
};

}  // namespace runner::index
