// The built-in datasets: image folders, CIFAR-10, MNIST, .npy arrays and procedural shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/data/dataset.h"

namespace runner::data {

// JPEG and PNG files under `root`, recursively, in sorted path order. With `labels`, the class of an image
// is the name of the first-level subfolder it is in (classes sorted by name, ids from 0), as torchvision's
// ImageFolder; files directly in `root` are then ignored. Throws DataError for a missing or empty folder.
std::shared_ptr<const Dataset> open_image_folder(const std::string& root, bool labels);

// The binary version of CIFAR-10 ("cifar-10-batches-bin"): data_batch_1..5.bin for `train`, else test_batch.bin.
std::shared_ptr<const Dataset> open_cifar10(const std::string& directory, bool train);
// Validates one CIFAR-10 binary batch (records of 1 label byte + 3072 pixel bytes); returns the record count.
std::int64_t parse_cifar10_batch(const std::uint8_t* data, std::size_t size, const std::string& origin);

// MNIST IDX files in `directory`: train-images-idx3-ubyte / train-labels-idx1-ubyte (or t10k-* for test).
std::shared_ptr<const Dataset> open_mnist(const std::string& directory, bool train);

struct IdxHeader {
  int type_code = 0;  // 0x08 ubyte, 0x09 byte, 0x0B short, 0x0C int, 0x0D float, 0x0E double
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;
};
// Parses and validates an IDX file image (big-endian dims, data size matching the shape exactly).
IdxHeader parse_idx_header(const std::uint8_t* data, std::size_t size, const std::string& origin);

// A memory-mapped .npy array of shape [N, ...] with optional integer labels .npy of shape [N].
std::shared_ptr<const Dataset> open_npy(const std::string& path, const std::string& labels_path,
                                        const std::vector<std::string>& classes = {});

// VAE latents written by `runner data encode` (an .npy [N, F, 2, C, h, w] of posterior means and
// log-variances for F = 1 or 2 flips, with its manifest <stem>.json, labels <stem>.labels.npy and class names
// <stem>.classes.json beside it when labelled). Each read draws one latent from the sample's keyed stream:
// a flip (when there are two), then scale * (mean + exp(logvar / 2) * noise - shift), float32 [C, h, w].
// `scale` <= 0 takes the VAE's scaling factor from the manifest.
std::shared_ptr<const Dataset> open_latents(const std::string& path, double scale = 0);
// The manifest beside such latents (<stem>.json): source, preprocessing, flip, vae {path, sha256, ...}, ...
nlohmann::json latents_manifest(const std::string& path);

// Procedural images: one circle, square or triangle (label 0, 1, 2) in a random colour on a plain
// background of another colour, at random position, size and rotation; deterministic in (seed, index).
// `colours` false draws white shapes on black, `rotate` false upright ones (axis-aligned squares,
// triangles pointing up); either way an index keeps its class, place and size.
struct ShapesOptions {
  int size = 32;  // images are size x size (4..4096)
  std::int64_t count = 10000;
  std::uint64_t seed = 0;
  bool colours = true;
  bool rotate = true;
};
std::shared_ptr<const Dataset> make_shapes(const ShapesOptions& options);

}  // namespace runner::data
