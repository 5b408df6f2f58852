// Device name parsing and CUDA availability.
#include "runtime/core/device.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <charconv>
#include <stdexcept>

#include "runtime/core/launch_context.h"

#if RUNNER_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace runner::core {

bool cuda_available() { return at::hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0; }

int cuda_device_count() { return at::hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().deviceCount()) : 0; }

bool stream_capturing(const c10::Device& device) {
#if RUNNER_WITH_CUDA
  if (device.is_cuda()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()), &status));
    return status != cudaStreamCaptureStatusNone;
  }
#endif
  (void)device;
  return false;
}

c10::Device parse_device(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "auto") {
    if (!cuda_available()) return c10::Device(c10::kCPU);
    // One GPU per local rank (cuda:0 for a single process).
    const int local_rank = launch_context().local_rank;
    if (local_rank >= cuda_device_count())
      throw std::invalid_argument("device 'auto' is cuda:" + std::to_string(local_rank) + " for local rank " +
                                  std::to_string(local_rank) + ", but only " + std::to_string(cuda_device_count()) +
                                  " CUDA device(s) are present");
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  }
  int index = 0;
  bool is_cuda = false;
  if (name == "cuda") {
    is_cuda = true;
  } else if (name.rfind("cuda:", 0) == 0 && name.size() > 5) {
    const char* first = name.data() + 5;
    const char* last = name.data() + name.size();
    auto [end, error] = std::from_chars(first, last, index);
    is_cuda = error == std::errc() && end == last && index >= 0;
  }
  if (!is_cuda) throw std::invalid_argument("unknown device '" + name + "' (expected cpu, cuda, cuda:N or auto)");
  const int count = cuda_device_count();
  if (count == 0) throw std::invalid_argument("device '" + name + "' requested but CUDA is not available");
  if (index >= count)
    throw std::invalid_argument("device '" + name + "' requested but only " + std::to_string(count) +
                                " CUDA device(s) are present");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::string device_name(const c10::Device& device) {
  if (device.is_cpu()) return "cpu";
  std::string name = c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  return device.has_index() ? name + ":" + std::to_string(device.index()) : name;
}

void set_tf32(bool enabled) {
  at::globalContext().setAllowTF32CuBLAS(enabled);
  at::globalContext().setAllowTF32CuDNN(enabled);
}

bool tf32_enabled() { return at::globalContext().allowTF32CuBLAS() && at::globalContext().allowTF32CuDNN(); }

ComputeCapability cuda_compute_capability(int index) {
#if RUNNER_WITH_CUDA
  cudaDeviceProp properties{};
  C10_CUDA_CHECK(cudaGetDeviceProperties(&properties, index));
  return {properties.major, properties.minor};
#else
  static_cast<void>(index);
  return {};
#endif
}

CudaMemory cuda_memory(int index) {
  const auto stats =
      c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(static_cast<c10::DeviceIndex>(index));
  const auto& all = stats.allocated_bytes[0];  // the aggregate over the small and large pools
  return {static_cast<double>(all.current), static_cast<double>(all.peak),
          static_cast<double>(stats.reserved_bytes[0].current)};
}

void reset_cuda_peak_memory(int index) {
  c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

}  // namespace runner::core
