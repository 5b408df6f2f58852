// PyTorch-style tensor pretty printer for tostring and the REPL: torch 2.11's repr, Lua spellings.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <string>

namespace runner::core {

// The fields of torch.set_printoptions, with the same defaults.
struct TensorFormatOptions {
  int precision = 4;              // digits after the decimal point
  std::int64_t threshold = 1000;  // more elements than this are summarized with "..."
  std::int64_t edgeitems = 3;     // items kept at each end of a summarized dimension
  int linewidth = 80;             // 1-D rows wrap before this column
};

// What Python's repr(t) prints, except that the suffixes read dtype=float64 (not torch.float64) and
// requires_grad=true; an undefined tensor is "tensor(undefined)" and booleans print as true/false.
// Lines break where Python's do: the shorter dtype suffix is measured as Python spells it.
// The elements shown are copied to the CPU to be read. Throws std::invalid_argument for complex
// dtypes and for a negative precision or edgeitems.
std::string format_tensor(const at::Tensor& t, const TensorFormatOptions& options = {});

}  // namespace runner::core
