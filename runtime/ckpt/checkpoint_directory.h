// Checkpoint directories: <run dir>/checkpoints/step-<N>/ with safetensors files and a manifest, written
// through a partial directory and one rename, and verified against the recorded size and sha256 of each file.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/ckpt/safetensors.h"

namespace runner::ckpt {

// One file of a checkpoint, e.g. "model.safetensors", "ema.safetensors", "state.safetensors".
struct CheckpointFileContent {
  std::string name;  // a plain file name: letters, digits, '_', '-', '.'
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  // When set, gives the path of a complete file another process wrote (staged_files.h), waiting for it: moved
  // into the checkpoint under `name` instead of writing `tensors`.
  std::function<std::string()> staged;
};

struct CheckpointFileRecord {
  std::string name;
  int64_t bytes = 0;
  std::string sha256;
};

struct WrittenCheckpoint {
  std::string path;                         // relative to the run directory: "checkpoints/step-0000100"
  int64_t bytes = 0;                        // all files, manifest included
  std::string sha256;                       // of manifest.json, which lists every file's size and sha256
  std::vector<CheckpointFileRecord> files;  // manifest.json last
};

// Thrown when a checkpoint cannot be written; what() names the path and the cause (a full disk included).
// Nothing is left at the final path when it is thrown, and an earlier checkpoint of the same step is intact.
struct CheckpointWriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "checkpoints/step-0000100" for step 100 (7 digits, more when needed).
std::string checkpoint_path(int64_t step);

// Writes each file (fsynced) into <run_dir>/checkpoints/.partial-<step>-<pid>/, hashes them, writes
// manifest.json ({"step", "files": [{name, bytes, sha256}], plus `manifest_extra`}), fsyncs the directory,
// then renames it to checkpoints/step-<N> (an existing one of that step is replaced only now) and fsyncs
// the parent. The caller records the result in the index after this returns. `before_publish`, when given, runs just
// before the rename (the process checks there that the run, and its sweep trial, are still its own:
// index/writer_fence.h).
WrittenCheckpoint write_checkpoint(const std::string& run_dir, int64_t step,
                                   const std::vector<CheckpointFileContent>& files,
                                   const nlohmann::json& manifest_extra = nlohmann::json::object(),
                                   const std::function<void()>& before_publish = {});

// Leftovers of checkpoint writers that died mid-write (kill -9, power loss) in <run_dir>/checkpoints.
struct StaleWrites {
  std::vector<std::string> removed;    // .partial-<step>-<pid> and .staged-<step>-<pid> directories (and superseded
                                       // .replaced-*)
  std::vector<std::string> recovered;  // .replaced-* moved back to step-<N>: its replacement never arrived
  uint64_t bytes = 0;                  // freed
};
// Finds (dry_run) or cleans the leftovers of every writer but this process. Call it only for a run that no
// other live process writes (its own restore, `runner gc` for runs that are not running). Paths are
// relative to the run directory.
StaleWrites clean_stale_writes(const std::string& run_dir, bool dry_run = false);

// Checks every file of a checkpoint against its record: returns the problems found, each naming the file
// ("model.safetensors: missing", "... : 1200 bytes, expected 4096 (truncated?)", "...: sha256 differs
// (damaged)"); empty when the checkpoint is good.
std::vector<std::string> verify_checkpoint(const std::string& run_dir, const std::string& path,
                                           const std::vector<CheckpointFileRecord>& expected);

}  // namespace runner::ckpt
