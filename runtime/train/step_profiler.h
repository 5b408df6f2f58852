// Records a range of training steps with LibTorch's Kineto profiler: a Chrome/Perfetto trace and the top operators.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/train/step_observer.h"

namespace runner::train {

// Steps first..last, 1-based and inclusive.
struct StepRange {
  std::int64_t first = 0;
  std::int64_t last = 0;
};

// "A:B" or "A" (A:A) with 1 <= A <= B. Throws std::invalid_argument naming the text and the form expected.
StepRange parse_step_range(const std::string& text);

struct OperatorTime {
  std::string name;
  double self_ms = 0;   // time in the operator itself, its children's time left out (CPU) or kernel time (CUDA)
  double total_ms = 0;  // with its children (CPU); the same as self_ms for kernels
  std::int64_t calls = 0;
};

struct ProfileSummary {
  std::string trace_path;
  std::vector<OperatorTime> cpu;      // CPU operators by self time, most first
  std::vector<OperatorTime> kernels;  // CUDA kernels by time, most first (empty without CUDA)
  double cpu_self_ms = 0;             // all CPU operators' self time
  double kernel_ms = 0;               // all kernels' time
  bool cuda = false;                  // CUDA activity was recorded
};

// Starts the process's Kineto profiler: CPU operators with their input shapes and memory events, and CUDA
// kernels and copies when `cuda`. Throws std::runtime_error when a profiler is already running.
void start_profiler(bool cuda);

// Stops the profiler started by start_profiler, writes the trace (Chrome trace JSON, opened by Perfetto and
// chrome://tracing) to `trace_path` and returns the operators by self time.
ProfileSummary stop_profiler(const std::string& trace_path);

// The `rows` operators with the most self time (and the kernels on CUDA) as an aligned text table.
std::string format_profile(const ProfileSummary& summary, std::size_t rows);

// Where a profile's trace goes: into `directory` ("": the working directory), then `record(file name, step)` when
// given (a run records it as an artifact).
struct ProfileOutput {
  std::string directory;
  std::function<void(const std::string& name, std::int64_t step)> record;
};

// A trainer's steps `range` profiled: the profiler starts before the first and stops after the last, writing
// profile-steps-A-B.json (-rankR in a job of several ranks) where `output()` says at that moment; rank 0 prints
// the file's path and the top operators.
class ProfiledSteps : public StepObserver {
 public:
  ProfiledSteps(StepRange range, c10::Device device, int rank, int world_size, std::function<ProfileOutput()> output);
  void before_step(const StepStart& start) override;
  void after_step(const StepResult& result) override;

 private:
  StepRange range_;
  c10::Device device_;
  int rank_;
  int world_size_;
  std::function<ProfileOutput()> output_;
  bool running_ = false;
};

}  // namespace runner::train
