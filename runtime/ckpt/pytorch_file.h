// torch.save files (.pt, .pth, .ckpt: the zip format of PyTorch >= 1.6 and the legacy format before it, e.g.
// pytorch-fid's Inception weights) read by an unpickler that constructs
// only tensors, dicts (OrderedDict too), lists, tuples, numbers, strings and None, and argparse.Namespace as a
// dict of its attributes (the `args` of DiT's train.py checkpoints), and runs no code: any other Python class is
// refused by name.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace runner::ckpt {

// True when the file starts as torch.save's files do (a zip archive, or the legacy format's pickle).
bool is_torch_save_file(const std::string& path);

// The saved value on the CPU. Throws std::invalid_argument naming the path: a Python object of another class
// (named), a damaged file.
c10::IValue read_pytorch_file(const std::string& path);

}  // namespace runner::ckpt
