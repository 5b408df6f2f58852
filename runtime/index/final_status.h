// A run's final status in a file reserved when the run starts, for when the index cannot take it (a full disk).
#pragma once

#include <optional>
#include <string>

namespace runner::index {

// The file in the run directory: kFinalStatusBytes of spaces until a status is written into it in place.
inline constexpr const char* kFinalStatusFile = "final-status.json";
inline constexpr std::size_t kFinalStatusBytes = 4096;

struct FinalStatus {
  std::string status;                // a run status other than running
  std::optional<std::string> error;  // cut to fit the file
  double ended_at = 0;               // seconds since the epoch
};

// Creates the blank file (written and fsynced, so its blocks are allocated). Throws IndexError.
void reserve_final_status(const std::string& run_dir);
// Overwrites the reserved file in place, which needs no new disk blocks, and fsyncs it. Throws IndexError
// when the file is missing or cannot be written.
void write_final_status(const std::string& run_dir, const FinalStatus& status);
// The status written into the file; nullopt when the file is missing, blank or not a status.
std::optional<FinalStatus> read_final_status(const std::string& run_dir);

}  // namespace runner::index
