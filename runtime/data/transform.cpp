// Per-sample transforms: placement (resize, crop, flip), antialiased resampling, tensor crops, scaling.
#include "runtime/data/transform.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>

#include "runtime/data/data_error.h"

namespace runner::data {
namespace {

// Filter taps along one axis for output positions [begin, begin + count) of a resize from in_size to
// out_size: the antialiased bilinear (triangle) filter of PIL and of torch's interpolate(antialias=True).
// Every position gets the same number of taps (zero-padded), so the inner loops have a fixed length.
struct AxisTaps {
  int taps = 0;
  std::vector<int> first;
  std::vector<float> weights;  // taps weights for position k at k * taps
};

AxisTaps axis_taps(int in_size, int out_size, int begin, int count) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double support = scale >= 1.0 ? scale : 1.0;
  const double inverse_scale = scale >= 1.0 ? 1.0 / scale : 1.0;
  std::vector<int> lo(count);
  std::vector<int> hi(count);
  int taps = 1;
  for (int k = 0; k < count; ++k) {
    const double center = scale * (begin + k + 0.5);
    lo[k] = std::max(static_cast<int>(center - support + 0.5), 0);
    hi[k] = std::min(static_cast<int>(center + support + 0.5), in_size);
    taps = std::max(taps, hi[k] - lo[k]);
  }
  AxisTaps result;
  result.taps = taps;
  result.first.resize(count);
  result.weights.assign(static_cast<std::size_t>(count) * taps, 0.0f);
  std::vector<double> weights(static_cast<std::size_t>(taps));
  for (int k = 0; k < count; ++k) {
    const double center = scale * (begin + k + 0.5);
    double total = 0;
    for (int j = 0; j < hi[k] - lo[k]; ++j) {
      const double x = std::abs((j + lo[k] - center + 0.5) * inverse_scale);
      weights[j] = x < 1.0 ? 1.0 - x : 0.0;
      total += weights[j];
    }
    // Shift windows that would run past the end to the left, with leading zero weights.
    const int first = std::min(lo[k], in_size - taps);
    result.first[k] = first;
    float* out = result.weights.data() + static_cast<std::size_t>(k) * taps;
    for (int j = 0; j < hi[k] - lo[k]; ++j)
      out[lo[k] - first + j] = static_cast<float>(total > 0 ? weights[j] / total : 0.0);
  }
  return result;
}

inline std::uint8_t to_byte(float v) { return static_cast<std::uint8_t>(std::clamp(v + 0.5f, 0.0f, 255.0f)); }

// The range of source positions [first, last) that the taps of `taps` read (first is non-decreasing).
std::pair<int, int> tap_range(const AxisTaps& taps) { return {taps.first.front(), taps.first.back() + taps.taps}; }

// The filter taps of both axes for rendering `image` through `p`, and the source rows and columns they read.
struct ResamplePlan {
  AxisTaps rows;
  AxisTaps cols;
  int row_lo, row_hi, col_lo, col_hi;
};

ResamplePlan plan_resample(const DecodedImage& image, const Placement& p) {
  ResamplePlan plan{axis_taps(image.full_height, p.resized_height, p.top, p.height),
                    axis_taps(image.full_width, p.resized_width, p.left, p.width),
                    0,
                    0,
                    0,
                    0};
  std::tie(plan.row_lo, plan.row_hi) = tap_range(plan.rows);
  std::tie(plan.col_lo, plan.col_hi) = tap_range(plan.cols);
  if (plan.row_lo < image.top || plan.row_hi > image.top + image.height || plan.col_lo < image.left ||
      plan.col_hi > image.left + image.width)
    throw DataError("", "internal error: the decoded window does not cover the resampling taps");
  return plan;
}

template <int C>
void resample(const DecodedImage& image, const Placement& p, std::uint8_t* output) {
  const ResamplePlan plan = plan_resample(image, p);
  const AxisTaps& rows = plan.rows;
  const AxisTaps& cols = plan.cols;
  const int row_lo = plan.row_lo, row_hi = plan.row_hi, col_lo = plan.col_lo, col_hi = plan.col_hi;
  const std::size_t out_row = static_cast<std::size_t>(p.width) * C;

  // Horizontal pass over the source rows the vertical pass needs, into [row][x][c] floats.
  thread_local std::vector<float> horizontal;
  thread_local std::vector<float> source_row;
  horizontal.resize(static_cast<std::size_t>(row_hi - row_lo) * out_row);
  source_row.resize(static_cast<std::size_t>(col_hi - col_lo) * C);
  const int taps = cols.taps;
  for (int r = row_lo; r < row_hi; ++r) {
    const std::uint8_t* src =
        image.pixels.data() + (static_cast<std::size_t>(r - image.top) * image.width + (col_lo - image.left)) * C;
    for (std::size_t i = 0; i < source_row.size(); ++i) source_row[i] = src[i];
    float* dst = horizontal.data() + static_cast<std::size_t>(r - row_lo) * out_row;
    for (int x = 0; x < p.width; ++x) {
      const int k = p.flip ? p.width - 1 - x : x;
      const float* w = cols.weights.data() + static_cast<std::size_t>(k) * taps;
      const float* s = source_row.data() + static_cast<std::size_t>(cols.first[k] - col_lo) * C;
      float sum[C] = {};
      for (int j = 0; j < taps; ++j) {
        for (int c = 0; c < C; ++c) sum[c] += w[j] * s[j * C + c];
      }
      for (int c = 0; c < C; ++c) dst[x * C + c] = sum[c];
    }
  }

  // Vertical pass: a weighted sum of whole rows, then written planar.
  thread_local std::vector<float> accumulated;
  accumulated.resize(out_row);
  const std::size_t plane = static_cast<std::size_t>(p.height) * p.width;
  for (int y = 0; y < p.height; ++y) {
    const float* w = rows.weights.data() + static_cast<std::size_t>(y) * rows.taps;
    std::fill(accumulated.begin(), accumulated.end(), 0.0f);
    float* acc = accumulated.data();
    for (int j = 0; j < rows.taps; ++j) {
      const float weight = w[j];
      if (weight == 0.0f) continue;
      const float* s = horizontal.data() + static_cast<std::size_t>(rows.first[y] + j - row_lo) * out_row;
      for (std::size_t i = 0; i < out_row; ++i) acc[i] += weight * s[i];
    }
    std::uint8_t* out = output + static_cast<std::size_t>(y) * p.width;
    for (int x = 0; x < p.width; ++x) {
      for (int c = 0; c < C; ++c) out[c * plane + x] = to_byte(acc[x * C + c]);
    }
  }
}

// RGB resampling with each pixel in one 4-float vector (R, G, B, 0): the taps become whole-vector
// multiply-adds, which plain x86-64 (SSE2) and ARM (NEON) both do four lanes at a time.
typedef float Pixel4 __attribute__((vector_size(16)));
typedef int Int4 __attribute__((vector_size(16)));

void resample_rgb(const DecodedImage& image, const Placement& p, std::uint8_t* output) {
  const ResamplePlan plan = plan_resample(image, p);
  const AxisTaps& rows = plan.rows;
  const AxisTaps& cols = plan.cols;
  const int row_lo = plan.row_lo, row_hi = plan.row_hi, col_lo = plan.col_lo, col_hi = plan.col_hi;

  thread_local std::vector<Pixel4> horizontal;
  thread_local std::vector<Pixel4> source_row;
  thread_local std::vector<Pixel4> accumulated;
  thread_local std::vector<float> row_floats;
  const Pixel4 zero4 = {0, 0, 0, 0};
  row_floats.resize(3 * static_cast<std::size_t>(col_hi - col_lo) + 1);
  horizontal.resize(static_cast<std::size_t>(row_hi - row_lo) * p.width);
  source_row.resize(static_cast<std::size_t>(col_hi - col_lo));
  accumulated.resize(static_cast<std::size_t>(p.width));
  const int taps = cols.taps;
  for (int r = row_lo; r < row_hi; ++r) {
    const std::uint8_t* src =
        image.pixels.data() + (static_cast<std::size_t>(r - image.top) * image.width + (col_lo - image.left)) * 3;
    // Bytes to floats (a loop the compiler vectorizes), then each RGB triple widened to a vector by an
    // unaligned 4-float load with the fourth lane cleared (row_floats has one float of slack).
    const std::size_t count = source_row.size();
    for (std::size_t i = 0; i < 3 * count; ++i) row_floats[i] = static_cast<float>(src[i]);
    for (std::size_t i = 0; i < count; ++i) {
      Pixel4 v;
      std::memcpy(&v, row_floats.data() + 3 * i, sizeof v);
      source_row[i] = __builtin_shufflevector(v, zero4, 0, 1, 2, 4);
    }
    Pixel4* dst = horizontal.data() + static_cast<std::size_t>(r - row_lo) * p.width;
    auto weights_of = [&](int x) {
      return cols.weights.data() + static_cast<std::size_t>(p.flip ? p.width - 1 - x : x) * taps;
    };
    auto source_of = [&](int x) { return source_row.data() + (cols.first[p.flip ? p.width - 1 - x : x] - col_lo); };
    int x = 0;
    // Four output pixels at a time: four independent add chains instead of one long one.
    for (; x + 4 <= p.width; x += 4) {
      const float *w0 = weights_of(x), *w1 = weights_of(x + 1), *w2 = weights_of(x + 2), *w3 = weights_of(x + 3);
      const Pixel4 *s0 = source_of(x), *s1 = source_of(x + 1), *s2 = source_of(x + 2), *s3 = source_of(x + 3);
      Pixel4 a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
      for (int j = 0; j < taps; ++j) {
        a0 += w0[j] * s0[j];
        a1 += w1[j] * s1[j];
        a2 += w2[j] * s2[j];
        a3 += w3[j] * s3[j];
      }
      dst[x] = a0;
      dst[x + 1] = a1;
      dst[x + 2] = a2;
      dst[x + 3] = a3;
    }
    for (; x < p.width; ++x) {
      const float* w = weights_of(x);
      const Pixel4* s = source_of(x);
      Pixel4 sum = {0, 0, 0, 0};
      for (int j = 0; j < taps; ++j) sum += w[j] * s[j];
      dst[x] = sum;
    }
  }
  const std::size_t plane = static_cast<std::size_t>(p.height) * p.width;
  for (int y = 0; y < p.height; ++y) {
    const float* w = rows.weights.data() + static_cast<std::size_t>(y) * rows.taps;
    std::fill(accumulated.begin(), accumulated.end(), Pixel4{0, 0, 0, 0});
    Pixel4* acc = accumulated.data();
    for (int j = 0; j < rows.taps; ++j) {
      const float weight = w[j];
      if (weight == 0.0f) continue;
      const Pixel4* s = horizontal.data() + static_cast<std::size_t>(rows.first[y] + j - row_lo) * p.width;
      for (int x = 0; x < p.width; ++x) acc[x] += weight * s[x];
    }
    std::uint8_t* out = output + static_cast<std::size_t>(y) * p.width;
    const Pixel4 zero = {0, 0, 0, 0};
    const Pixel4 top = {255, 255, 255, 255};
    for (int x = 0; x < p.width; ++x) {
      Pixel4 v = acc[x] + 0.5f;  // weights are non-negative: v is in [0.5, 255.5] up to rounding
      v = v < zero ? zero : v;
      v = v > top ? top : v;
      const Int4 bytes = __builtin_convertvector(v, Int4);
      out[x] = static_cast<std::uint8_t>(bytes[0]);
      out[plane + x] = static_cast<std::uint8_t>(bytes[1]);
      out[2 * plane + x] = static_cast<std::uint8_t>(bytes[2]);
    }
  }
}

void copy_window(const DecodedImage& image, const Placement& p, std::uint8_t* output) {
  const int C = image.channels;
  const std::size_t plane = static_cast<std::size_t>(p.height) * p.width;
  for (int y = 0; y < p.height; ++y) {
    const std::uint8_t* src =
        image.pixels.data() +
        (static_cast<std::size_t>(p.top + y - image.top) * image.width + (p.left - image.left)) * C;
    for (int x = 0; x < p.width; ++x) {
      const int sx = p.flip ? p.width - 1 - x : x;
      for (int c = 0; c < C; ++c) output[c * plane + static_cast<std::size_t>(y) * p.width + x] = src[sx * C + c];
    }
  }
}

std::string size_text(int height, int width) { return std::to_string(width) + "x" + std::to_string(height); }

}  // namespace

