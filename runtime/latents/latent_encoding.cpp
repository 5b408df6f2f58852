// Encoding a dataset's images into VAE posteriors: loader batches through the encoder into a resumable .npy.
#include "runtime/latents/latent_encoding.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "runtime/core/atomic_file.h"
#include "runtime/core/device.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/sha256.h"
#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/loader.h"
#include "runtime/data/mapped_file.h"
#include "runtime/data/npy.h"
#include "runtime/data/pack.h"
#include "runtime/nn/autoencoder_kl.h"

namespace runner::latents {
namespace {

namespace fs = std::filesystem;

// A file written in place at offsets and synced: the partial array and labels that survive a crash.
class PartialFile {
 public:
  PartialFile(std::string path, bool keep) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (keep ? 0 : O_TRUNC), 0644);
    if (fd_ < 0) fail("cannot open");
  }
  ~PartialFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;
  std::uint64_t size() const {
    struct stat info {};
    return ::fstat(fd_, &info) == 0 ? static_cast<std::uint64_t>(info.st_size) : 0;
  }
  void resize(std::uint64_t bytes) {
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) fail("cannot resize");
  }
  void write_at(std::uint64_t offset, const void* data, std::uint64_t bytes) {
    const char* at = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pwrite(fd_, at, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot write");
      at += n, offset += static_cast<std::uint64_t>(n), bytes -= static_cast<std::uint64_t>(n);
    }
  }
  void sync() {
    if (::fdatasync(fd_) != 0) fail("cannot sync");
  }
  // Syncs, closes and renames over `target`, then syncs the directory.
  void publish(const std::string& target) {
    sync();
    ::close(fd_);
    fd_ = -1;
    if (::rename(path_.c_str(), target.c_str()) != 0) fail("cannot rename to " + target);
    const std::string directory =
        fs::path(target).parent_path().empty() ? "." : fs::path(target).parent_path().string();
    const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(fmt::format("{}: {}: {}", path_, what, std::strerror(errno)));
  }
  std::string path_;
  int fd_ = -1;
};

void write_text_atomically(const std::string& path, const std::string& text) {
  core::AtomicFileWriter file(path);
  file.write(text.data(), text.size(), "the text");
  file.commit();
}

struct Source {
  std::shared_ptr<const data::Dataset> dataset;
  data::TransformSpec transform;
  int side = 0;
  std::string description;  // the preprocessing, for the manifest
};

Source open_source(const std::string& source, int size) {
  Source result;
  std::error_code error;
  if (fs::is_directory(source, error)) {
    if (size < 1)
      throw std::invalid_argument(
          "encode: an image folder needs --size N (shorter side resized to N, center crop N x N)");
    result.dataset = data::open_image_folder(source, data::labelled_by_subfolders(source));
    result.transform.resize = size;
    result.transform.crop_height = result.transform.crop_width = size;
    result.transform.fast_decode = false;
    result.side = size;
    result.description = fmt::format(
        "shorter side resized to {} (antialiased bilinear, as `runner data pack`), center crop "
        "{}x{}, values v/127.5 - 1",
        size, size, size);
    return result;
  }
  if (!fs::exists(source, error)) throw data::DataError(source, "no such folder or file");
  const std::string labels = data::sibling_path(source, ".labels.npy");
  const std::string classes = data::sibling_path(source, ".classes.json");
  result.dataset = data::open_npy(source, fs::exists(labels) ? labels : "",
                                  fs::exists(classes) ? data::read_class_names(classes) : std::vector<std::string>{});
  const data::NpyArray array(source);
  const auto& shape = array.header().shape;
  if (array.header().dtype != at::kByte || shape.size() != 4 || shape[2] != shape[3])
    throw data::DataError(source, "expected a packed uint8 array [N, C, S, S] (`runner data pack`), got " +
                                      std::string(c10::toString(array.header().dtype)) + " with " +
                                      std::to_string(shape.size()) + " dimensions");
  if (size > 0 && shape[2] != size)
    throw std::invalid_argument(
        fmt::format("encode: {} holds {}x{} images, not --size {}", source, shape[2], shape[3], size));
  result.side = static_cast<int>(shape[2]);
  result.description = fmt::format("{} as packed ({}x{}), values v/127.5 - 1", source, shape[2], shape[3]);
  return result;
}

}  // namespace

