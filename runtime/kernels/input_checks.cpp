// The input checks of runner's token ops: shapes, dtypes and devices, named in the messages.
#include "runtime/kernels/input_checks.h"

#include <c10/util/Exception.h>

#include <array>
#include <cstdint>
#include <sstream>
#include <vector>

namespace runner::kernels {
namespace {

// "a", "a and b", "a, b and c".
template <typename Item>
std::string listed(const std::vector<Item>& items) {
  std::ostringstream text;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) text << (i + 1 == items.size() ? " and " : ", ");
    text << items[i];
  }
  return text.str();
}

}  // namespace

void check_token_tensor(const char* op, NamedTensor tokens) {
  TORCH_CHECK(tokens.second.dim() == 3, op, ": ", tokens.first, " must be [batch, tokens, channels], got ",
              tokens.second.sizes());
}

void check_per_sample(const char* op, NamedTensor per_sample, NamedTensor tokens) {
  const auto& x = tokens.second;
  const std::array<std::int64_t, 2> expected{x.size(0), x.size(2)};
  TORCH_CHECK(per_sample.second.sizes() == expected, op, ": ", per_sample.first,
              " must be [batch, channels] = ", at::IntArrayRef(expected), " for ", tokens.first, " of ", x.sizes(),
              ", got ", per_sample.second.sizes());
}

void check_same_shape(const char* op, NamedTensor same, NamedTensor tokens) {
  TORCH_CHECK(same.second.sizes() == tokens.second.sizes(), op, ": ", same.first, " must have the shape of ",
              tokens.first, ", ", tokens.second.sizes(), ", got ", same.second.sizes());
}

void check_floating_on_one_device(const char* op, std::initializer_list<NamedTensor> inputs) {
  std::vector<const char*> names;
  std::vector<c10::ScalarType> dtypes;
  std::vector<c10::Device> devices;
  bool floating = true, one_device = true;
  for (const auto& [name, tensor] : inputs) {
    names.push_back(name);
    dtypes.push_back(tensor.scalar_type());
    devices.push_back(tensor.device());
    floating = floating && tensor.is_floating_point();
    one_device = one_device && tensor.device() == inputs.begin()->second.device();
  }
  TORCH_CHECK(floating, op, ": ", listed(names), " must be floating point, got ", listed(dtypes));
  TORCH_CHECK(one_device, op, ": ", listed(names), " must be on one device, got ", listed(devices));
}

}  // namespace runner::kernels
