// Philox4x32-10 rounds as int64 tensor arithmetic.
#include "runtime/diffusion/philox.h"

#include <ATen/ATen.h>

namespace runner::diffusion {
namespace {

constexpr std::int64_t kLow32 = 0xFFFFFFFFll;
constexpr std::int64_t kMultiplier0 = 0xD2511F53ll;
constexpr std::int64_t kMultiplier1 = 0xCD9E8D57ll;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;

}  // namespace

std::array<at::Tensor, 4> philox4x32_10(const std::array<at::Tensor, 4>& counter, std::uint64_t key) {
  std::array<at::Tensor, 4> c = counter;
  std::uint32_t key0 = static_cast<std::uint32_t>(key);
  std::uint32_t key1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    // A product of two 32-bit values is below 2^64: int64 multiplication wraps to exactly its bits, and an
    // arithmetic shift then a mask give its high word.
    const at::Tensor product0 = c[0] * kMultiplier0;
    const at::Tensor product1 = c[2] * kMultiplier1;
    at::Tensor next0 = at::bitwise_right_shift(product1, 32).bitwise_and_(kLow32);
    next0 = at::bitwise_xor(next0, c[1]).bitwise_xor_(static_cast<std::int64_t>(key0));
    at::Tensor next2 = at::bitwise_right_shift(product0, 32).bitwise_and_(kLow32);
    next2 = at::bitwise_xor(next2, c[3]).bitwise_xor_(static_cast<std::int64_t>(key1));
    c = {std::move(next0), product1.bitwise_and(kLow32), std::move(next2), product0.bitwise_and(kLow32)};
  }
  return c;
}

at::Tensor uniform53(const at::Tensor& high, const at::Tensor& low) {
  const at::Tensor bits =
      at::bitwise_right_shift(high, 5).mul_(std::int64_t{1} << 26).add_(at::bitwise_right_shift(low, 6));
  return bits.to(at::kDouble).mul_(0x1.0p-53);
}

}  // namespace runner::diffusion
