// `runner data pack`: an image folder into a memory-mappable uint8 .npy, decoded by worker threads.
#include "runtime/data/pack.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "runtime/core/atomic_file.h"
#include "runtime/core/interrupt.h"
#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/mapped_file.h"
#include "runtime/data/npy.h"
#include "runtime/data/transform.h"

namespace runner::data {
namespace {

namespace fs = std::filesystem;

bool has_loose_images(const std::string& root) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    std::string extension = entry.path().extension().string();
    for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (entry.is_regular_file() && (extension == ".jpg" || extension == ".jpeg" || extension == ".png")) return true;
  }
  return false;
}

bool has_subfolders(const std::string& root) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    if (entry.is_directory() && entry.path().filename().string()[0] != '.') return true;
  }
  return false;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  core::AtomicFileWriter file(path);
  file.write(text.data(), text.size(), "the text");
  file.commit();
}

}  // namespace

std::string sibling_path(const std::string& npy_path, const std::string& suffix) {
  fs::path path(npy_path);
  const std::string stem = path.extension() == ".npy" ? path.stem().string() : path.filename().string();
  return (path.parent_path() / (stem + suffix)).string();
}

bool labelled_by_subfolders(const std::string& root) { return has_subfolders(root) && !has_loose_images(root); }

PackResult pack_image_folder(const std::string& root, const std::string& out_path, const PackOptions& options) {
  if (options.size < 1) throw DataError("", "pack: --size must be positive");
  std::error_code error;
  if (!fs::is_directory(root, error)) throw DataError(root, "no such directory");
  const bool labelled =
      options.labels == PackLabels::yes || (options.labels == PackLabels::automatic && labelled_by_subfolders(root));
  const std::shared_ptr<const Dataset> dataset = open_image_folder(root, labelled);
  const std::int64_t total = dataset->size();

  TransformSpec spec;
  spec.resize = options.size;
  spec.crop_height = spec.crop_width = options.size;
  spec.fast_decode = options.fast_decode;
  spec.normalize = false;
  const std::vector<std::int64_t> row_shape{3, options.size, options.size};
  const std::uint64_t row_bytes = 3ull * options.size * options.size;
  // The header is sized for all rows; when bad images are skipped it is rewritten with the same length.
  const std::string header = npy_header_bytes(at::kByte, {total, 3, options.size, options.size});

  core::AtomicFileWriter file(out_path);
  file.resize(header.size() + row_bytes * static_cast<std::uint64_t>(total));

  std::atomic<std::int64_t> next{0};
  std::atomic<std::int64_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::exception_ptr first_error;
  std::vector<std::int64_t> labels(static_cast<std::size_t>(total), -1);
  std::vector<char> ok(static_cast<std::size_t>(total), 0);
  std::vector<SkippedSample> skipped;

  auto work = [&] {
    Sample sample;
    std::vector<std::uint8_t> row(row_bytes);
    core::SampleRng unused(0, 0, 0);  // a center crop draws nothing
    while (!failed) {
      const std::int64_t index = next++;
      if (index >= total) return;
      try {
        const Placement placement = read_and_place(*dataset, index, spec, unused, sample);
        render_image(sample.image, placement, row.data());
        file.write_at(header.size() + row_bytes * static_cast<std::uint64_t>(index), row.data(), row_bytes, "a row");
        labels[static_cast<std::size_t>(index)] = sample.label;
        ok[static_cast<std::size_t>(index)] = 1;
      } catch (const DataError& bad) {
        std::lock_guard lock(mutex);
        if (options.skip_bad) {
          skipped.push_back(SkippedSample{bad.path, bad.what()});
        } else if (!first_error) {
          first_error = std::current_exception();
          failed = true;
        }
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!first_error) first_error = std::current_exception();
        failed = true;
      }
      ++done;
    }
  };

  const int workers =
      options.workers > 0 ? options.workers : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (int i = 0; i < workers; ++i) threads.emplace_back(work);
  while (done < total && !failed) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    if (core::interrupt_requested()) failed = true;
    if (options.progress) options.progress(done, total);
  }
  for (std::thread& thread : threads) thread.join();
  if (first_error) std::rethrow_exception(first_error);
  if (core::interrupt_requested()) throw core::Interrupted();
  if (options.progress) options.progress(done, total);

  // Close the gaps left by skipped images, keeping the order.
  std::int64_t kept = 0;
  std::vector<std::uint8_t> row(row_bytes);
  std::vector<std::int64_t> kept_labels;
  if (!skipped.empty()) {
    const MappedFile written(file.temporary_path());
    for (std::int64_t index = 0; index < total; ++index) {
      if (!ok[static_cast<std::size_t>(index)]) continue;
      if (kept != index) {
        std::copy_n(written.data() + header.size() + row_bytes * static_cast<std::uint64_t>(index), row_bytes,
                    row.data());
        file.write_at(header.size() + row_bytes * static_cast<std::uint64_t>(kept), row.data(), row_bytes, "a row");
      }
      kept_labels.push_back(labels[static_cast<std::size_t>(index)]);
      ++kept;
    }
    if (kept == 0) throw DataError(root, "every image was bad; nothing to pack");
    file.resize(header.size() + row_bytes * static_cast<std::uint64_t>(kept));
  } else {
    kept = total;
    kept_labels = labels;
  }
  const std::string final_header = npy_header_bytes(at::kByte, {kept, 3, options.size, options.size}, header.size());
  file.write_at(0, final_header.data(), final_header.size(), "the header");

  PackResult result;
  result.images = kept;
  result.skipped = std::move(skipped);
  if (labelled) {
    result.classes = dataset->classes();
    result.labels_path = sibling_path(out_path, ".labels.npy");
    result.classes_path = sibling_path(out_path, ".classes.json");
    save_npy(result.labels_path, at::tensor(kept_labels, at::kLong));
    write_text_atomically(result.classes_path, nlohmann::json(result.classes).dump(1) + "\n");
  }
  file.commit();
  return result;
}

std::vector<std::string> read_class_names(const std::string& json_path) {
  const std::string text = read_file_bytes(json_path);
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw DataError(json_path, std::string("not valid JSON: ") + error.what());
  }
  if (!value.is_array()) throw DataError(json_path, "expected a JSON list of class names");
  std::vector<std::string> names;
  for (const auto& item : value) {
    if (!item.is_string()) throw DataError(json_path, "expected a JSON list of class names");
    names.push_back(item.get<std::string>());
  }
  return names;
}

}  // namespace runner::data
