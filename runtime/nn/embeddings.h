// Fixed embeddings of the diffusion networks: sinusoidal timestep embeddings (DDPM and DiT variants) and
// DiT's 2-D sin-cos position embedding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace runner::nn {

// DDPM (Ho et al.): cat(sin(t f), cos(t f)), f_k = exp(-k ln(10000) / (dim/2 - 1)). Returns [B, dim] float32.
at::Tensor ddpm_timestep_embedding(const at::Tensor& t, std::int64_t dim);

// DiT: cat(cos(t f), sin(t f)), f_k = exp(-ln(max_period) k / (dim/2)). Returns [B, dim] float32.
at::Tensor dit_timestep_embedding(const at::Tensor& t, std::int64_t dim, double max_period = 10000.0);

// [grid*grid, dim] float32: first dim/2 channels encode the token's column, the last dim/2 its row.
at::Tensor sincos_position_embedding_2d(std::int64_t dim, std::int64_t grid);

}  // namespace runner::nn
