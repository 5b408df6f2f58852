// Capturing and restoring the process's default random generators.
#include "runtime/train/rng_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ATen.h>

#include <fmt/format.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "runtime/core/device.h"

namespace runner::train {
namespace {

at::Generator default_generator(const c10::Device& device) { return at::globalContext().defaultGenerator(device); }

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
  for (int i = 0; i < cuda_devices; ++i)
    capture(fmt::format("rng.cuda.{}", i), c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
  return states;
}

void restore_rng_states(const std::vector<std::pair<std::string, at::Tensor>>& states) {
  const int cuda_devices = core::cuda_available() ? core::cuda_device_count() : 0;
  bool has_cpu = false;
  for (const auto& [name, state] : states) {
    const auto device = device_of_entry(name);
    if (!device) throw std::invalid_argument(fmt::format("rng state: unknown entry '{}'", name));
    if (device->is_cuda() && device->index() >= cuda_devices)
      throw std::invalid_argument(
          fmt::format("rng state: '{}' was saved on a CUDA device this process does not have "
                      "({} visible)",
                      name, cuda_devices));
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

std::string encode_rng_states(const std::vector<std::pair<std::string, at::Tensor>>& states) {
  std::string bytes;
  for (const auto& [name, state] : states) {
    const at::Tensor contiguous = state.contiguous();
    bytes += fmt::format("{}\n{}\n", name, contiguous.numel());
    bytes.append(static_cast<const char*>(contiguous.const_data_ptr()), static_cast<std::size_t>(contiguous.numel()));
  }
  return bytes;
}

std::vector<std::pair<std::string, at::Tensor>> decode_rng_states(const std::string& bytes) {
  std::vector<std::pair<std::string, at::Tensor>> states;
  std::size_t at = 0;
  while (at < bytes.size()) {
    const std::size_t name_end = bytes.find('\n', at);
    const std::size_t count_end = name_end == std::string::npos ? name_end : bytes.find('\n', name_end + 1);
    if (count_end == std::string::npos) throw std::invalid_argument("rng state: a truncated entry");
    const std::string name = bytes.substr(at, name_end - at);
    const std::string count_text = bytes.substr(name_end + 1, count_end - name_end - 1);
    if (count_text.empty() || count_text.find_first_not_of("0123456789") != std::string::npos || count_text.size() > 12)
      throw std::invalid_argument(fmt::format("rng state: entry '{}' has no byte count", name));
    const std::size_t count = std::stoull(count_text);
    if (count > bytes.size() - count_end - 1)
      throw std::invalid_argument(fmt::format("rng state: entry '{}' is truncated", name));
    at::Tensor state = at::empty({static_cast<std::int64_t>(count)}, at::kByte);
    std::memcpy(state.data_ptr(), bytes.data() + count_end + 1, count);
    states.emplace_back(name, state);
    at = count_end + 1 + count;
  }
  return states;
}

}  // namespace runner::train
