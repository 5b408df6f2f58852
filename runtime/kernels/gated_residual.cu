// The CUDA kernels of runner::gated_residual: the forward in one pass over x and y, the backward in one pass per
// sample and channel (y's gradient for every token, gate's as their sum).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "runtime/kernels/gated_residual_cuda.h"
#include "runtime/kernels/token_kernels.cuh"

namespace runner::kernels {
namespace {

constexpr std::int64_t kRowThreads = 256;
constexpr std::int64_t kMaxBlocks = 1 << 20;

// gate * y rounded to the parameters' dtype, then x + that rounded to x's: as `x + gate * y` in ATen ops.
template <typename T, typename P>
__device__ __forceinline__ T gated_element(T x, P gate, P y) {
  using PC = compute_t<P>;
  using TC = compute_t<T>;
  const P product = static_cast<P>(mul_rn(static_cast<PC>(gate), static_cast<PC>(y)));
  return static_cast<T>(add_rn(static_cast<TC>(x), static_cast<TC>(product)));
}

// One token per block iteration; gate is read through its strides (a chunk of the adaLN modulation).
template <typename T, typename P>
__global__ void forward_kernel(const T* __restrict__ x, const P* __restrict__ gate, const P* __restrict__ y,
                               T* __restrict__ out, std::int64_t rows, std::int64_t tokens, std::int64_t channels,
                               std::int64_t gate_batch_stride, std::int64_t gate_channel_stride) {
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const P* gate_row = gate + (row / tokens) * gate_batch_stride;
    const std::int64_t first = row * channels;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      out[first + c] = gated_element(x[first + c], gate_row[c * gate_channel_stride], y[first + c]);
    }
  }
}

// The sum's gradient reaches the product in the parameters' dtype (the ATen graph's cast); y's gradient is that
// times gate, gate's the tokens' sum of that times y (each product rounded as the ATen ops round it).
template <typename T, typename P>
__global__ void backward_kernel(const T* __restrict__ grad, const P* __restrict__ gate, const P* __restrict__ y,
                                P* __restrict__ grad_gate, P* __restrict__ grad_y, std::int64_t tokens,
                                std::int64_t channels, std::int64_t gate_batch_stride,
                                std::int64_t gate_channel_stride) {
  using PC = compute_t<P>;
  __shared__ PC sums[kColumnSplit][33];
  const std::int64_t sample = blockIdx.y;
  const std::int64_t channel = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  PC sum = 0;
  if (channel < channels) {
    const PC gate_value = static_cast<PC>(gate[sample * gate_batch_stride + channel * gate_channel_stride]);
    for (std::int64_t token = threadIdx.y; token < tokens; token += kColumnSplit) {
      const std::int64_t at = (sample * tokens + token) * channels + channel;
      const PC grad_product = static_cast<PC>(static_cast<P>(grad[at]));
      if (grad_y != nullptr) grad_y[at] = static_cast<P>(mul_rn(grad_product, gate_value));
      if (grad_gate != nullptr) sum += static_cast<PC>(static_cast<P>(mul_rn(grad_product, static_cast<PC>(y[at]))));
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (grad_gate != nullptr && threadIdx.y == 0 && channel < channels) {
    for (int part = 1; part < kColumnSplit; ++part) sum += sums[part][threadIdx.x];
    grad_gate[sample * channels + channel] = static_cast<P>(sum);
  }
}

}  // namespace

at::Tensor gated_residual_cuda(const at::Tensor& x_any_layout, const at::Tensor& gate, const at::Tensor& y_any_layout) {
  const c10::cuda::CUDAGuard device(x_any_layout.device());
  const at::Tensor x = x_any_layout.contiguous(), y = y_any_layout.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  const std::int64_t rows = x.size(0) * x.size(1), channels = x.size(2);
  if (out.numel() == 0) return out;
  dispatch_token_dtypes(x.scalar_type(), y.scalar_type(), [&](auto tokens_type, auto parameters_type) {
    using T = typename decltype(tokens_type)::type;
    using P = typename decltype(parameters_type)::type;
    forward_kernel<T, P><<<static_cast<unsigned>(std::min(kMaxBlocks, rows)), row_threads(channels, kRowThreads), 0,
                           c10::cuda::getCurrentCUDAStream()>>>(x.const_data_ptr<T>(), gate.const_data_ptr<P>(),
                                                                y.const_data_ptr<P>(), out.mutable_data_ptr<T>(), rows,
                                                                x.size(1), channels, gate.stride(0), gate.stride(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gated_residual_backward_cuda(const at::Tensor& grad_any_layout,
                                                                const at::Tensor& gate, const at::Tensor& y_any_layout,
                                                                std::array<bool, 2> mask) {
  const c10::cuda::CUDAGuard device(y_any_layout.device());
  const at::Tensor grad = grad_any_layout.contiguous(), y = y_any_layout.contiguous();
  const auto batch = y.size(0), tokens = y.size(1), channels = y.size(2);
  at::Tensor grad_gate, grad_y;
  if (mask[0]) grad_gate = at::empty({batch, channels}, y.options());
  if (mask[1]) grad_y = at::empty(y.sizes(), y.options());
  if (batch == 0 || channels == 0) return {grad_gate, grad_y};
  if (tokens == 0) {
    if (mask[0]) grad_gate.zero_();
    return {grad_gate, grad_y};
  }
  TORCH_CHECK(batch <= 65535, "gated_residual: the CUDA backward takes at most 65535 samples, got ", batch);
  dispatch_token_dtypes(grad.scalar_type(), y.scalar_type(), [&](auto tokens_type, auto parameters_type) {
    using T = typename decltype(tokens_type)::type;
    using P = typename decltype(parameters_type)::type;
    const dim3 blocks(static_cast<unsigned>((channels + 31) / 32), static_cast<unsigned>(batch));
    backward_kernel<T, P><<<blocks, dim3(32, kColumnSplit), 0, c10::cuda::getCurrentCUDAStream()>>>(
        grad.const_data_ptr<T>(), gate.const_data_ptr<P>(), y.const_data_ptr<P>(),
        mask[0] ? grad_gate.mutable_data_ptr<P>() : nullptr, mask[1] ? grad_y.mutable_data_ptr<P>() : nullptr, tokens,
        channels, gate.stride(0), gate.stride(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {grad_gate, grad_y};
}

}  // namespace runner::kernels
