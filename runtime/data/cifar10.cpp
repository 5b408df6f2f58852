// The CIFAR-10 binary dataset: memory-mapped batches of (label byte, 3x32x32 planar pixels) records.
#include <array>
#include <filesystem>
#include <fstream>
#include <memory>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/mapped_file.h"

namespace runner::data {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kPixels = 32 * 32;
constexpr std::size_t kRecordBytes = 1 + 3 * kPixels;

const std::vector<std::string> kDefaultClasses = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                  "dog",      "frog",       "horse", "ship", "truck"};

class Cifar10Dataset final : public Dataset {
 public:
  Cifar10Dataset(std::string directory, bool train) : directory_(std::move(directory)) {
    std::error_code error;
    if (!fs::is_directory(directory_, error)) throw DataError(directory_, "no such directory");
    if (!fs::exists(fs::path(directory_) / "test_batch.bin", error) &&
        fs::is_directory(fs::path(directory_) / "cifar-10-batches-bin", error)) {
      directory_ = (fs::path(directory_) / "cifar-10-batches-bin").string();
    }
    std::vector<std::string> names;
    if (train) {
      for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
    } else {
      names.push_back("test_batch.bin");
    }
    for (const std::string& name : names) {
      const std::string path = (fs::path(directory_) / name).string();
      if (!fs::exists(path, error))
        throw DataError(path, "missing (expected the binary CIFAR-10 files data_batch_1..5.bin and test_batch.bin)");
      auto file = std::make_unique<MappedFile>(path);
      const std::int64_t records = parse_cifar10_batch(file->data(), file->size(), path);
      first_index_.push_back(count_);
      count_ += records;
      files_.push_back(std::move(file));
    }
    classes_ = read_class_names();
  }

  std::int64_t size() const override { return count_; }
  SampleKind kind() const override { return SampleKind::image; }
  std::string describe() const override {
    return "cifar10 " + directory_ + ": " + std::to_string(count_) + " images, 10 classes";
  }
  std::vector<std::string> classes() const override { return classes_; }
  void read(std::int64_t index, const ReadHint&, Sample& out) const override {
    const auto [file, record] = locate(index);
    std::array<std::uint8_t, kRecordBytes> record_bytes;
    files_[file]->copy(record * kRecordBytes, kRecordBytes, record_bytes.data());
    const std::uint8_t* bytes = record_bytes.data();
    out.label = bytes[0];
    out.image.resize(32, 32, 3);
    std::uint8_t* pixels = out.image.pixels.data();
    for (std::size_t p = 0; p < kPixels; ++p) {
      pixels[3 * p] = bytes[1 + p];
      pixels[3 * p + 1] = bytes[1 + kPixels + p];
      pixels[3 * p + 2] = bytes[1 + 2 * kPixels + p];
    }
  }
  std::string source(std::int64_t index) const override {
    const auto [file, record] = locate(index);
    return files_[file]->path() + " record " + std::to_string(record);
  }

 private:
  std::pair<std::size_t, std::size_t> locate(std::int64_t index) const {
    std::size_t file = first_index_.size() - 1;
    while (first_index_[file] > index) --file;
    return {file, static_cast<std::size_t>(index - first_index_[file])};
  }

  std::vector<std::string> read_class_names() const {
    std::ifstream meta(fs::path(directory_) / "batches.meta.txt");
    std::vector<std::string> names;
    for (std::string line; std::getline(meta, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty()) names.push_back(line);
    }
    return names.size() == 10 ? names : kDefaultClasses;
  }

  std::string directory_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<std::int64_t> first_index_;
  std::int64_t count_ = 0;
  std::vector<std::string> classes_;
};

}  // namespace

std::int64_t parse_cifar10_batch(const std::uint8_t* data, std::size_t size, const std::string& origin) {
  if (size == 0) throw DataError(origin, "empty file, not a CIFAR-10 batch");
  if (size % kRecordBytes != 0) {
    throw DataError(origin, "size " + std::to_string(size) + " is not a multiple of the 3073-byte CIFAR-10 record" +
                                " (truncated, or not the binary version?)");
  }
  const std::size_t records = size / kRecordBytes;
  for (std::size_t r = 0; r < records; ++r) {
    if (data[r * kRecordBytes] > 9) {
      throw DataError(origin, "record " + std::to_string(r) + " has label " + std::to_string(data[r * kRecordBytes]) +
                                  " (CIFAR-10 labels are 0..9; is this CIFAR-100?)");
    }
  }
  return static_cast<std::int64_t>(records);
}

std::shared_ptr<const Dataset> open_cifar10(const std::string& directory, bool train) {
  return std::make_shared<Cifar10Dataset>(directory, train);
}

}  // namespace runner::data
