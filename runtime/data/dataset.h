// The dataset interface the loader reads from: a size, labelled samples by index, their source files.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/image_decoder.h"

namespace runner::core {
class SampleRng;
}  // namespace runner::core

namespace runner::data {

enum class SampleKind {
  image,   // 8-bit interleaved pixels of any size (image folders, CIFAR, MNIST, shapes): the image transforms apply
  tensor,  // a tensor of fixed shape and any dtype (.npy arrays, Lua datasets)
};

struct Sample {
  DecodedImage image;  // for SampleKind::image
  at::Tensor tensor;   // for SampleKind::tensor
  std::int64_t label = -1;
};

// What the transform will use of an image, so that decoding can take shortcuts (JPEG DCT scaling, decoding
// only the window a crop keeps); and the sample's keyed random stream for datasets that draw (latent
// posteriors), null outside the loader.
struct ReadHint : DecodeHint {
  core::SampleRng* rng = nullptr;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  virtual SampleKind kind() const = 0;
  // "image_folder /data/faces: 1200 images, 2 classes"
  virtual std::string describe() const = 0;
  virtual bool has_labels() const { return !classes().empty(); }
  // Class names by label id; empty when the dataset has no class names.
  virtual std::vector<std::string> classes() const { return {}; }
  // Reads sample `index` (0-based, < size()). Thread-safe unless reads_on_caller_thread(); throws DataError
  // naming the file for bad data.
  virtual void read(std::int64_t index, const ReadHint& hint, Sample& out) const = 0;
  // The file (and record) sample `index` comes from, for messages.
  virtual std::string source(std::int64_t index) const = 0;
  // True for datasets that must be read on the thread that owns them (Lua datasets): the loader then
  // assembles batches on the calling thread instead of worker threads.
  virtual bool reads_on_caller_thread() const { return false; }
};

}  // namespace runner::data
