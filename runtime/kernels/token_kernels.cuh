// Internal to runtime/kernels' CUDA sources: what the token ops' kernels share (arithmetic rounded as ATen's
// elementwise kernels round it, 16-byte packs, the dispatch over the dtypes of kernel_dtypes.h).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace runner::kernels {

// Half-precision values compute in float, as ATen's elementwise kernels do.
template <typename T>
struct Compute {
  using type = float;
};
template <>
struct Compute<double> {
  using type = double;
};
template <typename T>
using compute_t = typename Compute<T>::type;

// Explicit rounding: nvcc would otherwise contract a product and a sum into one fma, which the ATen ops do not.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }

// 1 + scale rounded to the parameters' dtype, as ATen computes `1 + scale`.
template <typename P>
__device__ __forceinline__ P one_plus(P scale) {
  return static_cast<P>(add_rn(static_cast<compute_t<P>>(scale), compute_t<P>(1)));
}

// Rounded as ATen's `x * (1 + scale) + shift` rounds it: 1 + scale to the parameters' dtype, the product and
// the sum to x's dtype (the result dtype of every supported combination).
template <typename T, typename P>
__device__ __forceinline__ T modulate_element(T x, P shift, P scale) {
  using TC = compute_t<T>;
  const T product = static_cast<T>(mul_rn(static_cast<TC>(x), static_cast<TC>(one_plus(scale))));
  return static_cast<T>(add_rn(static_cast<TC>(product), static_cast<TC>(shift)));
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T value[N];
};

// Whether every pointer is 16-byte aligned and `channels` a whole number of 16-byte packs of T.
template <typename T>
inline bool packs_fit(std::int64_t channels, std::initializer_list<const void*> pointers) {
  if (channels % (16 / sizeof(T)) != 0) return false;
  for (const void* pointer : pointers) {
    if (reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0) return false;
  }
  return true;
}

// The sum of every thread's value in a one-dimensional block whose size is a multiple of 32, in a fixed order
// (deterministic); every thread gets it. `shared` holds 32 values; the block synchronises.
template <typename C>
__device__ C block_sum(C value, C* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // an earlier call's readers are done with `shared`
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : C(0);
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Threads of a block that walks one row of `channels` values: a multiple of 32, at most `most`.
inline unsigned row_threads(std::int64_t channels, std::int64_t most) {
  const std::int64_t warps = (channels + 31) / 32;
  return static_cast<unsigned>(std::min(most, warps * 32));
}

// The column kernels' blocks: 32 channels by kColumnSplit token subsets, summed in shared memory.
constexpr int kColumnSplit = 8;

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls body(TypeTag<T>{}, TypeTag<P>{}) with the C++ types of tokens T and parameters P, for the combinations
// cuda_kernel_supports accepts.
template <typename Body>
void dispatch_token_dtypes(c10::ScalarType tokens, c10::ScalarType parameters, Body&& body) {
  switch (tokens) {
    case c10::kFloat:
      if (parameters == c10::kFloat) return body(TypeTag<float>{}, TypeTag<float>{});
      if (parameters == c10::kBFloat16) return body(TypeTag<float>{}, TypeTag<c10::BFloat16>{});
      if (parameters == c10::kHalf) return body(TypeTag<float>{}, TypeTag<c10::Half>{});
      break;
    case c10::kBFloat16:
      return body(TypeTag<c10::BFloat16>{}, TypeTag<c10::BFloat16>{});
    case c10::kHalf:
      return body(TypeTag<c10::Half>{}, TypeTag<c10::Half>{});
    case c10::kDouble:
      return body(TypeTag<double>{}, TypeTag<double>{});
    default:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "no CUDA kernel for tokens of ", tokens, " with parameters of ", parameters);
}

}  // namespace runner::kernels
