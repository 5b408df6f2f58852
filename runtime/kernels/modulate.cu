// The CUDA kernel of runner::modulate: one pass over x, each element rounded as the ATen ops round it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "runtime/kernels/modulate_cuda.h"

namespace runner::kernels {
namespace {

// Half-precision values compute in float, as ATen's elementwise kernels do.
template <typename T>
struct Compute {
  using type = float;
};
template <>
struct Compute<double> {
  using type = double;
};

// Explicit rounding: nvcc would otherwise contract a product and a sum into one fma, which the ATen ops do not.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// Rounded as ATen's `x * (1 + scale) + shift` rounds it: 1 + scale to the parameters' dtype, the product and
// the sum to x's dtype (the result dtype of every supported combination).
template <typename T, typename P>
__device__ __forceinline__ T modulate_element(T x, P shift, P scale) {
  using PC = typename Compute<P>::type;
  using TC = typename Compute<T>::type;
  const P one_plus_scale = static_cast<P>(add_rn(static_cast<PC>(scale), PC(1)));
  const T product = static_cast<T>(mul_rn(static_cast<TC>(x), static_cast<TC>(one_plus_scale)));
  return static_cast<T>(add_rn(static_cast<TC>(product), static_cast<TC>(shift)));
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T value[N];
};

// One row of x (one token) per block iteration; each thread takes packs of kPack channels (16-byte loads and
// stores when the row allows). shift and scale are read through their strides, small and cached.
template <typename T, typename P, int kPack>
__global__ void modulate_kernel(const T* __restrict__ x, const P* __restrict__ shift, const P* __restrict__ scale,
                                T* __restrict__ out, std::int64_t rows, std::int64_t tokens, std::int64_t channels,
                                std::int64_t shift_batch_stride, std::int64_t shift_channel_stride,
                                std::int64_t scale_batch_stride, std::int64_t scale_channel_stride) {
  const std::int64_t packs = channels / kPack;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t sample = row / tokens;
    const auto* x_row = reinterpret_cast<const Pack<T, kPack>*>(x + row * channels);
    auto* out_row = reinterpret_cast<Pack<T, kPack>*>(out + row * channels);
    const P* shift_row = shift + sample * shift_batch_stride;
    const P* scale_row = scale + sample * scale_batch_stride;
    for (std::int64_t pack = threadIdx.x; pack < packs; pack += blockDim.x) {
      const Pack<T, kPack> in = x_row[pack];
      Pack<T, kPack> result;
#pragma unroll
      for (int i = 0; i < kPack; ++i) {
        const std::int64_t channel = pack * kPack + i;
        result.value[i] = modulate_element(in.value[i], shift_row[channel * shift_channel_stride],
                                           scale_row[channel * scale_channel_stride]);
      }
      out_row[pack] = result;
    }
  }
}

template <typename T, typename P, int kPack>
void launch(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, at::Tensor& out) {
  constexpr std::int64_t kMaxThreads = 256;
  constexpr std::int64_t kMaxBlocks = 1 << 20;
  const std::int64_t rows = x.size(0) * x.size(1), channels = x.size(2);
  const std::int64_t packs = channels / kPack;
  const auto threads = static_cast<unsigned>(std::min(kMaxThreads, (packs + 31) / 32 * 32));
  const auto blocks = static_cast<unsigned>(std::min(kMaxBlocks, rows));
  modulate_kernel<T, P, kPack><<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.const_data_ptr<T>(), shift.const_data_ptr<P>(), scale.const_data_ptr<P>(), out.mutable_data_ptr<T>(), rows,
      x.size(1), channels, shift.stride(0), shift.stride(1), scale.stride(0), scale.stride(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename P>
void launch_packed_if_aligned(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, at::Tensor& out) {
  constexpr int kWide = 16 / sizeof(T);
  const bool aligned = x.size(2) % kWide == 0 && reinterpret_cast<std::uintptr_t>(x.const_data_ptr()) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(out.const_data_ptr()) % 16 == 0;
  if (aligned) {
    launch<T, P, kWide>(x, shift, scale, out);
  } else {
    launch<T, P, 1>(x, shift, scale, out);
  }
}

}  // namespace

bool modulate_cuda_supports(at::ScalarType x, at::ScalarType shift, at::ScalarType scale) {
  if (shift != scale) return false;
  if (x == at::kFloat) return scale == at::kFloat || scale == at::kBFloat16 || scale == at::kHalf;
  return x == scale && (x == at::kBFloat16 || x == at::kHalf || x == at::kDouble);
}

at::Tensor modulate_cuda(const at::Tensor& x_any_layout, const at::Tensor& shift, const at::Tensor& scale) {
  const c10::cuda::CUDAGuard device(x_any_layout.device());
  const at::Tensor x = x_any_layout.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (out.numel() == 0) return out;
  const auto params = scale.scalar_type();
  switch (x.scalar_type()) {
    case at::kFloat:
      if (params == at::kFloat) {
        launch_packed_if_aligned<float, float>(x, shift, scale, out);
      } else if (params == at::kBFloat16) {
        launch_packed_if_aligned<float, c10::BFloat16>(x, shift, scale, out);
      } else {
        launch_packed_if_aligned<float, c10::Half>(x, shift, scale, out);
      }
      break;
    case at::kBFloat16:
      launch_packed_if_aligned<c10::BFloat16, c10::BFloat16>(x, shift, scale, out);
      break;
    case at::kHalf:
      launch_packed_if_aligned<c10::Half, c10::Half>(x, shift, scale, out);
      break;
    case at::kDouble:
      launch_packed_if_aligned<double, double>(x, shift, scale, out);
      break;
    default:
      TORCH_INTERNAL_ASSERT(false, "modulate_cuda: unsupported dtypes ", x.scalar_type(), " and ", params);
  }
  return out;
}

}  // namespace runner::kernels
