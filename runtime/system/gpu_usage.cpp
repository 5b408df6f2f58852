// NVML through dlopen: the few functions a run's system metrics call, declared here with NVML's C signatures.
#include "runtime/system/gpu_usage.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

#include <fmt/format.h>

#if RUNNER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace runner::system {
namespace {

// From nvml.h (NVML's API is C and stable; the _v2 names are those the driver has exported since CUDA 5.5).
using NvmlReturn = int;  // nvmlReturn_t: 0 is NVML_SUCCESS
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
using NvmlDeviceHandle = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

}  // namespace

struct NvmlDevice::Library {
  void* handle = nullptr;
  NvmlDeviceHandle device = nullptr;
  bool initialized = false;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*device_by_pci_bus_id)(const char*, NvmlDeviceHandle*) = nullptr;
  NvmlReturn (*utilization)(NvmlDeviceHandle, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory)(NvmlDeviceHandle, NvmlMemory*) = nullptr;
  NvmlReturn (*power_milliwatts)(NvmlDeviceHandle, unsigned int*) = nullptr;
  NvmlReturn (*temperature)(NvmlDeviceHandle, int, unsigned int*) = nullptr;

  ~Library() {
    if (initialized) shutdown();
    if (handle) ::dlclose(handle);
  }

  template <class F>
  void find(F& function, const char* name) {
    function = reinterpret_cast<F>(::dlsym(handle, name));
    if (!function) throw std::runtime_error(fmt::format("libnvidia-ml.so.1 has no {}", name));
  }

  void check(NvmlReturn status, const char* call) const {
    if (status != kNvmlSuccess) throw std::runtime_error(fmt::format("NVML {}: {}", call, error_string(status)));
  }
};

NvmlDevice::NvmlDevice(std::unique_ptr<Library> library) : library_(std::move(library)) {}
NvmlDevice::~NvmlDevice() = default;

std::unique_ptr<NvmlDevice> NvmlDevice::open([[maybe_unused]] int cuda_index) {
#if RUNNER_WITH_CUDA
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, cuda_index) != cudaSuccess)
    throw std::runtime_error(fmt::format("CUDA has no PCI bus id for cuda:{}", cuda_index));
  auto library = std::make_unique<Library>();
  library->handle = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library->handle) throw std::runtime_error(fmt::format("cannot load libnvidia-ml.so.1: {}", ::dlerror()));
  library->find(library->init, "nvmlInit_v2");
  library->find(library->shutdown, "nvmlShutdown");
  library->find(library->error_string, "nvmlErrorString");
  library->find(library->device_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
  library->find(library->utilization, "nvmlDeviceGetUtilizationRates");
  library->find(library->memory, "nvmlDeviceGetMemoryInfo");
  library->find(library->power_milliwatts, "nvmlDeviceGetPowerUsage");
  library->find(library->temperature, "nvmlDeviceGetTemperature");
  library->check(library->init(), "nvmlInit");
  library->initialized = true;
  library->check(library->device_by_pci_bus_id(bus_id, &library->device),
                 fmt::format("nvmlDeviceGetHandleByPciBusId({})", bus_id).c_str());
  return std::unique_ptr<NvmlDevice>(new NvmlDevice(std::move(library)));
#else
  throw std::runtime_error("this runner is built without CUDA");
#endif
}

GpuReading NvmlDevice::read() const {
  const Library& nvml = *library_;
  GpuReading reading;
  if (NvmlUtilization rates{}; nvml.utilization(nvml.device, &rates) == kNvmlSuccess)
    reading.utilization_percent = rates.gpu;
  if (NvmlMemory memory{}; nvml.memory(nvml.device, &memory) == kNvmlSuccess)
    reading.memory_used_bytes = static_cast<double>(memory.used);
  if (unsigned int milliwatts = 0; nvml.power_milliwatts(nvml.device, &milliwatts) == kNvmlSuccess)
    reading.power_watts = milliwatts / 1000.0;
  if (unsigned int celsius = 0; nvml.temperature(nvml.device, kNvmlTemperatureGpu, &celsius) == kNvmlSuccess)
    reading.temperature_celsius = celsius;
  return reading;
}

}  // namespace runner::system
