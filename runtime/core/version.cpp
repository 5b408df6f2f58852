// Collects runner, LibTorch, CUDA and SQLite versions.
#include "runtime/core/version.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <sqlite3.h>
#include <torch/version.h>

#include "runtime/core/device.h"

#if RUNNER_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace runner::core {

VersionInfo version_info() {
  VersionInfo info;
  info.runner = RUNNER_VERSION;
  info.libtorch = TORCH_VERSION;
  info.sqlite = sqlite3_libversion();
  try {
    // Answers when LibTorch's CUDA library is loaded, with or without a GPU and driver.
    const long version = at::detail::getCUDAHooks().versionCUDART();
    if (version > 0) info.cuda_runtime = fmt::format("{}.{}", version / 1000, version % 1000 / 10);
  } catch (const c10::Error&) {
    info.cuda_runtime.clear();
  }
  info.cuda_available = cuda_available();
#if RUNNER_WITH_CUDA
  for (int i = 0; i < cuda_device_count(); ++i) {
    const cudaDeviceProp* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i));
    info.cuda_devices.push_back(fmt::format("{} (sm_{}{}, {:.1f} GiB)", props->name, props->major, props->minor,
                                            static_cast<double>(props->totalGlobalMem) / (1 << 30)));
  }
#endif
  return info;
}

}  // namespace runner::core
