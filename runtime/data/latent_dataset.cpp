// The latent dataset: posterior samples of `runner data encode`'s means and log-variances, drawn per read.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/mapped_file.h"
#include "runtime/data/npy.h"
#include "runtime/data/pack.h"
#include "runtime/core/sample_rng.h"

namespace runner::data {
namespace {

constexpr std::uint64_t kPosteriorStream = 0x4c4154454e54ull;  // reads outside a loader

nlohmann::json read_manifest(const std::string& path) {
  const std::string text = read_file_bytes(path);
  try {
    nlohmann::json manifest = nlohmann::json::parse(text);
    if (!manifest.is_object() || manifest.value("format", "") != "runner latents")
      throw DataError(path, "not a manifest of `runner data encode` (format \"runner latents\")");
    return manifest;
  } catch (const nlohmann::json::exception& error) {
    throw DataError(path, std::string("not valid JSON: ") + error.what());
  }
}

class LatentDataset final : public Dataset {
 public:
  LatentDataset(const std::string& path, double scale) : data_(path) {
    const std::string manifest_path = sibling_path(path, ".json");
    const nlohmann::json manifest = latents_manifest(path);
    const auto& shape = data_.header().shape;
    if (shape.size() != 6 || (shape[1] != 1 && shape[1] != 2) || shape[2] != 2 || data_.header().dtype != at::kFloat)
      throw DataError(path,
                      "expected float32 [N, flips (1 or 2), 2 (mean, logvar), C, h, w] as `runner data encode` writes");
    try {
      const auto& vae = manifest.at("vae");
      scale_ = scale > 0 ? scale : vae.at("scaling_factor").get<double>();
      shift_ = vae.contains("shift_factor") && !vae["shift_factor"].is_null() ? vae["shift_factor"].get<double>() : 0.0;
    } catch (const nlohmann::json::exception& error) {
      throw DataError(manifest_path, std::string("the vae entry is incomplete: ") + error.what());
    }
    const std::string labels_path = sibling_path(path, ".labels.npy");
    if (std::filesystem::exists(labels_path)) {
      const at::Tensor labels = NpyArray(labels_path).copy_rows(0, data_.rows()).to(at::kLong);
      labels_.assign(labels.data_ptr<std::int64_t>(), labels.data_ptr<std::int64_t>() + labels.numel());
      if (static_cast<std::int64_t>(labels_.size()) != data_.rows())
        throw DataError(labels_path, "has " + std::to_string(labels_.size()) + " labels for " +
                                         std::to_string(data_.rows()) + " latents");
    }
    const std::string classes_path = sibling_path(path, ".classes.json");
    if (std::filesystem::exists(classes_path)) classes_ = read_class_names(classes_path);
  }

  std::int64_t size() const override { return data_.rows(); }
  SampleKind kind() const override { return SampleKind::tensor; }
  std::string describe() const override {
    const auto& s = data_.header().shape;
    return "latents " + data_.path() + ": " + std::to_string(s[0]) + " x [" + std::to_string(s[3]) + ", " +
           std::to_string(s[4]) + ", " + std::to_string(s[5]) + "]" + (s[1] == 2 ? " with flips" : "") +
           (labels_.empty() ? "" : ", labelled");
  }
  bool has_labels() const override { return !labels_.empty(); }
  std::vector<std::string> classes() const override { return classes_; }

  void read(std::int64_t index, const ReadHint& hint, Sample& out) const override {
    core::SampleRng own(0, kPosteriorStream, static_cast<std::uint64_t>(index));
    core::SampleRng& rng = hint.rng ? *hint.rng : own;
    const at::Tensor row = data_.copy_rows(index, 1)[0];  // [F, 2, C, h, w]
    const std::int64_t flip =
        row.size(0) > 1 ? static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(row.size(0)))) : 0;
    const at::Tensor mean = row[flip][0].contiguous();
    const at::Tensor logvar = row[flip][1].contiguous();
    out.tensor = at::empty_like(mean);
    const float* m = mean.data_ptr<float>();
    const float* v = logvar.data_ptr<float>();
    float* z = out.tensor.data_ptr<float>();
    const std::int64_t n = mean.numel();
    for (std::int64_t i = 0; i < n; i += 2) {
      // Box-Muller: two standard normals from two uniforms in (0, 1].
      const double u1 = 1.0 - rng.uniform();
      const double u2 = rng.uniform();
      const double radius = std::sqrt(-2.0 * std::log(u1));
      const double noise[2] = {radius * std::cos(2 * M_PI * u2), radius * std::sin(2 * M_PI * u2)};
      for (std::int64_t k = 0; k < 2 && i + k < n; ++k) {
        const double sample = m[i + k] + std::exp(0.5 * v[i + k]) * noise[k];
        z[i + k] = static_cast<float>(scale_ * (sample - shift_));
      }
    }
    out.label = labels_.empty() ? -1 : labels_[static_cast<std::size_t>(index)];
  }
  std::string source(std::int64_t index) const override { return data_.path() + " row " + std::to_string(index); }

 private:
  NpyArray data_;
  double scale_ = 1;
  double shift_ = 0;
  std::vector<std::int64_t> labels_;
  std::vector<std::string> classes_;
};

}  // namespace

nlohmann::json latents_manifest(const std::string& path) {
  const std::string manifest_path = sibling_path(path, ".json");
  if (!std::filesystem::exists(manifest_path))
    throw DataError(manifest_path,
                    "missing: data.latents reads the manifest `runner data encode` writes beside the array");
  return read_manifest(manifest_path);
}

std::shared_ptr<const Dataset> open_latents(const std::string& path, double scale) {
  return std::make_shared<LatentDataset>(path, scale);
}

}  // namespace runner::data
