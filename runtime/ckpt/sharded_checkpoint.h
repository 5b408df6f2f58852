// Checkpoint files split by rows over the ranks that saved them (sharded data parallel): rank r's rows of every
// tensor of those files in shard-<r>-of-<N>.safetensors (as "<file stem>/<tensor>"), and in the checkpoint's
// manifest ("shards") each file's metadata and each tensor's global shape and the rows every rank holds. Read back
// by intersecting row ranges, as PyTorch's distributed checkpoint does, so any world size can restore them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/ckpt/safetensors.h"

namespace runner::ckpt {

struct ShardRows {
  std::int64_t begin = 0, end = 0;
};

struct ShardedTensor {
  std::string name;                 // as in the unsharded file
  std::vector<std::int64_t> shape;  // the whole tensor's
  // Per rank, the rows of the first dimension (one row for a 0-dim tensor) its file holds, in rank order and
  // adjacent; a tensor that is not split has one entry: rank 0 holds all of it.
  std::vector<ShardRows> rows;
};

struct ShardedFile {
  std::string name;  // the unsharded file it stands for: "optimizer.safetensors", "ema.safetensors"
  std::map<std::string, std::string> metadata;
  std::vector<ShardedTensor> tensors;
};

struct ShardLayout {
  int ranks = 1;
  std::vector<ShardedFile> files;
};

// "shard-1-of-4.safetensors"
std::string shard_file_name(int rank, int ranks);
// The name of a tensor of `file` inside a rank's shard file: "optimizer/group0.param3.exp_avg".
std::string shard_tensor_name(const std::string& file, const std::string& tensor);

nlohmann::json shard_layout_json(const ShardLayout& layout);
// std::invalid_argument starting with `origin` for anything malformed (rows that do not tile a tensor included).
ShardLayout parse_shard_layout(const nlohmann::json& value, const std::string& origin);

// A sharded checkpoint being read.
class ShardedCheckpoint {
 public:
  // nullopt when the checkpoint in `directory` is not sharded (no manifest.json, or one without "shards"). Throws
  // std::invalid_argument naming the file when the manifest is malformed or a rank's shard file is missing.
  static std::optional<ShardedCheckpoint> open(const std::string& directory);

  const std::string& directory() const { return directory_; }
  const ShardLayout& layout() const { return layout_; }
  const ShardedFile* file(const std::string& name) const;  // nullptr when it is not one of the split files
  // Rows [begin, end) of `tensor` of `file`, read from the rank files that hold them (a 0-dim tensor counts as one
  // row: shape [1] or [0]); read() gives the whole tensor in its shape. std::invalid_argument naming the checkpoint
  // for rows out of range or a rank file that does not hold what the manifest says.
  at::Tensor read_rows(const ShardedFile& file, const ShardedTensor& tensor, std::int64_t begin,
                       std::int64_t end) const;
  at::Tensor read(const ShardedFile& file, const ShardedTensor& tensor) const;
  at::ScalarType dtype(const ShardedFile& file, const ShardedTensor& tensor) const;

 private:
  ShardedCheckpoint(std::string directory, ShardLayout layout);
  const SafetensorsFile& rank_file(int rank) const;

  std::string directory_;
  ShardLayout layout_;
  mutable std::vector<std::unique_ptr<SafetensorsFile>> rank_files_;  // opened when first read
};

// A file of a checkpoint as unsharded training saves it ("ema.safetensors", "model.safetensors"), read whole or
// assembled from the rank files of a sharded checkpoint. std::invalid_argument naming the path when it is absent.
SafetensorsContents read_checkpoint_file(const std::string& checkpoint_dir, const std::string& name);

// Writes `checkpoint_dir`'s state as unsharded files into `out_dir` (created; it must not exist): each split file
// written whole, one tensor in memory at a time, and the other files of the checkpoint copied, all through a
// partial folder and one rename. Returns the names written. Throws std::invalid_argument for a checkpoint that is
// not sharded or an `out_dir` that exists, CheckpointWriteError when writing fails (nothing is left at out_dir).
std::vector<std::string> write_consolidated(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace runner::ckpt
