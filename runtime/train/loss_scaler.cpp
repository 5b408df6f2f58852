// Dynamic loss scaling with the fused AMP kernels GradScaler uses.
#include "runtime/train/loss_scaler.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <map>
#include <stdexcept>

namespace runner::train {

LossScaler::LossScaler(const LossScalerOptions& options, const at::Device& device) : options_(options) {
  if (!(options.init_scale > 0) || !(options.growth_factor > 1) ||
      !(options.backoff_factor > 0 && options.backoff_factor < 1) || options.growth_interval < 1)
    throw std::invalid_argument(fmt::format(
        "loss scaler: init_scale must be > 0, growth_factor > 1, backoff_factor in (0, 1) and growth_interval >= 1 "
        "(got {}, {}, {}, {})",
        options.init_scale, options.growth_factor, options.backoff_factor, options.growth_interval));
  scale_ = at::full({1}, options.init_scale, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
}

at::Tensor LossScaler::scale_loss(const at::Tensor& loss) const { return loss * scale_.to(loss.device()); }

at::Tensor LossScaler::unscale(const std::vector<at::Tensor>& gradients) {
  at::Tensor found_inf = at::zeros({1}, scale_.options());
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  // The kernel takes the gradients of one device at a time, like GradScaler's per-device grouping.
  std::map<std::pair<int, int>, std::vector<at::Tensor>> by_device;
  for (const auto& gradient : gradients)
    if (gradient.defined())
      by_device[{static_cast<int>(gradient.device().type()), gradient.device().index()}].push_back(gradient);
  for (auto& [key, group] : by_device) {
    const at::Device device = group.front().device();
    at::Tensor device_found = found_inf.to(device);
    at::_amp_foreach_non_finite_check_and_unscale_(group, device_found, inv_scale.to(device));
    if (device != found_inf.device())
      found_inf.add_(device_found.to(found_inf.device()));
    else
      found_inf = device_found;
  }
  return found_inf.clamp_max(1.0);
}

void LossScaler::update(const at::Tensor& found_inf) {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf.to(scale_.device()), options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
}

double LossScaler::scale() const { return scale_.item<double>(); }

int64_t LossScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

std::vector<std::pair<std::string, at::Tensor>> LossScaler::state_tensors() const {
  return {{"scale", scale_.cpu()}, {"growth_tracker", growth_tracker_.cpu()}};
}

void LossScaler::load_state_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  at::Tensor scale, tracker;
  for (const auto& [name, tensor] : tensors) {
    if (name == "scale")
      scale = tensor;
    else if (name == "growth_tracker")
      tracker = tensor;
    else
      throw std::invalid_argument("loss scaler state: unknown tensor '" + name + "'");
  }
  if (!scale.defined() || !tracker.defined())
    throw std::invalid_argument("loss scaler state: needs 'scale' and 'growth_tracker'");
  if (scale.numel() != 1 || tracker.numel() != 1)
    throw std::invalid_argument("loss scaler state: 'scale' and 'growth_tracker' must hold one value each");
  scale_.copy_(scale.reshape({1}));
  growth_tracker_.copy_(tracker.reshape({1}));
}

}  // namespace runner::train