void resized_size(int height, int width, int target, int& out_height, int& out_width) {
  if (height <= width) {
    out_height = target;
    out_width = static_cast<int>(static_cast<std::int64_t>(target) * width / height);
  } else {
    out_width = target;
    out_height = static_cast<int>(static_cast<std::int64_t>(target) * height / width);
  }
}

Placement place_sample(const TransformSpec& spec, int height, int width, core::SampleRng& rng,
                       const SampleOrigin& origin) {
  Placement p;
  if (spec.resize > 0) {
    resized_size(height, width, spec.resize, p.resized_height, p.resized_width);
  } else {
    p.resized_height = height;
    p.resized_width = width;
  }
  p.height = p.resized_height;
  p.width = p.resized_width;
  if (spec.crop_height > 0) {
    if (spec.crop_height > p.resized_height || spec.crop_width > p.resized_width) {
      throw DataError(origin(), "is " + size_text(p.resized_height, p.resized_width) +
                                    (spec.resize > 0 ? " after resizing" : "") + ", smaller than the crop " +
                                    size_text(spec.crop_height, spec.crop_width) +
                                    (spec.resize > 0 ? "" : " (add resize to the transform)"));
    }
    p.height = spec.crop_height;
    p.width = spec.crop_width;
    if (spec.random_crop) {
      p.top = static_cast<int>(rng.below(static_cast<std::uint64_t>(p.resized_height - p.height + 1)));
      p.left = static_cast<int>(rng.below(static_cast<std::uint64_t>(p.resized_width - p.width + 1)));
    } else {
      // torchvision's CenterCrop: Python's round(), which rounds halves to even.
      p.top = static_cast<int>(std::nearbyint((p.resized_height - p.height) / 2.0));
      p.left = static_cast<int>(std::nearbyint((p.resized_width - p.width) / 2.0));
    }
  }
  if (spec.flip) p.flip = (rng.next() >> 63) != 0;
  return p;
}