EncodeResult encode_latents(const std::string& source_path, const std::string& out_path, const EncodeOptions& options) {
  if (options.batch < 1) throw std::invalid_argument("encode: --batch must be positive");
  const Source source = open_source(source_path, options.size);
  const c10::Device device = core::parse_device(options.device);
  nn::LoadedAutoencoder loaded = nn::load_autoencoder_kl(options.vae);
  nn::AutoencoderKL& vae = loaded.model;
  const nn::AutoencoderKLOptions& vae_options = vae->options();
  const std::int64_t f = vae->downsample();
  if (source.side % f != 0)
    throw std::invalid_argument(
        fmt::format("encode: the image side {} is not a multiple of the VAE's downsampling {}", source.side, f));
  vae->to(device);

  const std::int64_t total = source.dataset->size();
  if (total == 0) throw data::DataError(source_path, "has no images to encode");
  const std::int64_t flips = options.flip ? 2 : 1;
  const std::int64_t c = vae_options.latent_channels, h = source.side / f;
  const std::vector<std::int64_t> shape{total, flips, 2, c, h, h};
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(flips * 2 * c * h * h) * sizeof(float);

  nlohmann::json vae_entry = {{"path", fs::absolute(loaded.weights_path).string()},
                              {"sha256", core::sha256_file(loaded.weights_path)},
                              {"scaling_factor", vae_options.scaling_factor},
                              {"latent_channels", c},
                              {"downsample", f}};
  vae_entry["shift_factor"] =
      vae_options.shift_factor ? nlohmann::json(*vae_options.shift_factor) : nlohmann::json(nullptr);
  nlohmann::json manifest = {{"format", "runner latents"},
                             {"version", 1},
                             {"source", fs::absolute(source_path).string()},
                             {"images", total},
                             {"preprocessing", source.description},
                             {"flip", options.flip},
                             {"layout", "[images, flips, (mean, logvar), channels, height, width]"},
                             {"shape", shape},
                             {"dtype", "float32"},
                             {"vae", vae_entry},
                             {"labels", source.dataset->has_labels()}};

  const std::string partial_path = out_path + ".partial";
  const std::string labels_partial_path = out_path + ".labels.partial";
  const std::string progress_path = out_path + ".progress.json";
  const std::string header = data::npy_header_bytes(at::kFloat, shape);
  const std::uint64_t expected_size = header.size() + row_bytes * static_cast<std::uint64_t>(total);

  // Continue an interrupted encoding of the same source, preprocessing and VAE.
  std::int64_t done = 0;
  std::error_code error;
  if (fs::exists(progress_path, error) && fs::exists(partial_path, error) && fs::exists(labels_partial_path, error)) {
    try {
      const nlohmann::json progress = nlohmann::json::parse(data::read_file_bytes(progress_path));
      if (progress.at("manifest") == manifest && fs::file_size(partial_path) == expected_size)
        done = progress.at("images").get<std::int64_t>();
    } catch (const std::exception&) {
      done = 0;
    }
  }
  const bool resuming = done > 0;
  PartialFile array(partial_path, resuming);
  PartialFile labels(labels_partial_path, resuming);
  if (!resuming) {
    array.resize(expected_size);
    array.write_at(0, header.data(), header.size());
    labels.resize(static_cast<std::uint64_t>(total) * sizeof(std::int64_t));
  }

  data::LoaderOptions loader_options;
  loader_options.batch = options.batch;
  loader_options.shuffle = false;
  loader_options.drop_last = false;
  loader_options.workers = options.workers;
  loader_options.rank = 0;
  loader_options.world_size = 1;
  loader_options.device = device;
  loader_options.transform = source.transform;
  data::Loader loader(source.dataset, loader_options);
  loader.seek(done / options.batch);
  loader.set_end(loader.batches_per_epoch());

  at::NoGradGuard no_grad;
  vae->eval();
  EncodeResult result;
  result.resumed_from = done;
  if (options.progress) options.progress(done, total);
  while (done < total) {
    if (core::interrupt_requested()) throw core::Interrupted();
    const data::Batch batch = loader.next();
    const at::Tensor images = batch.data.to(at::kFloat);
    std::vector<at::Tensor> variants;
    for (std::int64_t flip = 0; flip < flips; ++flip) {
      auto [mean, logvar] = vae->encode(flip ? images.flip({3}) : images);
      variants.push_back(at::stack({mean, logvar}, 1));  // [B, 2, C, h, w]
    }
    const at::Tensor rows = at::stack(variants, 1).to(at::kCPU).contiguous();  // [B, F, 2, C, h, w]
    const std::int64_t first = batch.index[0].item<std::int64_t>();
    const std::int64_t count = rows.size(0);
    array.write_at(header.size() + row_bytes * static_cast<std::uint64_t>(first), rows.data_ptr<float>(),
                   row_bytes * static_cast<std::uint64_t>(count));
    if (batch.label.defined()) {
      const at::Tensor ids = batch.label.to(at::kCPU).to(at::kLong).contiguous();
      labels.write_at(static_cast<std::uint64_t>(first) * sizeof(std::int64_t), ids.data_ptr<std::int64_t>(),
                      static_cast<std::uint64_t>(count) * sizeof(std::int64_t));
    }
    array.sync();
    labels.sync();
    done = first + count;
    write_text_atomically(progress_path, nlohmann::json{{"images", done}, {"manifest", manifest}}.dump() + "\n");
    if (options.progress) options.progress(done, total);
  }

  result.images = total;
  if (source.dataset->has_labels()) {
    result.labels_path = data::sibling_path(out_path, ".labels.npy");
    const data::MappedFile written(labels_partial_path);
    at::Tensor ids = at::empty({total}, at::kLong);
    std::memcpy(ids.data_ptr<std::int64_t>(), written.data(), static_cast<std::size_t>(total) * sizeof(std::int64_t));
    data::save_npy(result.labels_path, ids);
    if (!source.dataset->classes().empty()) {
      result.classes_path = data::sibling_path(out_path, ".classes.json");
      write_text_atomically(result.classes_path, nlohmann::json(source.dataset->classes()).dump(1) + "\n");
    }
  }
  result.manifest_path = data::sibling_path(out_path, ".json");
  write_text_atomically(result.manifest_path, manifest.dump(2) + "\n");
  array.publish(out_path);
  fs::remove(labels_partial_path, error);
  fs::remove(progress_path, error);
  return result;
}

}  // namespace runner::latents
