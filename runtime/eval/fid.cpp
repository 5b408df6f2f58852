// FID: features, statistics, the Fréchet distance, and .npz statistics files.
#include "runtime/eval/fid.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "runtime/core/device.h"
#include "runtime/core/shape_text.h"
#include "runtime/data/datasets.h"
#include "runtime/data/loader.h"
#include "runtime/data/npz.h"

namespace runner::eval {

FidStatistics fid_statistics(const at::Tensor& features) {
  if (features.dim() != 2 || features.size(0) < 2)
    throw std::invalid_argument(
        fmt::format("FID needs at least 2 images, got features {}", core::shape_text(features.sizes())));
  const at::Tensor x = features.to(at::kCPU, at::kDouble);
  const at::Tensor mu = x.mean(0);
  const at::Tensor centred = x - mu;
  return {mu, centred.t().matmul(centred) / static_cast<double>(x.size(0) - 1)};
}

double frechet_distance(const FidStatistics& a, const FidStatistics& b) {
  if (!a.mu.sizes().equals(b.mu.sizes()) || !a.sigma.sizes().equals(b.sigma.sizes()))
    throw std::invalid_argument(
        fmt::format("FID: statistics of different sizes ({} and {} features)", a.mu.numel(), b.mu.numel()));
  const at::Tensor mu_a = a.mu.to(at::kDouble), mu_b = b.mu.to(at::kDouble);
  const at::Tensor sigma_a = a.sigma.to(at::kDouble), sigma_b = b.sigma.to(at::kDouble);
  auto [values, vectors] = at::linalg_eigh(sigma_a);
  const at::Tensor root_a = vectors.matmul(at::diag(values.clamp_min(0).sqrt())).matmul(vectors.t());
  at::Tensor product = root_a.matmul(sigma_b).matmul(root_a);
  product = (product + product.t()) / 2;  // symmetric up to rounding
  const double trace_root = at::linalg_eigvalsh(product).clamp_min(0).sqrt().sum().item<double>();
  const at::Tensor diff = mu_a - mu_b;
  return diff.dot(diff).item<double>() + sigma_a.trace().item<double>() + sigma_b.trace().item<double>() -
         2 * trace_root;
}

FidStatistics read_fid_statistics(const std::string& npz_path) {
  const auto arrays = data::load_npz(npz_path);
  auto get = [&](const char* name) {
    const auto found = arrays.find(name);
    if (found == arrays.end())
      throw std::invalid_argument(
          fmt::format("{}: no array '{}' (FID statistics files hold mu and sigma)", npz_path, name));
    return found->second.to(at::kDouble);
  };
  FidStatistics statistics{get("mu"), get("sigma")};
  const std::int64_t d = statistics.mu.numel();
  if (statistics.mu.dim() != 1 || statistics.sigma.dim() != 2 || statistics.sigma.size(0) != d ||
      statistics.sigma.size(1) != d)
    throw std::invalid_argument(fmt::format("{}: mu {} and sigma {} do not fit together", npz_path,
                                            core::shape_text(statistics.mu.sizes()),
                                            core::shape_text(statistics.sigma.sizes())));
  return statistics;
}

void write_fid_statistics(const std::string& npz_path, const FidStatistics& statistics) {
  data::save_npz(npz_path, {{"mu", statistics.mu}, {"sigma", statistics.sigma}});
}

FidEvaluator::FidEvaluator(const FidOptions& options) : options_(options), device_(core::parse_device(options.device)) {
  if (options_.weights.empty())
    throw std::invalid_argument("FID needs the weights of the FID Inception: " + fid_weights_help());
  if (options_.batch < 1)
    throw std::invalid_argument(fmt::format("FID: batch must be positive, got {}", options_.batch));
  network_ = load_fid_inception(options_.weights);
  network_->to(device_);
}

at::Tensor FidEvaluator::features_01(const at::Tensor& images01) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  for (std::int64_t start = 0; start < images01.size(0); start += options_.batch) {
    const at::Tensor batch = images01.narrow(0, start, std::min(options_.batch, images01.size(0) - start));
    parts.push_back(network_->features(batch.to(device_, at::kFloat)).to(at::kCPU));
  }
  return at::cat(parts, 0);
}

FidStatistics FidEvaluator::of_images(const at::Tensor& images) {
  if (images.dim() != 4 || images.size(1) != 3)
    throw std::invalid_argument(
        fmt::format("FID: images must be [N, 3, H, W] in [-1, 1], got {}", core::shape_text(images.sizes())));
  return fid_statistics(features_01((images.to(at::kFloat) + 1) / 2));
}

FidStatistics FidEvaluator::of_folder(const std::string& folder) {
  data::LoaderOptions options;
  options.batch = options_.batch;
  options.shuffle = false;
  options.rank = 0;
  options.world_size = 1;
  options.device = device_;
  options.transform.fast_decode = false;
  options.transform.normalize = false;  // bytes: v / 255 below, as pytorch-fid's ToTensor
  data::Loader loader(data::open_image_folder(folder, false), options);
  loader.set_end(loader.batches_per_epoch());
  std::vector<at::Tensor> parts;
  std::int64_t done = 0;
  for (std::int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    const data::Batch batch = loader.next();
    at::Tensor images = batch.data.to(at::kFloat) / 255.0;
    if (images.size(1) == 1) images = images.expand({-1, 3, -1, -1});  // grayscale as RGB, as PIL's convert("RGB")
    parts.push_back(features_01(images));
    if (options_.progress) options_.progress(done += images.size(0), loader.dataset().size());
  }
  return fid_statistics(at::cat(parts, 0));
}

}  // namespace runner::eval
