// Records a range of training steps with LibTorch's Kineto profiler: a Chrome/Perfetto trace and the top operators.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace runner::train