PixelWindow source_window(const Placement& p, int height, int width) {
  if (p.resized_height == height && p.resized_width == width) return PixelWindow{p.top, p.left, p.height, p.width};
  const auto [row_lo, row_hi] = tap_range(axis_taps(height, p.resized_height, p.top, p.height));
  const auto [col_lo, col_hi] = tap_range(axis_taps(width, p.resized_width, p.left, p.width));
  return PixelWindow{row_lo, col_lo, row_hi - row_lo, col_hi - col_lo};
}

Placement read_and_place(const Dataset& dataset, std::int64_t index, const TransformSpec& spec, core::SampleRng& rng,
                         Sample& sample) {
  std::optional<Placement> placed;
  const SampleOrigin origin = [&] { return dataset.source(index); };
  ReadHint hint;
  hint.min_shorter_side = spec.min_shorter_side();
  hint.window = [&](int height, int width) {
    placed = place_sample(spec, height, width, rng, origin);
    return source_window(*placed, height, width);
  };
  dataset.read(index, hint, sample);
  if (placed) return *placed;
  return place_sample(spec, sample.image.full_height, sample.image.full_width, rng, origin);
}

void render_image(const DecodedImage& image, const Placement& p, std::uint8_t* output) {
  if (p.resized_height == image.full_height && p.resized_width == image.full_width)
    return copy_window(image, p, output);
  switch (image.channels) {
    case 1:
      return resample<1>(image, p, output);
    case 3:
      return resample_rgb(image, p, output);
    default:
      throw DataError("", "images with " + std::to_string(image.channels) + " channels cannot be resized");
  }
}

