// Guidance, step noise and the input checks both families' samplers share.
#include "runtime/diffusion/sampling.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <sstream>
#include <stdexcept>
#include <string>

#include "runtime/core/dtype.h"
#include "runtime/core/shape_text.h"

namespace runner::diffusion {

at::Tensor draw_step_noise(const NoiseSource& noise, std::int64_t step, const at::Tensor& like) {
  if (!noise) return at::randn_like(like);
  const at::Tensor z = noise(step, like);
  if (!z.defined() || z.sizes() != like.sizes()) {
    std::ostringstream message;
    message << "sampling noise for step " << step << " has shape ";
    if (z.defined())
      message << z.sizes();
    else
      message << "(undefined)";
    message << ", expected " << like.sizes();
    throw std::invalid_argument(message.str());
  }
  return z.to(like.options());
}

void check_sampling_inputs(const at::Tensor& x_T, const std::optional<at::Tensor>& labels, const Guidance& guidance) {
  if (!std::isfinite(guidance.scale) || guidance.scale < 0) {
    throw std::invalid_argument(fmt::format(
        "guidance must be a finite number >= 0 (1: none, 0: unconditional, above 1: towards the labels), got {}",
        guidance.scale));
  }
  if (!x_T.defined() || x_T.dim() < 2) {
    std::ostringstream shape;
    if (x_T.defined()) shape << x_T.sizes();
    throw std::invalid_argument(fmt::format("x_T must have a batch and a channel dimension, got shape {}",
                                            x_T.defined() ? shape.str() : std::string("(undefined)")));
  }
  if (labels) {
    const at::Tensor& y = *labels;
    if (!y.defined() || y.dim() != 1 || y.scalar_type() != at::kLong || y.size(0) != x_T.size(0)) {
      std::ostringstream shape;
      if (y.defined()) shape << y.sizes();
      throw std::invalid_argument(fmt::format(
          "labels must be an int64 tensor of shape [{}], got {}", x_T.size(0),
          y.defined() ? core::dtype_name(y.scalar_type()) + " " + shape.str() : std::string("an undefined tensor")));
    }
  }
  if (guidance.scale != 1) {
    if (!labels) {
      throw std::invalid_argument(
          fmt::format("guidance {} needs class labels (classifier-free guidance)", guidance.scale));
    }
    if (!guidance.null_label) {
      throw std::invalid_argument(
          fmt::format("guidance {} needs null_label, the unconditional class id", guidance.scale));
    }
  }
  if (guidance.channels && *guidance.channels < 1)
    throw std::invalid_argument(fmt::format("guidance_channels must be at least 1, got {}", *guidance.channels));
  if (guidance.channels && *guidance.channels > x_T.size(1))
    throw std::invalid_argument(fmt::format("guidance_channels = {} is more than the {} channels of a sample",
                                            *guidance.channels, x_T.size(1)));
}

AutocastDisabled::AutocastDisabled(at::DeviceType type) : type_(type) {
  active_ = at::autocast::is_autocast_available(type) && at::autocast::is_autocast_enabled(type);
  if (active_) at::autocast::set_autocast_enabled(type, false);
}

AutocastDisabled::~AutocastDisabled() {
  if (active_) at::autocast::set_autocast_enabled(type_, true);
}

at::Tensor guided_output(const ModelFunction& model, const at::Tensor& x, const at::Tensor& t,
                         const std::optional<at::Tensor>& labels, const Guidance& guidance) {
  if (guidance.scale == 1) {
    const at::Tensor output = model(x, t, labels);
    learns_sigma(output, x);
    return output.to(at::kFloat);
  }
  const std::int64_t batch = x.size(0);
  const at::Tensor& y = *labels;
  const at::Tensor doubled_x = at::cat({x, x});
  const at::Tensor doubled_labels = at::cat({y, at::full_like(y, *guidance.null_label)});
  const at::Tensor output = model(doubled_x, at::cat({t, t}), doubled_labels);
  learns_sigma(output, doubled_x);
  const at::Tensor out = output.to(at::kFloat);
  const std::int64_t guided = std::min(guidance.channels.value_or(x.size(1)), out.size(1));
  const at::Tensor cond = out.narrow(0, 0, batch);
  const at::Tensor uncond = out.narrow(0, batch, batch);
  const at::Tensor cond_guided = cond.narrow(1, 0, guided);
  const at::Tensor mixed = uncond.narrow(1, 0, guided) + guidance.scale * (cond_guided - uncond.narrow(1, 0, guided));
  if (guided == out.size(1)) return mixed;
  return at::cat({mixed, cond.narrow(1, guided, out.size(1) - guided)}, 1);
}

}  // namespace runner::diffusion
