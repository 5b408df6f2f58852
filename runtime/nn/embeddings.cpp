// Sinusoidal timestep embeddings and the 2-D sin-cos position embedding.
#include "runtime/nn/embeddings.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace runner::nn {
namespace {

at::Tensor timesteps_as_float(const at::Tensor& t) {
  if (t.dim() != 1)
    throw std::invalid_argument("timesteps must be a 1-D tensor [batch], got " + std::to_string(t.dim()) +
                                " dimensions");
  return t.to(at::kFloat);
}

void check_even(std::int64_t dim, const char* what) {
  if (dim < 2 || dim % 2 != 0)
    throw std::invalid_argument(std::string(what) + " must be even and at least 2, got " + std::to_string(dim));
}

}  // namespace

at::Tensor ddpm_timestep_embedding(const at::Tensor& t, std::int64_t dim) {
  check_even(dim, "timestep embedding width");
  if (dim < 4) throw std::invalid_argument("timestep embedding width must be at least 4, got " + std::to_string(dim));
  const std::int64_t half = dim / 2;
  const double step = std::log(10000.0) / static_cast<double>(half - 1);
  const auto time = timesteps_as_float(t);
  const auto freqs = at::exp(at::arange(half, time.options()) * -step);
  const auto args = time.unsqueeze(1) * freqs.unsqueeze(0);
  return at::cat({at::sin(args), at::cos(args)}, 1);
}

at::Tensor dit_timestep_embedding(const at::Tensor& t, std::int64_t dim, double max_period) {
  check_even(dim, "timestep embedding width");
  const std::int64_t half = dim / 2;
  const auto time = timesteps_as_float(t);
  const auto freqs = at::exp(-std::log(max_period) * at::arange(0, half, time.options()) / static_cast<double>(half));
  const auto args = time.unsqueeze(1) * freqs.unsqueeze(0);
  return at::cat({at::cos(args), at::sin(args)}, 1);
}

at::Tensor sincos_position_embedding_2d(std::int64_t dim, std::int64_t grid) {
  if (dim % 4 != 0)
    throw std::invalid_argument("2-D position embedding width must be a multiple of 4, got " + std::to_string(dim));
  const auto options = at::TensorOptions().dtype(at::kDouble);
  const std::int64_t quarter = dim / 4;
  const auto omega = 1.0 / at::pow(10000.0, at::arange(quarter, options) / static_cast<double>(quarter));
  const auto index = at::arange(grid * grid, at::TensorOptions().dtype(at::kLong));
  auto encode = [&](const at::Tensor& position) {
    const auto angles = position.to(at::kDouble).unsqueeze(1) * omega.unsqueeze(0);
    return at::cat({at::sin(angles), at::cos(angles)}, 1);
  };
  const auto column = at::remainder(index, grid);
  const auto row = at::div(index, grid, "floor");
  return at::cat({encode(column), encode(row)}, 1).to(at::kFloat);
}

}  // namespace runner::nn
