// Every default random generator of the process (the CPU one and one per CUDA device), captured and restored
// as byte tensors so that a resumed run draws the same numbers as one that never stopped.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace runner::train {

// "rng.cpu" and "rng.cuda.<index>" for each visible CUDA device: the generators' get_state() (uint8 tensors).
std::vector<std::pair<std::string, at::Tensor>> capture_rng_states();

// Restores the states named as capture_rng_states() names them. The CPU state is required; a CUDA state for a
// device this process does not have is an error, and a device without a saved state keeps its own (a run
// resumed on more GPUs than it was saved on). Throws std::invalid_argument ("rng state: ...") on a missing,
// unknown or malformed entry, before any generator changes.
void restore_rng_states(const std::vector<std::pair<std::string, at::Tensor>>& states);

// The states as one byte string (to send to another rank) and back: per entry its name, a newline, the byte
// count, a newline and the bytes. decode throws std::invalid_argument ("rng state: ...") on malformed bytes.
std::string encode_rng_states(const std::vector<std::pair<std::string, at::Tensor>>& states);
std::vector<std::pair<std::string, at::Tensor>> decode_rng_states(const std::string& bytes);

}  // namespace runner::train
