// Input checks shared by the built-in denoisers.
#include "runtime/nn/denoiser.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "runtime/core/shape_text.h"

namespace runner::nn {

void Denoiser::check_inputs(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels) const {
  const auto model = name();
  auto fail = [&](const std::string& message) { throw std::invalid_argument(fmt::format("{}: {}", model, message)); };
  if (x.dim() != 4 || x.size(1) != in_channels() || x.size(2) != image_size() || x.size(3) != image_size()) {
    fail(fmt::format("input must be [batch, {}, {}, {}], got {}", in_channels(), image_size(), image_size(),
                     core::shape_text(x.sizes())));
  }
  if (t.dim() != 1 || t.size(0) != x.size(0)) {
    fail(fmt::format("timesteps must be a 1-D tensor of {} values (one per sample), got {}", x.size(0),
                     core::shape_text(t.sizes())));
  }
  if (classes() == 0) {
    if (labels) fail("labels given to an unconditional model (classes = 0)");
    return;
  }
  if (!labels) fail(fmt::format("this model is class-conditional ({} classes): labels are required", classes()));
  const auto& y = *labels;
  if (y.dim() != 1 || y.size(0) != x.size(0)) {
    fail(fmt::format("labels must be a 1-D tensor of {} class ids, got {}", x.size(0), core::shape_text(y.sizes())));
  }
  if (y.scalar_type() != at::kLong && y.scalar_type() != at::kInt) {
    fail(fmt::format("labels must be integer class ids (int64), got {}", c10::toString(y.scalar_type())));
  }
  // A range check reads the values: only where that costs no device synchronisation.
  if (y.device().is_cpu() && y.numel() > 0) {
    const auto lowest = y.min().item<std::int64_t>();
    const auto highest = y.max().item<std::int64_t>();
    const std::int64_t limit = has_null_label() ? classes() : classes() - 1;
    if (lowest < 0 || highest > limit) {
      fail(fmt::format("labels must be in 0..{} ({} classes{}), got values in {}..{}", limit, classes(),
                       has_null_label() ? fmt::format(", {} = no label", classes()) : "", lowest, highest));
    }
  }
}

}  // namespace runner::nn
