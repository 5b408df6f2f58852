// NumPy .npz archives (np.savez / np.savez_compressed): named arrays in a zip, read and written.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <string>

namespace runner::data {

// Every array of the archive by name (without ".npy"), as CPU tensors. Stored and deflated members, zip64
// included. Throws DataError naming the path for anything else.
std::map<std::string, at::Tensor> load_npz(const std::string& path);

// Writes the arrays uncompressed (as np.savez does), atomically.
void save_npz(const std::string& path, const std::map<std::string, at::Tensor>& arrays);

}  // namespace runner::data
