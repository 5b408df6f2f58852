// Keyed per-sample random streams: Philox words of (seed, stream, key, element) turned into timesteps, noise and drops.
#include "runtime/diffusion/sample_streams.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/enum_table.h"
#include "runtime/core/sample_rng.h"
#include "runtime/diffusion/philox.h"

namespace runner::diffusion {
namespace {

constexpr std::uint64_t kTimestepStream = 0x74696d6573746570ull;   // "timestep"
constexpr std::uint64_t kNoiseStream = 0x6e6f697365657073ull;      // "noiseeps"
constexpr std::uint64_t kLabelDropStream = 0x6c6162656c647270ull;  // "labeldrp"
constexpr std::uint64_t kCounterKeyBit = 1ull << 63;
constexpr int kIndexBits = 40;
constexpr std::int64_t kMaxEpoch = std::int64_t{1} << (63 - kIndexBits);

constexpr std::int64_t kLow32 = 0xFFFFFFFFll;

// The keys on `device`: a CPU tensor goes to a GPU through pinned memory without blocking. Throws for
// anything but int64 [B].
at::Tensor checked_keys(const at::Tensor& keys, at::Device device) {
  if (!keys.defined() || keys.dim() != 1 || keys.scalar_type() != at::kLong) {
    std::ostringstream got;
    if (keys.defined())
      got << core::dtype_name(keys.scalar_type()) << " " << keys.sizes() << " on " << keys.device();
    else
      got << "an undefined tensor";
    throw std::invalid_argument("sample keys must be an int64 tensor of shape [B], got " + got.str());
  }
  if (keys.device() == device) return keys;
  if (keys.is_cpu() && device.is_cuda()) return keys.pin_memory().to(device, /*non_blocking=*/true);
  return keys.to(device);
}

// The Philox key of one of a seed's streams.
std::uint64_t stream_key(std::uint64_t seed, std::uint64_t stream) {
  return core::splitmix64(core::splitmix64(seed) ^ stream);
}

// The words of element blocks [0, blocks) of each key: four int64 tensors [B, blocks] of 32-bit words.
std::array<at::Tensor, 4> sample_words(std::uint64_t seed, std::uint64_t stream, const at::Tensor& keys,
                                       std::int64_t blocks) {
  const at::Tensor key = keys.reshape({-1, 1});
  const at::Tensor block = at::arange(blocks, keys.options()).reshape({1, -1});
  return philox4x32_10({block, at::zeros({}, keys.options()), key.bitwise_and(kLow32),
                        at::bitwise_right_shift(key, 32).bitwise_and_(kLow32)},
                       stream_key(seed, stream));
}

// Standard normals from two pairs of words (Box-Muller): u1 = (a + 1) 2^-32 in (0, 1], u2 = b 2^-32.
std::array<at::Tensor, 2> box_muller(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor radius = (a.to(at::kDouble) + 1).mul_(0x1.0p-32).log_().mul_(-2).sqrt_();
  const at::Tensor angle = b.to(at::kDouble).mul_(2 * M_PI * 0x1.0p-32);
  return {radius * at::cos(angle), radius * at::sin(angle)};
}

}  // namespace

const core::EnumTable<TimestepSampling::Kind, 2> kTimestepSamplings{
    {{{TimestepSampling::Kind::uniform, "uniform"}, {TimestepSampling::Kind::logit_normal, "logit_normal"}}},
    core::NameQuotes::double_,
    "{what} must be {list}, got \"{got}\""};

TimestepSampling::Kind parse_timestep_sampling(const std::string& name, std::string_view option) {
  return kTimestepSamplings.parse(name, option);
}

TimestepSampling timestep_sampling_of(TimestepSampling::Kind kind, std::optional<double> logit_mean,
                                      std::optional<double> logit_std, std::string_view option) {
  if (logit_mean && !std::isfinite(*logit_mean)) throw std::invalid_argument("logit_mean must be a finite number");
  if (logit_std && (!(*logit_std > 0) || !std::isfinite(*logit_std)))
    throw std::invalid_argument(fmt::format("logit_std must be a positive number, got {}", *logit_std));
  if ((logit_mean || logit_std) && kind != TimestepSampling::Kind::logit_normal)
    throw std::invalid_argument(fmt::format("logit_mean and logit_std shape {} = \"logit_normal\"; it is \"{}\"",
                                            option, timestep_sampling_name(kind)));
  TimestepSampling sampling;
  sampling.kind = kind;
  if (logit_mean) sampling.logit_mean = *logit_mean;
  if (logit_std) sampling.logit_std = *logit_std;
  return sampling;
}

std::string timestep_sampling_name(TimestepSampling::Kind kind) { return kTimestepSamplings.name(kind); }

SampleStreams::SampleStreams(std::uint64_t seed) : seed_(seed) {}

at::Tensor SampleStreams::timesteps(const at::Tensor& keys, std::int64_t timesteps, at::Device device,
                                    const TimestepSampling& sampling) const {
  if (timesteps < 1) throw std::invalid_argument(fmt::format("timesteps must be at least 1, got {}", timesteps));
  return unit_times(keys, device, sampling)
      .mul_(static_cast<double>(timesteps))
      .floor_()
      .to(at::kLong)
      .clamp_max_(timesteps - 1);
}

at::Tensor SampleStreams::unit_times(const at::Tensor& keys, at::Device device,
                                     const TimestepSampling& sampling) const {
  const at::Tensor k = checked_keys(keys, device);
  const auto words = sample_words(seed_, kTimestepStream, k, 1);
  at::Tensor u;
  if (sampling.kind == TimestepSampling::Kind::uniform) {
    u = uniform53(words[0], words[1]);
  } else {
    // Box-Muller on 53-bit uniforms: 1 - uniform is in (0, 1], so the logarithm is finite.
    const at::Tensor radius = uniform53(words[0], words[1]).neg_().add_(1).log_().mul_(-2).sqrt_();
    const at::Tensor normal = radius * at::cos(uniform53(words[2], words[3]).mul_(2 * M_PI));
    u = at::sigmoid(normal.mul_(sampling.logit_std).add_(sampling.logit_mean));
  }
  return u.reshape({-1});
}

at::Tensor SampleStreams::label_drop(const at::Tensor& keys, double p, at::Device device) const {
  const at::Tensor k = checked_keys(keys, device);
  if (!(p >= 0 && p <= 1)) {
    throw std::invalid_argument(fmt::format("label drop probability must be in [0, 1], got {}", p));
  }
  const auto words = sample_words(seed_, kLabelDropStream, k, 1);
  return uniform53(words[0], words[1]).lt(p).reshape({-1});
}

at::Tensor SampleStreams::noise(const at::Tensor& keys, at::IntArrayRef sample_shape,
                                const at::TensorOptions& options) const {
  const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  if (!at::isFloatingType(dtype)) {
    throw std::invalid_argument(fmt::format("noise dtype must be floating point, got {}", core::dtype_name(dtype)));
  }
  const at::Tensor k = checked_keys(keys, options.device());
  std::vector<std::int64_t> shape{k.size(0)};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  std::int64_t per_sample = 1;
  for (const std::int64_t size : sample_shape) per_sample *= size;
  if (k.size(0) == 0 || per_sample == 0) return at::empty(shape, options);
  const auto words = sample_words(seed_, kNoiseStream, k, (per_sample + 3) / 4);
  const auto [z0, z1] = box_muller(words[0], words[1]);
  const auto [z2, z3] = box_muller(words[2], words[3]);
  // Block b holds elements 4b .. 4b + 3 of its sample.
  return at::stack({z0, z1, z2, z3}, 2).reshape({k.size(0), -1}).narrow(1, 0, per_sample).reshape(shape).to(options);
}

at::Tensor SampleStreams::next_keys(std::int64_t n) {
  if (n < 0) throw std::invalid_argument(fmt::format("key count must be >= 0, got {}", n));
  if (n > static_cast<std::int64_t>(kCounterKeyBit - 1) - counter_) {
    throw std::invalid_argument("sample key counter overflow");
  }
  at::Tensor keys = at::arange(counter_, counter_ + n, at::TensorOptions().dtype(at::kLong));
  keys.bitwise_or_(static_cast<std::int64_t>(kCounterKeyBit));
  counter_ += n;
  return keys;
}

void SampleStreams::set_counter(std::int64_t counter) {
  if (counter < 0) throw std::invalid_argument(fmt::format("sample key counter must be >= 0, got {}", counter));
  counter_ = counter;
}

at::Tensor SampleStreams::loader_keys(std::int64_t epoch, const at::Tensor& indices) {
  if (epoch < 0 || epoch >= kMaxEpoch) {
    throw std::invalid_argument(fmt::format("epoch must be in [0, {}), got {}", kMaxEpoch, epoch));
  }
  if (!indices.defined() || indices.dim() != 1 || indices.scalar_type() != at::kLong) {
    throw std::invalid_argument("dataset indices must be an int64 tensor of shape [B]");
  }
  const at::Tensor index = indices.to(at::kCPU).contiguous();
  at::Tensor keys = at::empty_like(index);
  const std::int64_t* in = index.data_ptr<std::int64_t>();
  std::int64_t* out = keys.data_ptr<std::int64_t>();
  constexpr std::int64_t kMaxIndex = std::int64_t{1} << kIndexBits;
  for (std::int64_t i = 0; i < index.size(0); ++i) {
    if (in[i] < 0 || in[i] >= kMaxIndex) {
      throw std::invalid_argument(fmt::format("dataset index must be in [0, 2^{}), got {}", kIndexBits, in[i]));
    }
    out[i] = (epoch << kIndexBits) | in[i];
  }
  return keys;
}

}  // namespace runner::diffusion
