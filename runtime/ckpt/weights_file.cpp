// Reading named weights from safetensors or torch.save files.
#include "runtime/ckpt/weights_file.h"

#include <fmt/format.h>

#include <stdexcept>

#include "runtime/ckpt/pytorch_file.h"

namespace runner::ckpt {
namespace {

void flatten(const c10::IValue& value, const std::string& prefix, std::vector<NamedTensor>& out) {
  if (value.isTensor()) {
    out.push_back({prefix, value.toTensor()});
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::to_string(entry.key().toInt());
      flatten(entry.value(), prefix.empty() ? key : prefix + "." + key, out);
    }
  }
}

}  // namespace

std::vector<NamedTensor> read_weights_file(const std::string& path) {
  if (!is_torch_save_file(path)) return load_safetensors(path).tensors;
  std::vector<NamedTensor> tensors;
  flatten(read_pytorch_file(path), "", tensors);
  if (tensors.empty()) throw std::invalid_argument(fmt::format("{}: holds no tensors", path));
  return tensors;
}

}  // namespace runner::ckpt
