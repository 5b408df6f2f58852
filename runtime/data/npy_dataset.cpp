// The .npy dataset: rows of a memory-mapped array, with optional labels from a second .npy file.
#include <ATen/ATen.h>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/npy.h"

namespace runner::data {
namespace {

std::vector<std::int64_t> read_labels(const NpyArray& labels, std::int64_t rows) {
  const at::ScalarType dtype = labels.header().dtype;
  if (!at::isIntegralType(dtype, /*includeBool=*/false))
    throw DataError(labels.path(), std::string("labels must be integers, not ") + c10::toString(dtype));
  if (labels.header().shape.size() != 1)
    throw DataError(labels.path(),
                    "labels must have shape [N], not " + std::to_string(labels.header().shape.size()) + " dimensions");
  if (labels.rows() != rows) {
    throw DataError(labels.path(),
                    "has " + std::to_string(labels.rows()) + " labels for " + std::to_string(rows) + " samples");
  }
  if (rows == 0) return {};
  const at::Tensor all = labels.copy_rows(0, rows).to(at::kLong);
  const std::int64_t* values = all.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < rows; ++i) {
    if (values[i] < 0)
      throw DataError(labels.path(),
                      "label " + std::to_string(values[i]) + " at index " + std::to_string(i) + " is negative");
  }
  return std::vector<std::int64_t>(values, values + rows);
}

class NpyDataset final : public Dataset {
 public:
  NpyDataset(const std::string& path, const std::string& labels_path, std::vector<std::string> classes)
      : data_(path), classes_(std::move(classes)) {
    if (!labels_path.empty()) {
      const NpyArray labels(labels_path);
      labels_ = read_labels(labels, data_.rows());
    }
    if (!classes_.empty()) {
      for (std::size_t i = 0; i < labels_.size(); ++i) {
        if (labels_[i] >= static_cast<std::int64_t>(classes_.size())) {
          throw DataError(labels_path, "label " + std::to_string(labels_[i]) + " at index " + std::to_string(i) +
                                           " but only " + std::to_string(classes_.size()) + " class names were given");
        }
      }
    }
  }

  std::int64_t size() const override { return data_.rows(); }
  SampleKind kind() const override { return SampleKind::tensor; }
  std::string describe() const override {
    std::string shape;
    for (std::int64_t dim : data_.header().shape) shape += (shape.empty() ? "" : ", ") + std::to_string(dim);
    return "npy " + data_.path() + ": [" + shape + "] " + c10::toString(data_.header().dtype) +
           (labels_.empty() ? "" : ", labelled");
  }
  bool has_labels() const override { return !labels_.empty(); }
  std::vector<std::string> classes() const override { return classes_; }
  void read(std::int64_t index, const ReadHint&, Sample& out) const override {
    out.tensor = data_.copy_rows(index, 1)[0];
    out.label = labels_.empty() ? -1 : labels_[static_cast<std::size_t>(index)];
  }
  std::string source(std::int64_t index) const override { return data_.path() + " row " + std::to_string(index); }

 private:
  NpyArray data_;
  std::vector<std::int64_t> labels_;
  std::vector<std::string> classes_;
};

}  // namespace

std::shared_ptr<const Dataset> open_npy(const std::string& path, const std::string& labels_path,
                                        const std::vector<std::string>& classes) {
  return std::make_shared<NpyDataset>(path, labels_path, classes);
}

}  // namespace runner::data
