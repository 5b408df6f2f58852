// Fréchet Inception Distance as pytorch-fid computes it: pool3 features of the FID Inception, their mean and
// covariance, and the Fréchet distance between two such Gaussians; statistics in .npz files as pytorch-fid,
// ADM and clean-fid write them (`mu`, `sigma`).
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/eval/fid_inception.h"

namespace runner::eval {

struct FidStatistics {
  at::Tensor mu;     // float64 [D]
  at::Tensor sigma;  // float64 [D, D]
};

// The mean and the (N - 1)-normalised covariance of features [N, D] (N >= 2), in float64.
FidStatistics fid_statistics(const at::Tensor& features);

// |mu_a - mu_b|^2 + tr(sigma_a) + tr(sigma_b) - 2 tr((sigma_a sigma_b)^(1/2)); the last trace as the sum of the
// square roots of the eigenvalues of sigma_a^(1/2) sigma_b sigma_a^(1/2) (symmetric, so no complex parts).
double frechet_distance(const FidStatistics& a, const FidStatistics& b);

// Throws std::invalid_argument naming the path and the missing or misshapen array.
FidStatistics read_fid_statistics(const std::string& npz_path);
void write_fid_statistics(const std::string& npz_path, const FidStatistics& statistics);

struct FidOptions {
  std::string weights;      // the FID Inception weights (load_fid_inception)
  std::int64_t batch = 50;  // images per forward pass
  std::string device = "auto";
  std::function<void(std::int64_t done, std::int64_t total)> progress;  // of_folder: after each batch
};

// The network loaded once, features of image tensors or folders.
class FidEvaluator {
 public:
  explicit FidEvaluator(const FidOptions& options);
  // images [N, 3, H, W] with values in [-1, 1] (runner's convention), on any device.
  FidStatistics of_images(const at::Tensor& images);
  // Every image of a folder (PNG, JPEG; decoded as RGB, values v / 255) in file order, as pytorch-fid reads them.
  FidStatistics of_folder(const std::string& folder);

 private:
  at::Tensor features_01(const at::Tensor& images01);
  FidOptions options_;
  c10::Device device_;
  FidInception network_{nullptr};
};

}  // namespace runner::eval
