// The error every dataset, decoder and parser throws: a message that names the file, and the file itself.
#pragma once

#include <stdexcept>
#include <string>

namespace runner::data {

// `path` is the file at fault (for counting and reporting skipped samples); what() starts with it.
struct DataError : std::runtime_error {
  DataError(std::string path_, const std::string& message)
      : std::runtime_error(path_.empty() ? message : path_ + ": " + message), path(std::move(path_)) {}
  std::string path;
};

}  // namespace runner::data
