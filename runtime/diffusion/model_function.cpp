// A model output's channels: the prediction alone, or with learned-variance channels.
#include "runtime/diffusion/model_function.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "runtime/core/shape_text.h"

namespace runner::diffusion {

bool learns_sigma(const at::Tensor& output, const at::Tensor& x) {
  const auto fail = [&] {
    const std::int64_t channels = x.dim() >= 2 ? x.size(1) : 0;
    throw std::invalid_argument(fmt::format(
        "model output of shape {} does not fit input of shape {}: expected the same shape with {} or {} channels",
        output.defined() ? core::shape_text(output.sizes()) : std::string("(undefined)"), core::shape_text(x.sizes()),
        channels, 2 * channels));
  };
  if (!output.defined() || x.dim() < 2 || output.dim() != x.dim() || output.size(0) != x.size(0)) fail();
  for (std::int64_t d = 2; d < x.dim(); ++d) {
    if (output.size(d) != x.size(d)) fail();
  }
  if (output.size(1) == x.size(1)) return false;
  if (output.size(1) == 2 * x.size(1)) return true;
  fail();
  return false;
}

}  // namespace runner::diffusion
