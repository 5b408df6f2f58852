// Per-sample keyed training draws (timesteps, noise, label dropout), independent of how batches are split.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace runner::diffusion {

// How training timesteps are drawn: uniform over 0..T-1, or logit-normal, floor(T sigmoid(mean + std n))
// with n standard normal (SD3's timestep density; diffusers' weighting_scheme "logit_normal"), which puts
// the training where noise and image are of about equal strength.
struct TimestepSampling {
  enum class Kind { uniform, logit_normal };
  Kind kind = Kind::uniform;
  double logit_mean = 0;
  double logit_std = 1;
};

// "uniform" or "logit_normal"; throws std::invalid_argument naming the choices (and `option`, the option that
// named it) for anything else.
TimestepSampling::Kind parse_timestep_sampling(const std::string& name, std::string_view option = "timestep sampling");
std::string timestep_sampling_name(TimestepSampling::Kind kind);
// The sampling of `kind` with the logit-normal's mean and std where given (runner.diffusion.gaussian's and .flow's
// options; `option` names the kind's option in errors). Throws std::invalid_argument for a mean that is not finite,
// a std that is not positive, or either given with the uniform kind.
TimestepSampling timestep_sampling_of(TimestepSampling::Kind kind, std::optional<double> logit_mean,
                                      std::optional<double> logit_std, std::string_view option);

// Every draw of a sample is a pure function of (seed, stream, key, element): Philox4x32-10 words
// (runtime/diffusion/philox.h) of the counter (element block, sample key) under a key derived from (seed,
// stream), computed in tensor ops on the device the draw is for. The host does nothing but copy the keys
// (asynchronously, from pinned memory), nothing waits for the device, and the CPU and a GPU draw the same
// integers (timesteps, label dropout) and the same noise up to the last bit of float64 log/cos/sin.
// Keys are int64 tensors [B] on any device: a loader sample's (epoch, dataset index) through loader_keys, or
// a running count from next_keys.
class SampleStreams;

// Which generator made a stream's draws; checkpoints record it (d:state()).
//   1: splitmix64 on the host for timesteps and label dropout, noise from the device's generator reseeded per
//      sample (runner before the draws moved to the device);
//   2: Philox4x32-10 in tensor ops for all three, as described above.
constexpr int kSampleStreamsGenerator = 2;

class SampleStreams {
 public:
  explicit SampleStreams(std::uint64_t seed);

  std::uint64_t seed() const { return seed_; }

  // int64 [B] in 0..T-1: floor(T u) with u uniform on 53 bits (each timestep's probability off by less than
  // T 2^-53), or as `sampling` says.
  at::Tensor timesteps(const at::Tensor& keys, std::int64_t timesteps, at::Device device,
                       const TimestepSampling& sampling = {}) const;
  // float64 [B] in [0, 1): the draw timesteps() scales by T, u uniform on 53 bits or sigmoid(mean + std n) (the
  // flow objective's training times, runtime/diffusion/flow.h).
  at::Tensor unit_times(const at::Tensor& keys, at::Device device, const TimestepSampling& sampling = {}) const;
  // [B, sample_shape...] standard normal (Box-Muller in float64 on 32-bit uniforms, so within 6.66 standard
  // deviations), floating dtype and device from options; element j of a sample is the same for any shape
  // with j elements or more.
  at::Tensor noise(const at::Tensor& keys, at::IntArrayRef sample_shape, const at::TensorOptions& options) const;
  // bool [B]: true (drop the label) with probability p.
  at::Tensor label_drop(const at::Tensor& keys, double p, at::Device device) const;

  // n fresh keys [counter, counter + n) with the top bit set (never equal to a loader key); advances the
  // counter.
  at::Tensor next_keys(std::int64_t n);
  std::int64_t counter() const { return counter_; }
  void set_counter(std::int64_t counter);

  // epoch * 2^40 + index for each dataset index: epoch in [0, 2^23), indices in [0, 2^40).
  static at::Tensor loader_keys(std::int64_t epoch, const at::Tensor& indices);

 private:
  std::uint64_t seed_;
  std::int64_t counter_ = 0;
};

}  // namespace runner::diffusion
