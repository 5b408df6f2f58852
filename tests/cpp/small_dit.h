// Test helper: the options of a small class-conditional DiT (hidden 64, 2 heads, 8x8x4 input, 3 classes) that the
// CPU runs in milliseconds.
#pragma once

#include <cstdint>

#include "runtime/nn/dit.h"

namespace runner::testing {

inline nn::DiTOptions small_dit_options(std::int64_t depth = 2) {
  nn::DiTOptions options = nn::dit_preset("DiT-S/2");
  options.depth = depth;
  options.hidden = 64;
  options.heads = 2;
  options.image = 8;
  options.classes = 3;
  return options;
}

}  // namespace runner::testing
