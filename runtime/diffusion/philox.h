// Philox4x32-10 counter-based random words in int64 tensor ops, so every device computes the same numbers.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace runner::diffusion {

// Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC11; the
// generator behind cuRAND and PyTorch's CUDA RNG) of a 128-bit counter under a 64-bit key. The counter is
// four int64 tensors holding 32-bit words (broadcastable to one another, on any one device); the result is
// four int64 tensors of the broadcast shape holding 32-bit words. Written in element-wise tensor ops on
// 64-bit integers, whose results are exact on every device, so the CPU and a GPU produce identical words.
std::array<at::Tensor, 4> philox4x32_10(const std::array<at::Tensor, 4>& counter, std::uint64_t key);

// float64 in [0, 1) with 53 random bits: the top 27 bits of `high` and the top 26 of `low` (32-bit words).
at::Tensor uniform53(const at::Tensor& high, const at::Tensor& low);

}  // namespace runner::diffusion
