// Capturing and restoring the process's default random generators.
#include "runtime/train/rng_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <fmt/format.h>

#include <mutex>
#include <optional>
#include <stdexcept>

#include "runtime/core/device.h"

namespace runner::train {
namespace {

at::Generator default_generator(const c10::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

std::optional<c10::Device> device_of_entry(const std::string& name) {
  if (name == "rng.cpu") return c10::Device(c10::kCPU);
  const std::string prefix = "rng.cuda.";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return std::nullopt;
  int index = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9' || index > 1000) return std::nullopt;
    index = index * 10 + (c - '0');
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> capture_rng_states() {
  std::vector<std::pair<std::string, at::Tensor>> states;
  auto capture = [&](const std::string& name, const c10::Device& device) {
    at::Generator generator = default_generator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    states.emplace_back(name, generator.get_state());
  };
  capture("rng.cpu", c10::Device(c10::kCPU));
  const int cuda_devices = core::cuda_available() ? core::cuda_device_count() : 0;
  for (int i = 0; i < cuda_devices; ++i) capture(fmt::format("rng.cuda.{}", i), c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
  return states;
}

void restore_rng_states(const std::vector<std::pair<std::string, at::Tensor>>& states) {
  const int cuda_devices = core::cuda_available() ? core::cuda_device_count() : 0;
  bool has_cpu = false;
  for (const auto& [name, state] : states) {
    const auto device = device_of_entry(name);
    if (!device) throw std::invalid_argument(fmt::format("rng state: unknown entry '{}'", name));
    if (device->is_cuda() && device->index() >= cuda_devices)
      throw std::invalid_argument(fmt::format("rng state: '{}' was saved on a CUDA device this process does not have "
                                              "({} visible)", name, cuda_devices));
    if (!state.defined() || state.scalar_type() != at::kByte || state.dim() != 1 || !state.device().is_cpu())
      throw std::invalid_argument(fmt::format("rng state: '{}' must be a one-dimensional uint8 CPU tensor", name));
    has_cpu = has_cpu || device->is_cpu();
  }
  if (!has_cpu) throw std::invalid_argument("rng state: the CPU generator's state 'rng.cpu' is missing");
  for (const auto& [name, state] : states) {
    at::Generator generator = default_generator(*device_of_entry(name));
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.contiguous());
  }
}

}  // namespace runner::train
