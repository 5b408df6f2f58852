// CUDA graphs of the trainer's step: the side stream, the shared pool, capture and replay.
#include "runtime/train/cuda_graph_recorder.h"

#include <fmt/format.h>

#include <map>
#include <stdexcept>

#if RUNNER_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace runner::train {

#if RUNNER_WITH_CUDA

bool cuda_graphs_built() { return true; }

struct CudaGraphRecorder::Impl {
  c10::Device device;
  c10::cuda::CUDAStream side;
  c10::MempoolId_t pool;
  std::map<std::size_t, std::unique_ptr<at::cuda::CUDAGraph>> graphs;

  explicit Impl(c10::Device d)
      : device(d), side(c10::cuda::getStreamFromPool(false, d.index())), pool(at::cuda::graph_pool_handle()) {}

  // Runs `work` on the side stream, ordered after the current stream's work and before its later work, even when
  // `work` throws.
  void ordered_on_side(const std::function<void()>& work) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);
    auto rejoin = [&] {
      at::cuda::CUDAEvent done;
      done.record(side);
      done.block(current);
    };
    try {
      const c10::cuda::CUDAStreamGuard guard(side);
      work();
    } catch (...) {
      rejoin();
      throw;
    }
    rejoin();
  }
};

CudaGraphRecorder::CudaGraphRecorder(c10::Device device) {
  if (!device.is_cuda())
    throw std::invalid_argument(fmt::format("CUDA graphs need a CUDA device, got {}", device.str()));
  const c10::cuda::CUDAGuard guard(device);
  impl_ = std::make_unique<Impl>(device);
}

CudaGraphRecorder::~CudaGraphRecorder() = default;

void CudaGraphRecorder::on_side_stream(const std::function<void()>& work) { impl_->ordered_on_side(work); }

void CudaGraphRecorder::capture(std::size_t id, const std::function<void()>& work) {
  const c10::cuda::CUDAGuard device_guard(impl_->device);
  impl_->graphs.erase(id);
  c10::cuda::CUDACachingAllocator::emptyCache();
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  impl_->ordered_on_side([&] {
    graph->capture_begin(impl_->pool);
    try {
      work();
    } catch (...) {
      try {
        graph->capture_end();
      } catch (...) {
      }
      throw;
    }
    graph->capture_end();
  });
  impl_->graphs[id] = std::move(graph);
}

void CudaGraphRecorder::replay(std::size_t id) {
  auto it = impl_->graphs.find(id);
  if (it == impl_->graphs.end()) throw std::out_of_range(fmt::format("no CUDA graph {} was captured", id));
  const c10::cuda::CUDAGuard device_guard(impl_->device);
  it->second->replay();
}

void CudaGraphRecorder::clear() { impl_->graphs.clear(); }

#else

bool cuda_graphs_built() { return false; }

struct CudaGraphRecorder::Impl {};

CudaGraphRecorder::CudaGraphRecorder(c10::Device device) {
  throw std::invalid_argument(
      fmt::format("CUDA graphs need a build of runner with CUDA (this one has none; the device is {})", device.str()));
}
CudaGraphRecorder::~CudaGraphRecorder() = default;
void CudaGraphRecorder::on_side_stream(const std::function<void()>& work) { work(); }
void CudaGraphRecorder::capture(std::size_t, const std::function<void()>&) {}
void CudaGraphRecorder::replay(std::size_t id) {
  throw std::out_of_range(fmt::format("no CUDA graph {} was captured", id));
}
void CudaGraphRecorder::clear() {}

#endif

}  // namespace runner::train
