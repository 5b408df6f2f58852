// Per-step host numbers in one device tensor: a pinned staging tensor, one non_blocking copy, an event.
#include "runtime/train/device_scalars.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>

#include "runtime/core/device.h"

namespace runner::train {

DeviceScalars::DeviceScalars(std::size_t count, c10::Device device) {
  const auto size = static_cast<std::int64_t>(count);
  if (device.is_cpu()) {
    values_ = host_ = at::zeros({size}, at::kFloat);
  } else {
    host_ = at::zeros({size}, at::TensorOptions().dtype(at::kFloat).pinned_memory(device.is_cuda()));
    values_ = at::zeros({size}, at::TensorOptions().dtype(at::kFloat).device(device));
  }
  for (std::int64_t i = 0; i < size; ++i) elements_.push_back(values_.select(0, i));
}

void DeviceScalars::write(const std::vector<double>& values) {
  if (values.size() != elements_.size()) {
    throw std::invalid_argument(
        fmt::format("device scalars: {} values for {} places", values.size(), elements_.size()));
  }
  if (values.empty()) return;
  const bool captured = core::stream_capturing(values_.device());
  if (copied_ && !captured && !copied_->query()) copied_->synchronize();
  float* host = host_.data_ptr<float>();
  for (std::size_t i = 0; i < values.size(); ++i) host[i] = static_cast<float>(values[i]);
  if (values_.is_same(host_)) return;
  values_.copy_(host_, /*non_blocking=*/true);
  if (captured) return;
  const c10::impl::VirtualGuardImpl guard(values_.device().type());
  if (!copied_) copied_.emplace(values_.device().type());
  copied_->record(guard.getStream(values_.device()));
}

}  // namespace runner::train
