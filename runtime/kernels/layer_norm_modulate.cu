// The CUDA kernels of runner::layer_norm_modulate: the forward in one pass per token, the backward in a pass per
// token (x's gradient) and a pass per sample and channel (shift's and scale's).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "runtime/kernels/layer_norm_modulate_cuda.h"
#include "runtime/kernels/token_kernels.cuh"

namespace runner::kernels {
namespace {

constexpr std::int64_t kRowThreads = 256;
constexpr std::int64_t kMaxBlocks = 1 << 20;

__device__ __forceinline__ float reciprocal_sqrt(float value) { return rsqrtf(value); }
__device__ __forceinline__ double reciprocal_sqrt(double value) { return 1.0 / sqrt(value); }

// (x - mean) * rstd rounded to x's dtype: the layer norm's output as the ATen graph holds it.
template <typename T, typename C>
__device__ __forceinline__ T normalized(T x, C mean, C rstd) {
  return static_cast<T>(mul_rn(sub_rn(static_cast<C>(x), mean), rstd));
}

struct PerSample {
  std::int64_t batch_stride, channel_stride;
};

template <typename T, typename P>
__global__ void forward_kernel(const T* __restrict__ x, const P* __restrict__ shift, const P* __restrict__ scale,
                               T* __restrict__ out, compute_t<T>* __restrict__ mean_out,
                               compute_t<T>* __restrict__ rstd_out, std::int64_t rows, std::int64_t tokens,
                               std::int64_t channels, PerSample shift_strides, PerSample scale_strides,
                               compute_t<T> eps) {
  using C = compute_t<T>;
  __shared__ C shared[32];
  const C count = static_cast<C>(channels);
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * channels;
    C sum = 0;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) sum += static_cast<C>(x_row[c]);
    const C mean = block_sum(sum, shared) / count;
    C squares = 0;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const C centred = static_cast<C>(x_row[c]) - mean;
      squares += centred * centred;
    }
    const C rstd = reciprocal_sqrt(block_sum(squares, shared) / count + eps);
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    const std::int64_t sample = row / tokens;
    const P* shift_row = shift + sample * shift_strides.batch_stride;
    const P* scale_row = scale + sample * scale_strides.batch_stride;
    T* out_row = out + row * channels;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      out_row[c] = modulate_element(normalized(x_row[c], mean, rstd), shift_row[c * shift_strides.channel_stride],
                                    scale_row[c * scale_strides.channel_stride]);
    }
  }
}

// The gradient reaching the normalized x: grad * (1 + scale), rounded to x's dtype as the ATen graph rounds it.
template <typename T, typename P>
__device__ __forceinline__ compute_t<T> normalized_gradient(T grad, P scale) {
  using C = compute_t<T>;
  return static_cast<C>(static_cast<T>(mul_rn(static_cast<C>(grad), static_cast<C>(one_plus(scale)))));
}

