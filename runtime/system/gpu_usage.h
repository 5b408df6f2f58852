// A CUDA device's utilisation, memory in use, power and temperature as its driver reports them through NVML.
// NVML is opened at run time (dlopen of libnvidia-ml.so.1, which the NVIDIA driver installs), so neither the build
// nor a host without a GPU needs it. The device is found by its PCI bus id, so CUDA_VISIBLE_DEVICES renumbering
// CUDA's devices does not matter. The tests run on hosts without a GPU: this file is unverified on one.
#pragma once

#include <memory>
#include <optional>

namespace runner::system {

struct GpuReading {
  // Each is absent when the device does not report it (NVML_ERROR_NOT_SUPPORTED, e.g. power on some boards).
  std::optional<double> utilization_percent;  // of the last sample period, the time a kernel ran
  std::optional<double> memory_used_bytes;    // by every process on the device, as nvidia-smi shows it
  std::optional<double> power_watts;
  std::optional<double> temperature_celsius;  // of the GPU die
};

class NvmlDevice {
 public:
  // NVML's device for CUDA device `cuda_index`. Throws std::runtime_error saying why there is none: a build
  // without CUDA, no libnvidia-ml.so.1, or an NVML error (with its text).
  static std::unique_ptr<NvmlDevice> open(int cuda_index);
  ~NvmlDevice();  // shuts NVML down and closes the library
  NvmlDevice(const NvmlDevice&) = delete;
  NvmlDevice& operator=(const NvmlDevice&) = delete;

  GpuReading read() const;

  struct Library;

 private:
  explicit NvmlDevice(std::unique_ptr<Library> library);
  std::unique_ptr<Library> library_;
};

}  // namespace runner::system
