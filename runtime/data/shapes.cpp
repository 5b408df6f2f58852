// The procedural shapes dataset: antialiased circles, squares and triangles, deterministic in (seed, index).
#include <cmath>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/core/sample_rng.h"

namespace runner::data {
namespace {

constexpr std::uint64_t kShapesStream = 0x5348415045ull;
constexpr int kSubsamples = 4;  // per axis

enum ShapeClass { kCircle = 0, kSquare = 1, kTriangle = 2 };

struct Shape {
  int type;
  double cx, cy, radius, angle;
  double cos_a, sin_a;
  // Triangle edges as (nx, ny, offset): inside when nx*x + ny*y <= offset for all three.
  double edges[3][3];

  bool contains(double x, double y) const {
    const double dx = x - cx;
    const double dy = y - cy;
    switch (type) {
      case kCircle:
        return dx * dx + dy * dy <= radius * radius;
      case kSquare: {
        const double u = cos_a * dx + sin_a * dy;
        const double v = -sin_a * dx + cos_a * dy;
        const double half = radius * 0.8;
        return std::abs(u) <= half && std::abs(v) <= half;
      }
      default:
        for (const auto& edge : edges) {
          if (edge[0] * dx + edge[1] * dy > edge[2]) return false;
        }
        return true;
    }
  }
};

class ShapesDataset final : public Dataset {
 public:
  explicit ShapesDataset(const ShapesOptions& options)
      : size_(options.size), count_(options.count), seed_(options.seed), options_(options) {
    if (size_ < 4 || size_ > 4096) throw DataError("", "shapes: size must be in 4..4096, got " + std::to_string(size_));
    if (count_ < 1) throw DataError("", "shapes: count must be positive, got " + std::to_string(count_));
  }

  std::int64_t size() const override { return count_; }
  SampleKind kind() const override { return SampleKind::image; }
  std::string describe() const override {
    return "shapes " + std::to_string(size_) + "x" + std::to_string(size_) + ": " + std::to_string(count_) +
           " images, 3 classes" + (options_.colours ? "" : ", white on black") + (options_.rotate ? "" : ", upright");
  }
  std::vector<std::string> classes() const override { return {"circle", "square", "triangle"}; }

  void read(std::int64_t index, const ReadHint&, Sample& out) const override {
    core::SampleRng rng(seed_, kShapesStream, static_cast<std::uint64_t>(index));
    Shape shape{};
    shape.type = static_cast<int>(rng.below(3));
    std::uint8_t background[3];
    std::uint8_t foreground[3];
    for (auto& c : background) c = static_cast<std::uint8_t>(rng.below(256));
    do {
      for (auto& c : foreground) c = static_cast<std::uint8_t>(rng.below(256));
    } while (colour_distance(background, foreground) < 120.0);
    if (!options_.colours) {
      for (auto& c : background) c = 0;
      for (auto& c : foreground) c = 255;
    }
    const double n = size_;
    shape.radius = n * (0.18 + 0.14 * rng.uniform());
    shape.cx = shape.radius + rng.uniform() * (n - 2 * shape.radius);
    shape.cy = shape.radius + rng.uniform() * (n - 2 * shape.radius);
    shape.angle = rng.uniform() * 2 * M_PI;
    // Upright: a square's sides and a triangle's base horizontal, the triangle pointing up (image y grows down).
    if (!options_.rotate) shape.angle = shape.type == kTriangle ? M_PI / 6 : 0.0;
    shape.cos_a = std::cos(shape.angle);
    shape.sin_a = std::sin(shape.angle);
    for (int k = 0; k < 3; ++k) {
      // Outward normal of edge k of an equilateral triangle with circumradius `radius`: inradius = radius / 2.
      const double normal_angle = shape.angle + M_PI / 3 + k * 2 * M_PI / 3;
      shape.edges[k][0] = std::cos(normal_angle);
      shape.edges[k][1] = std::sin(normal_angle);
      shape.edges[k][2] = shape.radius * 0.5;
    }
    if (shape.type == kTriangle) {
      // A triangle of the same circumradius looks small next to the others; enlarge it a little.
      for (auto& edge : shape.edges) edge[2] *= 1.25;
    }

    out.label = shape.type;
    out.image.resize(size_, size_, 3);
    std::uint8_t* pixels = out.image.pixels.data();
    const double reach = shape.radius * 1.6;
    for (int y = 0; y < size_; ++y) {
      for (int x = 0; x < size_; ++x) {
        int covered = 0;
        if (std::abs(x + 0.5 - shape.cx) <= reach && std::abs(y + 0.5 - shape.cy) <= reach) {
          for (int sy = 0; sy < kSubsamples; ++sy) {
            for (int sx = 0; sx < kSubsamples; ++sx) {
              covered += shape.contains(x + (sx + 0.5) / kSubsamples, y + (sy + 0.5) / kSubsamples);
            }
          }
        }
        std::uint8_t* pixel = pixels + (static_cast<std::size_t>(y) * size_ + x) * 3;
        for (int c = 0; c < 3; ++c) {
          constexpr int total = kSubsamples * kSubsamples;
          pixel[c] = static_cast<std::uint8_t>(
              (background[c] * (total - covered) + foreground[c] * covered + total / 2) / total);
        }
      }
    }
  }
  std::string source(std::int64_t index) const override { return "shapes image " + std::to_string(index); }

 private:
  static double colour_distance(const std::uint8_t* a, const std::uint8_t* b) {
    double sum = 0;
    for (int c = 0; c < 3; ++c) sum += (a[c] - b[c]) * (a[c] - b[c]);
    return std::sqrt(sum);
  }

  int size_;
  std::int64_t count_;
  std::uint64_t seed_;
  ShapesOptions options_;
};

}  // namespace

std::shared_ptr<const Dataset> make_shapes(const ShapesOptions& options) {
  return std::make_shared<ShapesDataset>(options);
}

}  // namespace runner::data
