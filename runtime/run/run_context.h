// One run from its start to its final status: the index row, the run directory, the log file, the metric
// writer, sample grids, and the run's current step. start_run (run_start.h) makes one.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/launch_context.h"
#include "runtime/image/image_grid.h"
#include "runtime/index/index_database.h"
#include "runtime/index/metric_writer.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_store.h"
#include "runtime/index/database.h"
#include "runtime/index/writer_fence.h"
#include "runtime/run/system_metrics.h"

namespace runner::run {

// A run to create or reopen, with everything resolved (start_run does the resolving).
struct RunStart {
  index::IndexLocation index;  // the launch context's (index_database.h: index_location)
  index::NewRun run;           // script, config, name, device, seed, versions, parent
  std::string script_text;     // copied into the run directory as script.lua
  index::MetricWriterOptions writer;
  double system_metrics_seconds = 10;     // between samples of the run's system metrics (system_metrics.h); 0: none
  std::optional<int64_t> resume;          // an ended run to continue (reopen_run) instead of a new one
  std::optional<index::RunRecord> fork;   // the run whose checkpoint a new run starts from
  std::optional<core::SweepPause> pause;  // a sweep trial's next ASHA rung (the launch context's sweep_pause)
};

class RunContext {
 public:
  // Creates the index row (status running) with its first attempt, the directory <home>/<name>/ with
  // script.lua, config.json and log.txt (the process's log from now on, from a line with the attempt's config),
  // and starts the metric writer and the system metrics. Stale runs of dead processes are marked interrupted on the
  // way. With `resume`, the existing run is reopened instead as a new attempt: its row is running again, script.lua and
  // config.json are rewritten, log.txt is appended to, and what the attempt changes (config, world size,
  // hosts) is logged. `db` is the index opened for writing at `start.index`.
  RunContext(const RunStart& start, index::Database db);
  explicit RunContext(const RunStart& start);  // opens the index itself
  // A rank > 0 of a data-parallel job: the run `run` that rank 0 started (forking `fork`), read from the
  // index at `index`. It records nothing (no row changes, metrics, images, summary or log file): rank 0 does.
  RunContext(const index::IndexLocation& index, int64_t run, std::optional<int64_t> fork);
  ~RunContext();  // finishes as interrupted if finish() was not called
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;

  const index::RunRecord& record() const { return record_; }
  bool resumed() const { return resumed_; }
  // The seed this process uses: the one asked for, else (resumed) the run's recorded one.
  int64_t seed() const { return seed_; }
  const std::optional<index::RunRecord>& fork() const { return fork_; }
  index::Database& database() { return db_; }
  // <home>/<name>
  const std::string& directory() const { return directory_; }
  const index::IndexLocation& index_location() const { return index_; }
  const std::string& home() const { return index_.home; }
  bool finished() const { return finished_; }
  bool follower() const { return follower_; }

  // The step metrics, images and checkpoints are recorded at (the trainer's step once one is attached).
  int64_t step() const { return step_.load(std::memory_order_relaxed); }  // from any thread
  void set_step(int64_t step);
  // The step a restored checkpoint continues from: set_step, and the attempt's start step in the index.
  void continue_from(int64_t step);

  index::MetricWriter& metrics() { return *writer_; }
  // The thread that records sys/* metrics; nullptr on a follower or when RunStart::system_metrics_seconds is 0.
  SystemMetrics* system_metrics() { return system_metrics_.get(); }
  // Records a value through metrics() (nothing on a follower). In a sweep trial with an ASHA rung ahead
  // (RunStart::pause), logging the sweep's metric at or after the rung's step makes pause_due() true: the
  // training run then stops after this step with a checkpoint, for the sweep to decide whether it goes on.
  void log_metric(std::string_view key, int64_t step, double value, double time);
  void log_metric(std::string_view key, int64_t step, const at::Tensor& value, double time);
  // Records the histogram of a tensor of more than one element (tensor_histogram.h) in the index, at once;
  // nothing on a follower.
  void log_histogram(const std::string& key, int64_t step, const at::Tensor& values, double time);
  bool pause_due() const { return pause_due_; }
  void merge_summary(const nlohmann::json& values);
  // Tags the run and sets (empty: removes) its note, in the index (index::add_run_tags, index::set_run_note) and
  // record(); nothing on a follower.
  void add_tags(const std::vector<std::string>& tags);
  void set_note(const std::string& note);
  // Records a chunk of `runner attach` that changed the run (index::InterventionRecord: its text and what it
  // changed) at the run's step, in the index and in log.txt; nothing on a follower.
  void record_intervention(const std::string& chunk, const std::vector<std::string>& changes);
  // Saves a sample grid as images/<name>-<step>.png in the run directory and records the artifact;
  // returns the file's path. `name`: letters, digits, '_', '-', '.'.
  std::string save_images(const std::string& name, int64_t step, const at::Tensor& images,
                          const image::GridOptions& options);
  // Records a file written into the run directory (`relative` to it) as an artifact of kind "file".
  void record_file(const std::string& name, int64_t step, const std::string& relative);
  // Records what this attempt read (index::InputRecord): `path` resolved to an absolute one (links followed),
  // its size and modification time, and `detail`. Nothing on a follower rank; not a record that keeps a run
  // withdrawn after a usage error.
  void record_input(const std::string& kind, const std::string& path,
                    const nlohmann::json& detail = nlohmann::json::object());

  // Flushes the metrics and records the final status (finished, failed, interrupted) with the error text.
  // Idempotent. A failure to flush is reported in the run's error and rethrown.
  void finish(const std::string& status, const std::optional<std::string>& error = std::nullopt);
  // After a usage error: when this attempt ran no step and recorded nothing (no metric, checkpoint, image,
  // file or summary), it is taken back instead of finishing failed. A new run is removed with its directory;
  // a resumed run is put back as its previous attempt left it (config.json and script.lua too). Returns what
  // became of the run, for the user; nothing (and the run stays open) when the attempt cannot be taken back.
  std::optional<std::string> withdraw();

 private:
  index::IndexLocation index_;
  index::Database db_;
  std::string directory_;
  index::RunRecord record_;
  // This process writes the run as the attempt it started or resumed, until its end is recorded: a resume by another
  // process (this one silent past the staleness limit) ends this one at its next write (index/writer_fence.h).
  std::optional<index::HeldAttempt> held_attempt_;
  std::optional<index::RunRecord> fork_;
  std::unique_ptr<index::MetricWriter> writer_;
  std::unique_ptr<SystemMetrics> system_metrics_;  // logs through writer_: declared after it, so stopped first
  std::atomic<int64_t> step_ = 0;
  int64_t attempt_start_step_ = 0;
  bool recorded_ = false;  // an image, file or summary (metrics and checkpoints count through the writer)
  std::optional<std::string> previous_script_;  // a resumed run's script.lua before this attempt replaced it
  int64_t seed_ = 0;
  bool finished_ = false;
  bool resumed_ = false;
  bool follower_ = false;
  std::optional<core::SweepPause> pause_;
  bool pause_due_ = false;
  void note_pause(std::string_view key, int64_t step);
};

}  // namespace runner::run
