// The training progress line: step, loss and other values, it/s, images/s, ETA, LR and device memory;
// redrawn in place on a terminal, printed as plain periodic lines otherwise (logs, pipes, CI).
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace runner::train {

struct ProgressOptions {
  int64_t total_steps = 0;      // 0: unknown (no percentage, no ETA)
  int64_t batch = 0;            // images per step, for images/s (0: not shown)
  bool terminal = false;        // redraw one line in place (true) or print plain lines (false)
  double redraw_seconds = 0.2;  // terminal: at most this often
  double line_seconds = 30.0;   // plain lines: at most this often (and at the first and last step)
  int width = 0;                // terminal: truncate to this many columns (0: no limit)
  std::string sharding;         // sharded data parallel: the mode and the model state per rank, shown last
};

struct ProgressSnapshot {
  int64_t step = 0;                                    // optimizer steps done
  std::vector<std::pair<std::string, double>> values;  // e.g. {"loss", 0.12}, shown in order
  std::optional<double> lr;
  std::optional<double> memory_bytes;  // device memory in use
};

class ProgressRenderer {
 public:
  // `out` is where lines go (stdout by default); `start_seconds` the clock at the first step's start.
  ProgressRenderer(ProgressOptions options, double start_seconds, std::FILE* out = stdout);

  // Shows the state after a step when it is time to (see the options); returns whether it printed.
  bool update(const ProgressSnapshot& snapshot, double now_seconds);
  // update() in two parts, so that values that cost something to read (a device tensor) are read only when
  // shown: tick() records that `step` is done and says whether it is time to show; show() prints.
  bool tick(int64_t step, double now_seconds);
  void show(const ProgressSnapshot& snapshot, double now_seconds);
  // Prints the final state and, on a terminal, ends the line.
  void finish(const ProgressSnapshot& snapshot, double now_seconds);

  // The text of one line for `snapshot` (no carriage return or newline).
  std::string render(const ProgressSnapshot& snapshot, double now_seconds) const;
  // Steps per second: one over the median time per step in the recent past (the steps that ended in the last
  // 10 seconds, and at least the last 5), so that a step that also sampled or evaluated does not count as
  // training time; 0 before two updates.
  double steps_per_second() const { return rate_; }

 private:
  void observe(int64_t step, double now);
  void emit(const std::string& line, bool final);

  ProgressOptions options_;
  std::FILE* out_;
  double start_;
  double last_shown_ = -1e300;
  struct StepTime {
    double end;      // when the step ended
    double seconds;  // seconds per step since the previous update
  };
  std::deque<StepTime> recent_;
  int64_t previous_step_ = 0;
  double previous_time_ = 0;
  double rate_ = 0;
  int64_t first_step_ = -1;
  int64_t shown_step_ = -1;
  size_t drawn_width_ = 0;
};

// "45s", "3m 12s", "2h 05m", "3d 4h"
std::string format_eta(double seconds);
// "812 MiB", "12.3 GiB"
std::string format_memory(double bytes);

}  // namespace runner::train
