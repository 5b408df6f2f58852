// The MNIST dataset from IDX files: memory-mapped 28x28 grayscale images and their labels.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/mapped_file.h"

namespace runner::data {
namespace {

namespace fs = std::filesystem;

std::size_t idx_element_bytes(int type_code) {
  switch (type_code) {
    case 0x08:
    case 0x09:
      return 1;
    case 0x0B:
      return 2;
    case 0x0C:
    case 0x0D:
      return 4;
    case 0x0E:
      return 8;
    default:
      return 0;
  }
}

// The first existing file among the usual spellings and layouts (plain, torchvision's MNIST/raw, Kaggle's).
std::string find_idx_file(const std::string& directory, const std::string& prefix, const std::string& suffix) {
  std::error_code error;
  for (const char* sub : {"", "raw", "MNIST/raw"}) {
    for (const char* separator : {"-", "."}) {
      const fs::path path = fs::path(directory) / sub / (prefix + separator + suffix);
      if (fs::is_regular_file(path, error)) return path.string();
      if (fs::is_regular_file(path.string() + ".gz", error))
        throw DataError(path.string() + ".gz", "is compressed; decompress it first (gunzip -k)");
    }
  }
  throw DataError((fs::path(directory) / (prefix + "-" + suffix)).string(), "missing (expected MNIST IDX files)");
}

class MnistDataset final : public Dataset {
 public:
  MnistDataset(const std::string& directory, bool train) : directory_(directory) {
    std::error_code error;
    if (!fs::is_directory(directory, error)) throw DataError(directory, "no such directory");
    const std::string prefix = train ? "train" : "t10k";
    images_ = std::make_unique<MappedFile>(find_idx_file(directory, prefix + "-images", "idx3-ubyte"));
    labels_ = std::make_unique<MappedFile>(find_idx_file(directory, prefix + "-labels", "idx1-ubyte"));
    const IdxHeader images = parse_idx_header(images_->data(), images_->size(), images_->path());
    const IdxHeader labels = parse_idx_header(labels_->data(), labels_->size(), labels_->path());
    if (images.type_code != 0x08 || images.shape.size() != 3)
      throw DataError(images_->path(), "expected unsigned bytes of shape [N, H, W]");
    if (labels.type_code != 0x08 || labels.shape.size() != 1)
      throw DataError(labels_->path(), "expected unsigned bytes of shape [N]");
    if (images.shape[0] != labels.shape[0]) {
      throw DataError(labels_->path(), "has " + std::to_string(labels.shape[0]) + " labels but " + images_->path() +
                                           " has " + std::to_string(images.shape[0]) + " images");
    }
    if (images.shape[1] < 1 || images.shape[2] < 1) {
      throw DataError(images_->path(), "images of " + std::to_string(images.shape[1]) + " x " +
                                           std::to_string(images.shape[2]) + " pixels: both sides must be at least 1");
    }
    count_ = images.shape[0];
    height_ = static_cast<int>(images.shape[1]);
    width_ = static_cast<int>(images.shape[2]);
    pixels_offset_ = images.data_offset;
    label_bytes_.resize(static_cast<std::size_t>(count_));
    labels_->copy(labels.data_offset, label_bytes_.size(), label_bytes_.data());
    for (std::int64_t i = 0; i < count_; ++i) {
      if (label_bytes_[i] > 9)
        throw DataError(labels_->path(), "label " + std::to_string(label_bytes_[i]) + " at index " + std::to_string(i) +
                                             " is not a digit");
    }
  }

  std::int64_t size() const override { return count_; }
  SampleKind kind() const override { return SampleKind::image; }
  std::string describe() const override {
    return "mnist " + directory_ + ": " + std::to_string(count_) + " images, 10 classes";
  }
  std::vector<std::string> classes() const override { return {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}; }
  void read(std::int64_t index, const ReadHint&, Sample& out) const override {
    out.image.resize(height_, width_, 1);
    const std::size_t bytes = static_cast<std::size_t>(height_) * width_;
    images_->copy(pixels_offset_ + static_cast<std::size_t>(index) * bytes, bytes, out.image.pixels.data());
    out.label = label_bytes_[index];
  }
  std::string source(std::int64_t index) const override { return images_->path() + " image " + std::to_string(index); }

 private:
  std::string directory_;
  std::unique_ptr<MappedFile> images_;
  std::unique_ptr<MappedFile> labels_;
  std::size_t pixels_offset_ = 0;
  std::vector<std::uint8_t> label_bytes_;
  std::int64_t count_ = 0;
  int height_ = 0;
  int width_ = 0;
};

}  // namespace

IdxHeader parse_idx_header(const std::uint8_t* data, std::size_t size, const std::string& origin) {
  if (size < 4 || data[0] != 0 || data[1] != 0) throw DataError(origin, "not an IDX file (bad magic number)");
  IdxHeader header;
  header.type_code = data[2];
  const std::size_t element = idx_element_bytes(header.type_code);
  if (element == 0) throw DataError(origin, fmt::format("unknown IDX element type {:#04x}", header.type_code));
  const int dims = data[3];
  if (dims < 1 || dims > 8) throw DataError(origin, "IDX file with " + std::to_string(dims) + " dimensions");
  header.data_offset = 4 + 4 * static_cast<std::size_t>(dims);
  if (size < header.data_offset) throw DataError(origin, "file ends inside the IDX header (truncated?)");
  std::uint64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    const std::uint8_t* p = data + 4 + 4 * d;
    const std::uint64_t dim =
        (std::uint64_t{p[0]} << 24) | (std::uint64_t{p[1]} << 16) | (std::uint64_t{p[2]} << 8) | p[3];
    if (dim > 0x7fffffff) throw DataError(origin, "IDX dimension " + std::to_string(dim) + " is too large");
    header.shape.push_back(static_cast<std::int64_t>(dim));
    // Checked before multiplying: three dimensions below 2^31 can wrap the count around to 0.
    if (dim != 0 && count > (std::uint64_t{1} << 40) / dim) throw DataError(origin, "IDX shape is too large");
    count *= dim;
  }
  const std::uint64_t expected = count * element;
  const std::uint64_t available = size - header.data_offset;
  if (available != expected) {
    throw DataError(origin, "holds " + std::to_string(available) + " bytes of data but its header needs " +
                                std::to_string(expected) + (available < expected ? " (truncated?)" : ""));
  }
  return header;
}

std::shared_ptr<const Dataset> open_mnist(const std::string& directory, bool train) {
  return std::make_shared<MnistDataset>(directory, train);
}

}  // namespace runner::data
