// Tests of the keyed training draws: Philox4x32-10 in tensor ops and the timesteps, noise and label drops made of it.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/core/sample_rng.h"
#include "runtime/diffusion/philox.h"
#include "runtime/diffusion/sample_streams.h"
#include "tests/cpp/cuda_skip.h"

using namespace runner::diffusion;

namespace {

// Philox4x32-10 as Random123 writes it, on plain 32-bit words.
std::array<std::uint32_t, 4> reference_philox(std::array<std::uint32_t, 4> c, std::uint64_t key) {
  auto k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * c[0], p1 = std::uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<std::uint32_t>(p0)};
  }
  return c;
}

std::array<std::uint32_t, 4> tensor_philox(const std::array<std::uint32_t, 4>& c, std::uint64_t key) {
  std::array<at::Tensor, 4> counter;
  for (int i = 0; i < 4; ++i) counter[i] = at::tensor({static_cast<std::int64_t>(c[i])}, at::kLong);
  const auto words = philox4x32_10(counter, key);
  std::array<std::uint32_t, 4> out{};
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint32_t>(words[i].item<std::int64_t>());
  return out;
}

// The draws written out for one sample: its stream's key, the Philox words of an element block, the
// transforms the header describes.
constexpr std::uint64_t kTimestep = 0x74696d6573746570ull, kNoise = 0x6e6f697365657073ull,
                        kLabelDrop = 0x6c6162656c647270ull;

std::array<std::uint32_t, 4> reference_words(std::uint64_t seed, std::uint64_t stream, std::int64_t key,
                                             std::uint32_t block) {
  const auto k = static_cast<std::uint64_t>(key);
  using runner::core::splitmix64;
  return reference_philox({block, 0, static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k >> 32)},
                          splitmix64(splitmix64(seed) ^ stream));
}

double reference_uniform53(std::uint32_t high, std::uint32_t low) {
  return static_cast<double>((std::uint64_t{high >> 5} << 26) + (low >> 6)) * 0x1.0p-53;
}

std::int64_t reference_timestep(std::uint64_t seed, std::int64_t key, std::int64_t T,
                                const TimestepSampling& sampling) {
  const auto w = reference_words(seed, kTimestep, key, 0);
  double u = reference_uniform53(w[0], w[1]);
  if (sampling.kind == TimestepSampling::Kind::logit_normal) {
    const double normal = std::sqrt(-2 * std::log(1 - u)) * std::cos(reference_uniform53(w[2], w[3]) * (2 * M_PI));
    u = 1 / (1 + std::exp(-(sampling.logit_mean + sampling.logit_std * normal)));
  }
  return std::min(static_cast<std::int64_t>(std::floor(u * static_cast<double>(T))), T - 1);
}

double reference_noise(std::uint64_t seed, std::int64_t key, std::int64_t element) {
  const auto w = reference_words(seed, kNoise, key, static_cast<std::uint32_t>(element / 4));
  const int pair = static_cast<int>(element % 4) / 2;
  const double radius = std::sqrt(-2 * std::log((static_cast<double>(w[2 * pair]) + 1) * 0x1.0p-32));
  const double angle = static_cast<double>(w[2 * pair + 1]) * (2 * M_PI * 0x1.0p-32);
  return element % 2 == 0 ? radius * std::cos(angle) : radius * std::sin(angle);
}

}  // namespace

