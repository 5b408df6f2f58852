// A file of named weights in either format users have: safetensors, or a torch.save state dict (.pt/.pth).
#pragma once

#include <string>
#include <vector>

#include "runtime/ckpt/safetensors.h"

namespace runner::ckpt {

// The tensors by name: a safetensors file as stored; a torch.save file's (nested) dicts of tensors flattened
// with "." (other values such as step counters are left out). Throws std::invalid_argument naming the path.
std::vector<NamedTensor> read_weights_file(const std::string& path);

}  // namespace runner::ckpt
