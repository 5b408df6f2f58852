// Per-sample transforms: antialiased resize of the shorter side, center or random crop, random horizontal
// flip, and scaling of 8-bit values to [-1, 1]; randomness from (seed, epoch, sample index) only.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"
#include "runtime/core/sample_rng.h"

namespace runner::data {

struct TransformSpec {
  int resize = 0;       // shorter side after an antialiased (bilinear, PIL-style) resize; 0 keeps the size
  int crop_height = 0;  // 0: no crop
  int crop_width = 0;
  bool random_crop = false;  // else a center crop
  bool flip = false;         // horizontal flip with probability 1/2
  bool normalize = true;     // 8-bit values v become float32 v / 127.5 - 1
  bool fast_decode = true;   // let JPEG decoding downscale in the DCT domain when resizing anyway

  int min_shorter_side() const { return fast_decode ? resize : 0; }
};

// Where a sample's output comes from: the resized image size, the crop window in it, and the flip.
struct Placement {
  int resized_height = 0;
  int resized_width = 0;
  int top = 0;
  int left = 0;
  int height = 0;  // output size
  int width = 0;
  bool flip = false;
};

// Names a sample in error messages; called only when there is an error.
using SampleOrigin = std::function<std::string()>;

// Draws the crop offset and flip for a source of height x width; `origin` names the sample in errors
// (a crop larger than the resized image).
Placement place_sample(const TransformSpec& spec, int height, int width, core::SampleRng& rng,
                       const SampleOrigin& origin);

// The part of a height x width source that rendering through `placement` reads.
PixelWindow source_window(const Placement& placement, int height, int width);

// Reads image sample `index` and draws its placement; decoding is told the window the placement keeps,
// so a JPEG is decoded only as far as the crop needs.
Placement read_and_place(const Dataset& dataset, std::int64_t index, const TransformSpec& spec, core::SampleRng& rng,
                         Sample& sample);

// Renders an interleaved 8-bit image (which may be a window of the full image: see DecodedImage) through
// `placement` into planar (CHW) uint8 output.
void render_image(const DecodedImage& image, const Placement& placement, std::uint8_t* output);

// Resized size of the shorter side to `target` as torchvision's Resize(int): the longer side is truncated.
void resized_size(int height, int width, int target, int& out_height, int& out_width);

// Copies the crop window of a tensor sample (crop and flip act on its last two dimensions) into `output`, a
// contiguous CPU tensor of the output shape and the same dtype.
void render_tensor(const at::Tensor& sample, const Placement& placement, at::Tensor& output);

// Output shape (without the batch dimension) of a tensor sample of `shape` under `spec`.
std::vector<std::int64_t> tensor_output_shape(const TransformSpec& spec, const std::vector<std::int64_t>& shape,
                                              const SampleOrigin& origin);

// v / 127.5 - 1 for each byte, written as float32.
void normalize_bytes(const std::uint8_t* input, float* output, std::size_t count);

}  // namespace runner::data
