// Keyed per-sample random streams: counter generators on the host, reseeded device generators for noise.
#include "runtime/diffusion/sample_streams.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/data/sample_rng.h"

namespace runner::diffusion {
namespace {

constexpr std::uint64_t kTimestepStream = 0x74696d6573746570ull;   // "timestep"
constexpr std::uint64_t kNoiseStream = 0x6e6f697365657073ull;      // "noiseeps"
constexpr std::uint64_t kLabelDropStream = 0x6c6162656c647270ull;  // "labeldrp"
constexpr std::uint64_t kCounterKeyBit = 1ull << 63;
constexpr int kIndexBits = 40;
constexpr std::int64_t kMaxEpoch = std::int64_t{1} << (63 - kIndexBits);

// The keys as a contiguous int64 CPU tensor; throws for anything else.
at::Tensor checked_keys(const at::Tensor& keys) {
  if (!keys.defined() || keys.dim() != 1 || keys.scalar_type() != at::kLong || !keys.is_cpu()) {
    std::ostringstream got;
    if (keys.defined()) got << core::dtype_name(keys.scalar_type()) << " " << keys.sizes() << " on " << keys.device();
    else got << "an undefined tensor";
    throw std::invalid_argument("sample keys must be an int64 CPU tensor of shape [B], got " + got.str());
  }
  return keys.contiguous();
}

}  // namespace

TimestepSampling::Kind parse_timestep_sampling(const std::string& name) {
  if (name == "uniform") return TimestepSampling::Kind::uniform;
  if (name == "logit_normal") return TimestepSampling::Kind::logit_normal;
  throw std::invalid_argument(fmt::format("timestep sampling must be \"uniform\" or \"logit_normal\", got \"{}\"", name));
}

std::string timestep_sampling_name(TimestepSampling::Kind kind) {
  return kind == TimestepSampling::Kind::uniform ? "uniform" : "logit_normal";
}

SampleStreams::SampleStreams(std::uint64_t seed) : seed_(seed) {}

at::Tensor SampleStreams::timesteps(const at::Tensor& keys, std::int64_t timesteps, at::Device device,
                                    const TimestepSampling& sampling) const {
  const at::Tensor k = checked_keys(keys);
  if (timesteps < 1) throw std::invalid_argument(fmt::format("timesteps must be at least 1, got {}", timesteps));
  at::Tensor out = at::empty({k.size(0)}, at::TensorOptions().dtype(at::kLong));
  const std::int64_t* key = k.data_ptr<std::int64_t>();
  std::int64_t* t = out.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < k.size(0); ++i) {
    data::SampleRng rng(seed_, kTimestepStream, static_cast<std::uint64_t>(key[i]));
    if (sampling.kind == TimestepSampling::Kind::uniform) {
      t[i] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(timesteps)));
      continue;
    }
    // Box-Muller: 1 - uniform is in (0, 1], so the logarithm is finite.
    const double radius = std::sqrt(-2.0 * std::log(1.0 - rng.uniform()));
    const double normal = radius * std::cos(2.0 * M_PI * rng.uniform());
    const double u = 1.0 / (1.0 + std::exp(-(sampling.logit_mean + sampling.logit_std * normal)));
    t[i] = std::min(static_cast<std::int64_t>(u * static_cast<double>(timesteps)), timesteps - 1);
  }
  return out.to(device);
}

at::Tensor SampleStreams::label_drop(const at::Tensor& keys, double p, at::Device device) const {
  const at::Tensor k = checked_keys(keys);
  if (!(p >= 0 && p <= 1)) {
    throw std::invalid_argument(fmt::format("label drop probability must be in [0, 1], got {}", p));
  }
  at::Tensor out = at::empty({k.size(0)}, at::TensorOptions().dtype(at::kBool));
  const std::int64_t* key = k.data_ptr<std::int64_t>();
  bool* drop = out.data_ptr<bool>();
  for (std::int64_t i = 0; i < k.size(0); ++i) {
    data::SampleRng rng(seed_, kLabelDropStream, static_cast<std::uint64_t>(key[i]));
    drop[i] = rng.uniform() < p;
  }
  return out.to(device);
}

std::uint64_t SampleStreams::noise_seed(std::int64_t key) const {
  return data::SampleRng(seed_, kNoiseStream, static_cast<std::uint64_t>(key)).next();
}

at::Tensor SampleStreams::noise(const at::Tensor& keys, at::IntArrayRef sample_shape,
                                const at::TensorOptions& options) const {
  const at::Tensor k = checked_keys(keys);
  if (!at::isFloatingType(c10::typeMetaToScalarType(options.dtype()))) {
    throw std::invalid_argument(
        fmt::format("noise dtype must be floating point, got {}", core::dtype_name(c10::typeMetaToScalarType(options.dtype()))));
  }
  std::vector<std::int64_t> shape{k.size(0)};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  at::Tensor out = at::empty(shape, options);
  if (out.numel() == 0) return out;
  // A private generator: reseeding it per sample leaves the global stream alone.
  at::Generator generator = at::globalContext().defaultGenerator(out.device()).clone();
  const std::int64_t* key = k.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < k.size(0); ++i) {
    {
      // The sampling kernels take this mutex themselves, so it is held for the reseed only.
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_current_seed(noise_seed(key[i]));
    }
    // Filling a contiguous row in place draws exactly what at::randn(sample_shape, generator) would.
    out.select(0, i).normal_(0, 1, generator);
  }
  return out;
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
