// The image-folder dataset: JPEG and PNG files found recursively, labelled by first-level subfolder.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <system_error>
#include <utility>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/mapped_file.h"

namespace runner::data {
namespace {

namespace fs = std::filesystem;

bool is_image_file(const fs::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jpg" || extension == ".jpeg" || extension == ".png";
}

bool is_hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

// Image files under `directory` in the order of Python's sorted(os.walk(...)) with sorted file names.
std::vector<std::string> find_images(const fs::path& directory) {
  std::vector<std::pair<std::string, std::string>> found;  // (parent directory, file name)
  std::error_code error;
  fs::recursive_directory_iterator it(directory, fs::directory_options::follow_directory_symlink, error);
  if (error) throw DataError(directory.string(), "cannot list: " + error.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (error) throw DataError(directory.string(), "cannot list: " + error.message());
    const fs::path& path = it->path();
    if (is_hidden(path)) {
      if (it->is_directory(error)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(error) && is_image_file(path))
      found.emplace_back(path.parent_path().string(), path.filename().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (const auto& [parent, name] : found) paths.push_back((fs::path(parent) / name).string());
  return paths;
}

class ImageFolderDataset final : public Dataset {
 public:
  ImageFolderDataset(std::string root, bool labels) : root_(std::move(root)) {
    std::error_code error;
    if (!fs::exists(root_, error)) throw DataError(root_, "no such directory");
    if (!fs::is_directory(root_, error)) throw DataError(root_, "not a directory");
    if (labels) {
      std::vector<std::string> class_dirs;
      for (const fs::directory_entry& entry : fs::directory_iterator(root_, error)) {
        if (entry.is_directory() && !is_hidden(entry.path())) class_dirs.push_back(entry.path().filename().string());
      }
      std::sort(class_dirs.begin(), class_dirs.end());
      if (class_dirs.empty())
        throw DataError(root_, "has no class subfolders (labels = true takes classes from subfolder names)");
      for (std::size_t id = 0; id < class_dirs.size(); ++id) {
        const std::vector<std::string> images = find_images(fs::path(root_) / class_dirs[id]);
        if (images.empty())
          throw DataError((fs::path(root_) / class_dirs[id]).string(), "class folder has no .jpg, .jpeg or .png files");
        paths_.insert(paths_.end(), images.begin(), images.end());
        labels_.insert(labels_.end(), images.size(), static_cast<std::int32_t>(id));
      }
      classes_ = std::move(class_dirs);
    } else {
      paths_ = find_images(root_);
    }
    if (paths_.empty()) throw DataError(root_, "no .jpg, .jpeg or .png files found");
  }

  std::int64_t size() const override { return static_cast<std::int64_t>(paths_.size()); }
  SampleKind kind() const override { return SampleKind::image; }
  std::string describe() const override {
    std::string text = "image_folder " + root_ + ": " + std::to_string(paths_.size()) + " images";
    if (!classes_.empty()) text += ", " + std::to_string(classes_.size()) + " classes";
    return text;
  }
  std::vector<std::string> classes() const override { return classes_; }
  void read(std::int64_t index, const ReadHint& hint, Sample& out) const override {
    const std::string& path = paths_[static_cast<std::size_t>(index)];
    const std::string bytes = read_file_bytes(path);
    decode_image(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), path, out.image, hint);
    out.label = labels_.empty() ? -1 : labels_[static_cast<std::size_t>(index)];
  }
  std::string source(std::int64_t index) const override { return paths_[static_cast<std::size_t>(index)]; }

 private:
  std::string root_;
  std::vector<std::string> paths_;
  std::vector<std::int32_t> labels_;
  std::vector<std::string> classes_;
};

}  // namespace

std::shared_ptr<const Dataset> open_image_folder(const std::string& root, bool labels) {
  return std::make_shared<ImageFolderDataset>(root, labels);
}

}  // namespace runner::data
