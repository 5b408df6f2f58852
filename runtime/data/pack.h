// `runner data pack`: preprocess an image folder into a uint8 .npy array [N, 3, S, S] (resize the shorter
// side, center crop) with labels and class names beside it, for memory-mapped training.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/data/loader.h"

namespace runner::data {

enum class PackLabels { automatic, yes, no };

struct PackOptions {
  int size = 64;
  int workers = 0;                            // 0: all cores
  PackLabels labels = PackLabels::automatic;  // automatic: when the folder has class subfolders and no loose images
  bool skip_bad = false;
  bool fast_decode = false;
  // Called from the calling thread about four times a second and once at the end.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
};

struct PackResult {
  std::int64_t images = 0;  // rows written
  std::vector<SkippedSample> skipped;
  std::vector<std::string> classes;
  std::string labels_path;   // "<out stem>.labels.npy" when labelled
  std::string classes_path;  // "<out stem>.classes.json" when labelled
};

// Writes out_path (and the label files) atomically: on error nothing is left behind.
PackResult pack_image_folder(const std::string& root, const std::string& out_path, const PackOptions& options);

// "<dir>/<stem><suffix>" for "<dir>/<stem>.npy": the files written beside an array (".labels.npy", ".json").
std::string sibling_path(const std::string& npy_path, const std::string& suffix);

// The automatic labelling rule: class subfolders and no loose images.
bool labelled_by_subfolders(const std::string& root);

// The JSON list of class names written beside a packed array.
std::vector<std::string> read_class_names(const std::string& json_path);

}  // namespace runner::data
