// A tensor's histogram for run:log (TensorBoard's histograms): equal bins over the range of its finite values.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace runner::run {

struct TensorHistogram {
  // The bins' range: the finite values' lowest and highest (0.5 either side when they are all equal); none when no
  // value is finite.
  std::optional<double> low, high;
  std::vector<int64_t> counts;  // equal bins over [low, high], the last one holding `high`; empty without a range
  int64_t nonfinite = 0;        // NaN and infinite elements, counted apart
};

inline constexpr int kHistogramBins = 64;

// Counted on the tensor's device (aminmax, histc in float64); the range and the counts are then copied to the host.
TensorHistogram tensor_histogram(const at::Tensor& values, int bins = kHistogramBins);

}  // namespace runner::run
