// Test helper: records work into a CUDA graph on the current stream, ending the capture when the work throws.
#pragma once

#if RUNNER_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>

#include <functional>

namespace runner::testing {

// Captures `work` into `graph`. A throw inside ends the capture first, so the failure is reported rather than a
// stream left capturing.
inline void capture_into(at::cuda::CUDAGraph& graph, const std::function<void()>& work) {
  graph.capture_begin();
  try {
    work();
  } catch (...) {
    try {
      graph.capture_end();
    } catch (...) {
    }
    throw;
  }
  graph.capture_end();
}

}  // namespace runner::testing
#endif
