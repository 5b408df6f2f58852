// Fresh temporary directories for the C++ tests, deleted with their contents when the test ends.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace runner::testing {

// Not std::filesystem::remove_all: libtorch.so exports its own copy, which calls a libstdc++ symbol missing
// from the system library and crashes.
inline void remove_tree(const std::filesystem::path& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(std::filesystem::symlink_status(path, ignored))) {
    for (const auto& entry : std::filesystem::directory_iterator(path, ignored)) remove_tree(entry.path());
  }
  std::filesystem::remove(path, ignored);
}

// A new directory <RUNNER_TEST_TMP or /tmp>/<prefix>-XXXXXX.
struct TempDir {
  std::string path;

  explicit TempDir(const std::string& prefix = "runner-test") {
    const char* base = std::getenv("RUNNER_TEST_TMP");
    const std::string root = base && *base ? base : "/tmp";
    std::filesystem::create_directories(root);
    std::string pattern = root + "/" + prefix + "-XXXXXX";
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed under " + root);
    path = pattern;
  }
  ~TempDir() { remove_tree(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return path + "/" + name; }
  // The names in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

}  // namespace runner::testing
