// A tensor's histogram for run:log: the range and counts computed on the tensor's device, then copied.
#include "runtime/run/tensor_histogram.h"

#include <ATen/ATen.h>

namespace runner::run {

TensorHistogram tensor_histogram(const at::Tensor& values, int bins) {
  const at::Tensor flat = values.detach().flatten().to(at::kDouble);
  const at::Tensor finite = flat.masked_select(at::isfinite(flat));
  TensorHistogram histogram;
  histogram.nonfinite = flat.numel() - finite.numel();
  if (finite.numel() == 0) return histogram;
  const auto [lowest, highest] = at::aminmax(finite);
  const at::Tensor range = at::stack({lowest, highest}).cpu();
  double low = range[0].item<double>(), high = range[1].item<double>();
  if (low == high) {
    low -= 0.5;
    high += 0.5;
  }
  const at::Tensor counts = at::histc(finite, bins, low, high).to(at::kLong).cpu();
  histogram.low = low;
  histogram.high = high;
  histogram.counts.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
  return histogram;
}

}  // namespace runner::run
