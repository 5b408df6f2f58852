// CUDA graphs of the trainer's step (runner.trainer { graph = ... }): the side stream that warm-up steps and
// captures run on, one memory pool for a trainer's graphs, capture and replay. Only cuda_graph_recorder.cpp sees CUDA.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <functional>
#include <memory>

namespace runner::train {

// Whether this build can capture CUDA graphs (LibTorch with CUDA).
bool cuda_graphs_built();

// The graphs of one trainer's step, by id. They share a side stream, on which warm-up steps run and captures
// are recorded (as torch.cuda.graph asks: the lazily made state of cuBLAS and the allocator belongs to the
// capturing stream), and one memory pool (they never run at the same time). Throws std::invalid_argument off
// CUDA or in a build without CUDA.
class CudaGraphRecorder {
 public:
  explicit CudaGraphRecorder(c10::Device device);
  ~CudaGraphRecorder();
  CudaGraphRecorder(const CudaGraphRecorder&) = delete;
  CudaGraphRecorder& operator=(const CudaGraphRecorder&) = delete;

  // Runs `work` on the side stream, after the current stream's queued work and before its later work.
  void on_side_stream(const std::function<void()>& work);
  // Records `work` on the side stream into graph `id` (replacing one of that id), in the shared pool; the
  // device runs none of it. The allocator's cached blocks are released first, so that the pool can take them.
  // A throw inside ends the capture and is passed on.
  void capture(std::size_t id, const std::function<void()>& work);
  // Launches graph `id` on the current stream (std::out_of_range when there is none).
  void replay(std::size_t id);
  void clear();  // drops every graph

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace runner::train