std::vector<std::int64_t> tensor_output_shape(const TransformSpec& spec, const std::vector<std::int64_t>& shape,
                                              const SampleOrigin& origin) {
  if (spec.resize > 0)
    throw DataError(origin(), "resize applies to images, not to tensor samples (store the array at the size you need)");
  std::vector<std::int64_t> out = shape;
  if ((spec.crop_height > 0 || spec.flip) && shape.size() < (spec.crop_height > 0 ? 2u : 1u))
    throw DataError(origin(), "crop and flip need samples with at least 2 (crop) or 1 (flip) dimensions");
  if (spec.crop_height > 0) {
    const std::int64_t h = shape[shape.size() - 2];
    const std::int64_t w = shape.back();
    if (spec.crop_height > h || spec.crop_width > w) {
      throw DataError(origin(), "samples are " + size_text(static_cast<int>(h), static_cast<int>(w)) +
                                    ", smaller than the crop " + size_text(spec.crop_height, spec.crop_width));
    }
    out[out.size() - 2] = spec.crop_height;
    out.back() = spec.crop_width;
  }
  return out;
}

void render_tensor(const at::Tensor& sample, const Placement& p, at::Tensor& output) {
  const std::size_t element = sample.element_size();
  const auto* src = static_cast<const std::uint8_t*>(sample.data_ptr());
  auto* dst = static_cast<std::uint8_t*>(output.data_ptr());
  if (sample.dim() < 2) {
    const std::size_t n = static_cast<std::size_t>(sample.numel());
    if (!p.flip) {
      std::memcpy(dst, src, n * element);
    } else {
      for (std::size_t i = 0; i < n; ++i) std::memcpy(dst + i * element, src + (n - 1 - i) * element, element);
    }
    return;
  }
  const std::int64_t in_h = sample.size(-2);
  const std::int64_t in_w = sample.size(-1);
  const std::int64_t planes = in_h * in_w == 0 ? 0 : sample.numel() / (in_h * in_w);
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    for (int y = 0; y < p.height; ++y) {
      const std::uint8_t* row = src + ((plane * in_h + p.top + y) * in_w + p.left) * element;
      std::uint8_t* out = dst + ((plane * p.height + y) * p.width) * element;
      if (!p.flip) {
        std::memcpy(out, row, static_cast<std::size_t>(p.width) * element);
      } else {
        for (int x = 0; x < p.width; ++x) std::memcpy(out + x * element, row + (p.width - 1 - x) * element, element);
      }
    }
  }
}

void normalize_bytes(const std::uint8_t* input, float* output, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) output[i] = static_cast<float>(input[i]) / 127.5f - 1.0f;
}

}  // namespace runner::data
