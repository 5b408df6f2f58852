// Device names as users write them ("cpu", "cuda", "cuda:1", "auto") and their resolution to c10::Device.
#pragma once
#include <c10/core/Device.h>
#include <string>

namespace runner::core {

// "auto" is the CUDA device of this process's local rank (launch_context.h; cuda:0 for a single process)
// when CUDA is available, else the CPU. Throws std::invalid_argument
// naming the bad text and the accepted forms, or when CUDA is asked for and not available.
c10::Device parse_device(const std::string& name);

// "cpu", "cuda:0", ...: the inverse of parse_device for concrete devices.
std::string device_name(const c10::Device& device);

bool cuda_available();
int cuda_device_count();

// The compute capability of CUDA device `index`, e.g. {9, 0} on a Hopper GPU; {0, 0} in a build without CUDA.
struct ComputeCapability {
  int major = 0, minor = 0;
};
ComputeCapability cuda_compute_capability(int index);

// Whether the device's current stream is being captured into a CUDA graph: then nothing may wait for the
// device or query an event, and an event recorded becomes a node of the graph. False off CUDA.
bool stream_capturing(const c10::Device& device);

// TF32 for float32 matrix multiplications and convolutions on CUDA (cuBLAS and cuDNN); ATen's default leaves
// convolutions on TF32 and matmuls off. tf32_enabled() is true when both are on.
void set_tf32(bool enabled);
bool tf32_enabled();

// Bytes held by tensors on CUDA device `index`, now and at most since the last reset, and bytes the caching
// allocator holds from the driver (the caching allocator's counts); reset_cuda_peak_memory starts a new peak.
struct CudaMemory {
  double allocated = 0;
  double peak_allocated = 0;
  double reserved = 0;
};
CudaMemory cuda_memory(int index);
void reset_cuda_peak_memory(int index);

}  // namespace runner::core