// x's gradient, as PyTorch's layer_norm backward: rstd * (g - mean(g) - xhat * mean(g * xhat)) per token.
template <typename T, typename P>
__global__ void input_gradient_kernel(const T* __restrict__ grad, const T* __restrict__ x,
                                      const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                                      const P* __restrict__ scale, T* __restrict__ grad_x, std::int64_t rows,
                                      std::int64_t tokens, std::int64_t channels, PerSample scale_strides) {
  using C = compute_t<T>;
  __shared__ C shared[32];
  const C count = static_cast<C>(channels);
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* grad_row = grad + row * channels;
    const T* x_row = x + row * channels;
    const P* scale_row = scale + (row / tokens) * scale_strides.batch_stride;
    const C row_mean = mean[row], row_rstd = rstd[row];
    C sum = 0, sum_with_xhat = 0;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const C g = normalized_gradient(grad_row[c], scale_row[c * scale_strides.channel_stride]);
      sum += g;
      sum_with_xhat += g * ((static_cast<C>(x_row[c]) - row_mean) * row_rstd);
    }
    const C mean_g = block_sum(sum, shared) / count;
    const C mean_g_xhat = block_sum(sum_with_xhat, shared) / count;
    T* out_row = grad_x + row * channels;
    for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const C g = normalized_gradient(grad_row[c], scale_row[c * scale_strides.channel_stride]);
      const C xhat = (static_cast<C>(x_row[c]) - row_mean) * row_rstd;
      out_row[c] = static_cast<T>(row_rstd * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

// shift's gradient (grad summed over the tokens) and scale's (grad * normalized x, each product rounded to x's
// dtype as the ATen graph rounds it, summed over the tokens), for 32 channels of one sample per block.
template <typename T, typename P>
__global__ void parameter_gradient_kernel(const T* __restrict__ grad, const T* __restrict__ x,
                                          const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                                          P* __restrict__ grad_shift, P* __restrict__ grad_scale, std::int64_t tokens,
                                          std::int64_t channels) {
  using C = compute_t<T>;
  __shared__ C shift_sums[kColumnSplit][33];
  __shared__ C scale_sums[kColumnSplit][33];
  const std::int64_t sample = blockIdx.y;
  const std::int64_t channel = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  C shift_sum = 0, scale_sum = 0;
  if (channel < channels) {
    for (std::int64_t token = threadIdx.y; token < tokens; token += kColumnSplit) {
      const std::int64_t row = sample * tokens + token;
      const std::int64_t at = row * channels + channel;
      const T g = grad[at];
      shift_sum += static_cast<C>(g);
      const T product =
          static_cast<T>(mul_rn(static_cast<C>(g), static_cast<C>(normalized(x[at], mean[row], rstd[row]))));
      scale_sum += static_cast<C>(product);
    }
  }
  shift_sums[threadIdx.y][threadIdx.x] = shift_sum;
  scale_sums[threadIdx.y][threadIdx.x] = scale_sum;
  __syncthreads();
  if (threadIdx.y == 0 && channel < channels) {
    for (int part = 1; part < kColumnSplit; ++part) {
      shift_sum += shift_sums[part][threadIdx.x];
      scale_sum += scale_sums[part][threadIdx.x];
    }
    if (grad_shift != nullptr) grad_shift[sample * channels + channel] = static_cast<P>(shift_sum);
    if (grad_scale != nullptr) grad_scale[sample * channels + channel] = static_cast<P>(scale_sum);
  }
}

PerSample strides_of(const at::Tensor& per_sample) { return {per_sample.stride(0), per_sample.stride(1)}; }

at::ScalarType statistics_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_modulate_cuda(const at::Tensor& x_any_layout,
                                                                        const at::Tensor& shift,
                                                                        const at::Tensor& scale, double eps) {
  const c10::cuda::CUDAGuard device(x_any_layout.device());
  const at::Tensor x = x_any_layout.contiguous();
  const auto batch = x.size(0), tokens = x.size(1), channels = x.size(2);
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::Tensor mean = at::empty({batch, tokens, 1}, x.options().dtype(statistics_dtype(x)));
  at::Tensor rstd = at::empty({batch, tokens, 1}, x.options().dtype(statistics_dtype(x)));
  const std::int64_t rows = batch * tokens;
  if (rows == 0 || channels == 0) return {out, mean, rstd};
  dispatch_token_dtypes(x.scalar_type(), scale.scalar_type(), [&](auto tokens_type, auto parameters_type) {
    using T = typename decltype(tokens_type)::type;
    using P = typename decltype(parameters_type)::type;
    using C = compute_t<T>;
    forward_kernel<T, P><<<static_cast<unsigned>(std::min(kMaxBlocks, rows)), row_threads(channels, kRowThreads), 0,
                           c10::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<T>(), shift.const_data_ptr<P>(), scale.const_data_ptr<P>(), out.mutable_data_ptr<T>(),
        mean.mutable_data_ptr<C>(), rstd.mutable_data_ptr<C>(), rows, tokens, channels, strides_of(shift),
        strides_of(scale), static_cast<C>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_modulate_backward_cuda(
    const at::Tensor& grad_any_layout, const at::Tensor& x_any_layout, const at::Tensor& mean_any_layout,
    const at::Tensor& rstd_any_layout, const at::Tensor& scale, std::array<bool, 3> mask) {
  const c10::cuda::CUDAGuard device(x_any_layout.device());
  const at::Tensor grad = grad_any_layout.contiguous(), x = x_any_layout.contiguous();
  const at::Tensor mean = mean_any_layout.contiguous(), rstd = rstd_any_layout.contiguous();
  const auto batch = x.size(0), tokens = x.size(1), channels = x.size(2);
  const std::int64_t rows = batch * tokens;
  at::Tensor grad_x, grad_shift, grad_scale;
  if (mask[0]) grad_x = at::empty(x.sizes(), x.options());
  if (mask[1]) grad_shift = at::empty({batch, channels}, scale.options());
  if (mask[2]) grad_scale = at::empty({batch, channels}, scale.options());
  const bool parameters = mask[1] || mask[2];
  if (rows == 0 || channels == 0) {
    if (parameters) {
      if (mask[1]) grad_shift.zero_();
      if (mask[2]) grad_scale.zero_();
    }
    return {grad_x, grad_shift, grad_scale};
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_token_dtypes(x.scalar_type(), scale.scalar_type(), [&](auto tokens_type, auto parameters_type) {
    using T = typename decltype(tokens_type)::type;
    using P = typename decltype(parameters_type)::type;
    using C = compute_t<T>;
    if (mask[0]) {
      input_gradient_kernel<T, P>
          <<<static_cast<unsigned>(std::min(kMaxBlocks, rows)), row_threads(channels, kRowThreads), 0, stream>>>(
              grad.const_data_ptr<T>(), x.const_data_ptr<T>(), mean.const_data_ptr<C>(), rstd.const_data_ptr<C>(),
              scale.const_data_ptr<P>(), grad_x.mutable_data_ptr<T>(), rows, tokens, channels, strides_of(scale));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (parameters) {
      TORCH_CHECK(batch <= 65535, "layer_norm_modulate: the CUDA backward takes at most 65535 samples, got ", batch);
      const dim3 blocks(static_cast<unsigned>((channels + 31) / 32), static_cast<unsigned>(batch));
      parameter_gradient_kernel<T, P><<<blocks, dim3(32, kColumnSplit), 0, stream>>>(
          grad.const_data_ptr<T>(), x.const_data_ptr<T>(), mean.const_data_ptr<C>(), rstd.const_data_ptr<C>(),
          mask[1] ? grad_shift.mutable_data_ptr<P>() : nullptr, mask[2] ? grad_scale.mutable_data_ptr<P>() : nullptr,
          tokens, channels);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return {grad_x, grad_shift, grad_scale};
}

}  // namespace runner::kernels