TEST_CASE("Philox4x32-10 in tensor ops gives Random123's known answers and the reference words", "[diffusion]") {
  // Random123's tests/kat_vectors for philox4x32 with 10 rounds (key words low, high).
  CHECK(tensor_philox({0, 0, 0, 0}, 0) == std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(tensor_philox({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffffffffffffull) ==
        std::array<std::uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(tensor_philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0x299f31d0a4093822ull) ==
        std::array<std::uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});

  // A batch of counters, broadcast from a row and a column, equals the scalar rounds word for word.
  const at::Tensor rows =
      at::tensor(std::vector<std::int64_t>{0, 1, 0x7fffffff, 0xfffffffe}, at::kLong).reshape({4, 1});
  const at::Tensor columns =
      at::tensor(std::vector<std::int64_t>{5, 0x80000000, 0xffffffff}, at::kLong).reshape({1, 3});
  const std::uint64_t key = 0xfedcba9876543210ull;
  const auto words = philox4x32_10({rows, columns, columns, rows}, key);
  for (std::int64_t i = 0; i < 4; ++i) {
    for (std::int64_t j = 0; j < 3; ++j) {
      const auto r = static_cast<std::uint32_t>(rows[i][0].item<std::int64_t>());
      const auto c = static_cast<std::uint32_t>(columns[0][j].item<std::int64_t>());
      const auto expected = reference_philox({r, c, c, r}, key);
      for (int w = 0; w < 4; ++w) CHECK(words[w][i][j].item<std::int64_t>() == static_cast<std::int64_t>(expected[w]));
    }
  }
}

TEST_CASE("sample streams draw the written-out Philox transforms", "[diffusion]") {
  const std::uint64_t seed = 20261126;
  const SampleStreams streams(seed);
  SampleStreams running(seed);
  at::Tensor keys = at::cat({SampleStreams::loader_keys(3, at::arange(200, at::kLong)), running.next_keys(56)});
  const auto* key = keys.data_ptr<std::int64_t>();
  const TimestepSampling logit{.kind = TimestepSampling::Kind::logit_normal, .logit_mean = -0.5, .logit_std = 1.2};
  for (const std::int64_t T : {1000, 7, 1}) {
    const at::Tensor uniform = streams.timesteps(keys, T, at::kCPU);
    const at::Tensor logit_normal = streams.timesteps(keys, T, at::kCPU, logit);
    for (std::int64_t i = 0; i < keys.size(0); ++i) {
      CHECK(uniform[i].item<std::int64_t>() == reference_timestep(seed, key[i], T, {}));
      CHECK(logit_normal[i].item<std::int64_t>() == reference_timestep(seed, key[i], T, logit));
    }
  }
  const at::Tensor drop = streams.label_drop(keys, 0.25, at::kCPU);
  for (std::int64_t i = 0; i < keys.size(0); ++i) {
    const auto w = reference_words(seed, kLabelDrop, key[i], 0);
    CHECK(drop[i].item<bool>() == (reference_uniform53(w[0], w[1]) < 0.25));
  }
  // 7 elements per sample: two blocks, the second one's last word unused.
  const at::Tensor noise = streams.noise(keys, {7}, at::TensorOptions().dtype(at::kDouble));
  double worst = 0;
  for (std::int64_t i = 0; i < keys.size(0); ++i)
    for (std::int64_t j = 0; j < 7; ++j)
      worst = std::max(worst, std::abs(noise[i][j].item<double>() - reference_noise(seed, key[i], j)));
  CHECK(worst < 1e-12);  // log, cos and sin of float64 may differ from the C library in the last bit
  CHECK(at::equal(streams.noise(keys, {7}, at::TensorOptions().dtype(at::kFloat)), noise.to(at::kFloat)));
  // Element j of a sample does not depend on the sample's shape.
  CHECK(at::equal(streams.noise(keys, {2, 3, 2}, at::TensorOptions().dtype(at::kDouble)).flatten(1).narrow(1, 0, 7),
                  noise));
}

TEST_CASE("sample stream noise is standard normal", "[diffusion]") {
  const SampleStreams streams(99);
  const at::Tensor noise = streams.noise(SampleStreams::loader_keys(0, at::arange(500, at::kLong)), {400},
                                         at::TensorOptions().dtype(at::kDouble));
  const double n = static_cast<double>(noise.numel());
  // 200000 values: the mean's standard error is 0.0022, the variance's 0.0032.
  CHECK(std::abs(noise.mean().item<double>()) < 0.011);
  CHECK(std::abs(noise.var().item<double>() - 1) < 0.016);
  const double tails = noise.abs().gt(3).to(at::kDouble).sum().item<double>() / n;
  CHECK(tails > 0.0022);  // 0.0027 expected
  CHECK(tails < 0.0032);
  // Neighbouring elements (the two of a Box-Muller pair, and the pairs of a block) are uncorrelated.
  const at::Tensor pairs = noise.reshape({-1, 4});
  for (const auto& [a, b] : {std::pair{0, 1}, std::pair{1, 2}, std::pair{0, 2}}) {
    CHECK(std::abs((pairs.select(1, a) * pairs.select(1, b)).mean().item<double>()) < 0.02);
  }
}

TEST_CASE("sample streams: a sample's draws do not depend on how its batch is split", "[diffusion]") {
  const SampleStreams streams(1234);
  const at::Tensor keys = SampleStreams::loader_keys(3, at::arange(16, at::kLong));
  const at::Tensor front = keys.narrow(0, 0, 5), back = keys.narrow(0, 5, 11);
  const auto float32 = at::TensorOptions().dtype(at::kFloat);

  const at::Tensor noise = streams.noise(keys, {3, 4, 4}, float32);
  CHECK(noise.sizes() == at::IntArrayRef({16, 3, 4, 4}));
  CHECK(at::equal(noise, at::cat({streams.noise(front, {3, 4, 4}, float32), streams.noise(back, {3, 4, 4}, float32)})));
  CHECK(at::equal(streams.noise(keys.flip(0), {3, 4, 4}, float32), noise.flip(0)));
  const at::Tensor steps = streams.timesteps(keys, 1000, at::kCPU);
  CHECK(steps.scalar_type() == at::kLong);
  CHECK(at::equal(steps, at::cat({streams.timesteps(front, 1000, at::kCPU), streams.timesteps(back, 1000, at::kCPU)})));
  const at::Tensor drop = streams.label_drop(keys, 0.5, at::kCPU);
  CHECK(drop.scalar_type() == at::kBool);
  CHECK(at::equal(drop, at::cat({streams.label_drop(front, 0.5, at::kCPU), streams.label_drop(back, 0.5, at::kCPU)})));

  // The global generator is untouched.
  at::manual_seed(9);
  const at::Tensor before = at::randn({4});
  at::manual_seed(9);
  streams.noise(keys, {2}, float32);
  CHECK(at::equal(at::randn({4}), before));

  const at::Tensor doubles = streams.noise(keys, {5}, at::TensorOptions().dtype(at::kDouble));
  CHECK(doubles.scalar_type() == at::kDouble);
}

TEST_CASE("sample streams on CUDA draw what the CPU draws, from keys on either device", "[diffusion][cuda]") {
  SKIP_WITHOUT_CUDA("sample streams on a CUDA device");
  const SampleStreams streams(1234);
  const at::Tensor keys = SampleStreams::loader_keys(3, at::arange(16, at::kLong));
  const at::Tensor front = keys.narrow(0, 0, 5), back = keys.narrow(0, 5, 11);
  const auto cuda = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  const at::Tensor on_gpu = streams.noise(keys, {3, 4, 4}, cuda);
  CHECK(on_gpu.is_cuda());
  CHECK(at::equal(on_gpu, at::cat({streams.noise(front, {3, 4, 4}, cuda), streams.noise(back, {3, 4, 4}, cuda)})));
  CHECK(at::equal(streams.noise(keys.to(at::kCUDA), {3, 4, 4}, cuda), on_gpu));
  const at::Tensor on_cpu = streams.noise(keys, {3, 4, 4}, at::TensorOptions().dtype(at::kDouble));
  CHECK(at::allclose(streams.noise(keys, {3, 4, 4}, cuda.dtype(at::kDouble)).cpu(), on_cpu, 1e-12, 1e-12));
  CHECK(at::equal(on_gpu.cpu(), on_cpu.to(at::kFloat)));
  CHECK(at::equal(streams.timesteps(keys, 1000, at::kCUDA).cpu(), streams.timesteps(keys, 1000, at::kCPU)));
  const TimestepSampling logit{.kind = TimestepSampling::Kind::logit_normal, .logit_mean = 0.5, .logit_std = 1.5};
  CHECK(
      at::equal(streams.timesteps(keys, 1000, at::kCUDA, logit).cpu(), streams.timesteps(keys, 1000, at::kCPU, logit)));
  CHECK(
      at::equal(streams.label_drop(keys.to(at::kCUDA), 0.3, at::kCUDA).cpu(), streams.label_drop(keys, 0.3, at::kCPU)));
}

TEST_CASE("sample streams differ across seeds, streams and keys", "[diffusion]") {
  const SampleStreams one(1), two(2);
  const at::Tensor keys = SampleStreams::loader_keys(0, at::arange(1000, at::kLong));
  const auto float32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor noise = one.noise(keys, {8}, float32);
  CHECK_FALSE(at::equal(noise, two.noise(keys, {8}, float32)));
  CHECK_FALSE(at::equal(noise[0], noise[1]));
  const at::Tensor steps = one.timesteps(keys, 1000, at::kCPU);
  CHECK((steps == two.timesteps(keys, 1000, at::kCPU)).sum().item<std::int64_t>() < 10);
  CHECK_FALSE(at::equal(one.label_drop(keys, 0.5, at::kCPU), two.label_drop(keys, 0.5, at::kCPU)));
  // Were the timestep and label-drop streams the same, timestep 0 of 2 would coincide with keeping the label.
  const double agreement = (one.timesteps(keys, 2, at::kCPU).eq(0) == one.label_drop(keys, 0.5, at::kCPU).logical_not())
                               .to(at::kDouble)
                               .mean()
                               .item<double>();
  CHECK(agreement > 0.4);
  CHECK(agreement < 0.6);
  // The same dataset index in another epoch draws afresh.
  CHECK_FALSE(at::equal(one.noise(SampleStreams::loader_keys(1, at::arange(4, at::kLong)), {8}, float32),
                        noise.narrow(0, 0, 4)));
}

TEST_CASE("sample stream timesteps are uniform and label drop has its rate", "[diffusion]") {
  const SampleStreams streams(77);
  const at::Tensor keys = SampleStreams::loader_keys(0, at::arange(20000, at::kLong));
  const at::Tensor steps = streams.timesteps(keys, 10, at::kCPU);
  CHECK(steps.min().item<std::int64_t>() == 0);
  CHECK(steps.max().item<std::int64_t>() == 9);
  const at::Tensor counts = at::bincount(steps, {}, 10).to(at::kDouble);
  const double chi_square = ((counts - 2000).pow(2) / 2000).sum().item<double>();
  CHECK(chi_square < 40);  // 9 degrees of freedom: P(chi^2 > 40) < 1e-5

  const double rate = streams.label_drop(keys, 0.1, at::kCPU).to(at::kDouble).mean().item<double>();
  CHECK(rate > 0.09);
  CHECK(rate < 0.11);
  CHECK_FALSE(streams.label_drop(keys, 0, at::kCPU).any().item<bool>());
  CHECK(streams.label_drop(keys, 1, at::kCPU).all().item<bool>());
}

TEST_CASE("sample keys: counter keys never equal loader keys, loader keys combine epoch and index", "[diffusion]") {
  SampleStreams streams(5);
  const std::int64_t top = std::numeric_limits<std::int64_t>::min();
  CHECK(at::equal(streams.next_keys(3), at::tensor({top, top | 1, top | 2}, at::kLong)));
  CHECK(at::equal(streams.next_keys(2), at::tensor({top | 3, top | 4}, at::kLong)));
  CHECK(streams.counter() == 5);
  CHECK(streams.next_keys(0).numel() == 0);
  streams.set_counter(100);
  CHECK(streams.next_keys(1)[0].item<std::int64_t>() == (top | 100));
  CHECK(at::equal(SampleStreams::loader_keys(2, at::tensor({0, 5}, at::kLong)),
                  at::tensor({std::int64_t{2} << 40, (std::int64_t{2} << 40) + 5}, at::kLong)));

  REQUIRE_THROWS_WITH(SampleStreams::loader_keys(0, at::tensor({-1}, at::kLong)),
                      "dataset index must be in [0, 2^40), got -1");
  REQUIRE_THROWS_WITH(SampleStreams::loader_keys(-1, at::tensor({0}, at::kLong)),
                      "epoch must be in [0, 8388608), got -1");
  REQUIRE_THROWS_WITH(streams.timesteps(at::tensor({1.0f, 2.0f}), 10, at::kCPU),
                      "sample keys must be an int64 tensor of shape [B], got float32 [2] on cpu");
  REQUIRE_THROWS_WITH(streams.label_drop(at::tensor({1}, at::kLong), 1.5, at::kCPU),
                      "label drop probability must be in [0, 1], got 1.5");
  REQUIRE_THROWS_WITH(streams.noise(at::tensor({1}, at::kLong), {2}, at::TensorOptions().dtype(at::kLong)),
                      "noise dtype must be floating point, got int64");
}
