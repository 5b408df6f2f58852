// Reading and consolidating checkpoint files split by rows over ranks.
#include "runtime/ckpt/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/core/atomic_file.h"

namespace runner::ckpt {
namespace {

bool exists(const std::string& path) {
  struct stat status {};
  return ::stat(path.c_str(), &status) == 0;
}

std::string file_stem(const std::string& file) {
  const auto dot = file.rfind('.');
  return dot == std::string::npos ? file : file.substr(0, dot);
}

std::int64_t row_count(const std::vector<std::int64_t>& shape) { return shape.empty() ? 1 : shape.front(); }

}  // namespace

std::string shard_file_name(int rank, int ranks) { return fmt::format("shard-{}-of-{}.safetensors", rank, ranks); }

std::string shard_tensor_name(const std::string& file, const std::string& tensor) {
  return file_stem(file) + "/" + tensor;
}

nlohmann::json shard_layout_json(const ShardLayout& layout) {
  nlohmann::json files = nlohmann::json::array();
  for (const ShardedFile& file : layout.files) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const ShardedTensor& tensor : file.tensors) {
      nlohmann::json rows = nlohmann::json::array();
      for (const ShardRows& r : tensor.rows) rows.push_back({r.begin, r.end});
      tensors.push_back({{"name", tensor.name}, {"shape", tensor.shape}, {"rows", rows}});
    }
    files.push_back({{"name", file.name}, {"metadata", file.metadata}, {"tensors", tensors}});
  }
  return {{"ranks", layout.ranks}, {"files", files}};
}

ShardLayout parse_shard_layout(const nlohmann::json& value, const std::string& origin) {
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("{}: the shard layout {}", origin, what));
  };
  ShardLayout layout;
  try {
    layout.ranks = value.at("ranks").get<int>();
    if (layout.ranks < 1) fail(fmt::format("has {} ranks", layout.ranks));
    for (const nlohmann::json& f : value.at("files")) {
      ShardedFile file;
      file.name = f.at("name").get<std::string>();
      file.metadata = f.at("metadata").get<std::map<std::string, std::string>>();
      for (const nlohmann::json& t : f.at("tensors")) {
        ShardedTensor tensor;
        tensor.name = t.at("name").get<std::string>();
        tensor.shape = t.at("shape").get<std::vector<std::int64_t>>();
        for (const nlohmann::json& r : t.at("rows"))
          tensor.rows.push_back({r.at(0).get<std::int64_t>(), r.at(1).get<std::int64_t>()});
        // The ranks' rows follow each other from the first row to the last.
        std::int64_t next = 0;
        for (const ShardRows& r : tensor.rows) {
          if (r.begin != next || r.end < r.begin) break;
          next = r.end;
        }
        if (tensor.rows.empty() || static_cast<int>(tensor.rows.size()) > layout.ranks ||
            next != row_count(tensor.shape) ||
            (tensor.rows.size() > 1 && static_cast<int>(tensor.rows.size()) != layout.ranks) ||
            std::any_of(tensor.shape.begin(), tensor.shape.end(), [](std::int64_t d) { return d < 0; }))
          fail(fmt::format("gives {} rows that do not cover its {} rows", file.name + " " + tensor.name,
                           row_count(tensor.shape)));
        file.tensors.push_back(std::move(tensor));
      }
      layout.files.push_back(std::move(file));
    }
  } catch (const nlohmann::json::exception& error) {
    fail(fmt::format("is malformed: {}", error.what()));
  }
  return layout;
}

ShardedCheckpoint::ShardedCheckpoint(std::string directory, ShardLayout layout)
    : directory_(std::move(directory)), layout_(std::move(layout)) {
  rank_files_.resize(static_cast<std::size_t>(layout_.ranks));
}

std::optional<ShardedCheckpoint> ShardedCheckpoint::open(const std::string& directory) {
  const std::string manifest_path = directory + "/manifest.json";
  std::ifstream in(manifest_path);
  if (!in) return std::nullopt;  // files without a manifest (verify_checkpoint checks a published checkpoint's)
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument(fmt::format("{}: not JSON: {}", manifest_path, error.what()));
  }
  if (!manifest.is_object() || !manifest.contains("shards")) return std::nullopt;
  ShardLayout layout = parse_shard_layout(manifest["shards"], manifest_path);
  const bool weights = std::any_of(layout.files.begin(), layout.files.end(),
                                   [](const ShardedFile& file) { return file.name == "model.safetensors"; });
  for (int rank = 0; rank < layout.ranks; ++rank) {
    const std::string path = directory + "/" + shard_file_name(rank, layout.ranks);
    if (!exists(path))
      throw std::invalid_argument(
          fmt::format("{}: missing: the checkpoint was saved by {} ranks and this holds rank {}'s share of its "
                      "{}optimizer state and EMA",
                      path, layout.ranks, rank, weights ? "weights, " : ""));
  }
  return ShardedCheckpoint(directory, std::move(layout));
}

const ShardedFile* ShardedCheckpoint::file(const std::string& name) const {
  for (const ShardedFile& file : layout_.files)
    if (file.name == name) return &file;
  return nullptr;
}

const SafetensorsFile& ShardedCheckpoint::rank_file(int rank) const {
  auto& slot = rank_files_.at(static_cast<std::size_t>(rank));
  if (!slot) {
    try {
      slot = std::make_unique<SafetensorsFile>(directory_ + "/" + shard_file_name(rank, layout_.ranks));
    } catch (const SafetensorsError& error) {
      throw std::invalid_argument(error.what());
    }
  }
  return *slot;
}

at::Tensor ShardedCheckpoint::read_rows(const ShardedFile& file, const ShardedTensor& tensor, std::int64_t begin,
                                        std::int64_t end) const {
  const std::int64_t rows = row_count(tensor.shape);
  if (begin < 0 || end < begin || end > rows)
    throw std::invalid_argument(
        fmt::format("{}: {} {} has {} rows, not rows [{}, {})", directory_, file.name, tensor.name, rows, begin, end));
  const std::string stored = shard_tensor_name(file.name, tensor.name);
  std::vector<at::Tensor> parts;
  for (std::size_t rank = 0; rank < tensor.rows.size(); ++rank) {
    const ShardRows held = tensor.rows[rank];
    const std::int64_t from = std::max(begin, held.begin), to = std::min(end, held.end);
    if (from >= to) continue;
    const SafetensorsFile& source = rank_file(static_cast<int>(rank));
    const TensorSpec* spec = source.find(stored);
    std::vector<std::int64_t> expected = tensor.shape;
    if (!expected.empty()) expected.front() = held.end - held.begin;
    if (spec == nullptr || (!tensor.shape.empty() && spec->shape != expected))
      throw std::invalid_argument(fmt::format("{}: {} does not hold rows [{}, {}) of {} as the manifest says",
                                              directory_, shard_file_name(static_cast<int>(rank), layout_.ranks),
                                              held.begin, held.end, stored));
    try {
      parts.push_back(source.read_rows(stored, from - held.begin, to - held.begin));
    } catch (const SafetensorsError& error) {
      throw std::invalid_argument(error.what());
    }
  }
  if (parts.empty()) {
    std::vector<std::int64_t> shape = tensor.shape.empty() ? std::vector<std::int64_t>{0} : tensor.shape;
    shape.front() = 0;
    return at::empty(shape, at::TensorOptions().dtype(dtype(file, tensor)));
  }
  at::Tensor rows_read = parts.size() == 1 ? parts.front() : at::cat(parts, 0);
  return tensor.shape.empty() ? rows_read.reshape({end - begin}) : rows_read;
}

at::ScalarType ShardedCheckpoint::dtype(const ShardedFile& file, const ShardedTensor& tensor) const {
  // Rank 0 holds the first rows of every tensor (none, for a tensor without rows).
  const std::string stored = shard_tensor_name(file.name, tensor.name);
  const TensorSpec* spec = rank_file(0).find(stored);
  if (spec == nullptr)
    throw std::invalid_argument(
        fmt::format("{}: {} is not in {}", directory_, stored, shard_file_name(0, layout_.ranks)));
  return spec->dtype;
}

at::Tensor ShardedCheckpoint::read(const ShardedFile& file, const ShardedTensor& tensor) const {
  const at::Tensor whole = read_rows(file, tensor, 0, row_count(tensor.shape));
  return tensor.shape.empty() ? whole.reshape({}) : whole;
}

SafetensorsContents read_checkpoint_file(const std::string& checkpoint_dir, const std::string& name) {
  const std::optional<ShardedCheckpoint> sharded = ShardedCheckpoint::open(checkpoint_dir);
  if (const ShardedFile* file = sharded ? sharded->file(name) : nullptr) {
    SafetensorsContents contents;
    contents.metadata = file->metadata;
    for (const ShardedTensor& tensor : file->tensors)
      contents.tensors.push_back({tensor.name, sharded->read(*file, tensor)});
    return contents;
  }
  const std::string path = checkpoint_dir + "/" + name;
  if (!exists(path)) throw std::invalid_argument(fmt::format("{}: missing", path));
  try {
    return load_safetensors(path);
  } catch (const SafetensorsError& error) {
    throw std::invalid_argument(error.what());
  }
}

std::vector<std::string> write_consolidated(const std::string& checkpoint_dir, const std::string& out_dir) {
  const std::optional<ShardedCheckpoint> sharded = ShardedCheckpoint::open(checkpoint_dir);
  if (!sharded)
    throw std::invalid_argument(
        fmt::format("{}: not a sharded checkpoint: its files are whole already", checkpoint_dir));
  if (exists(out_dir)) throw std::invalid_argument(fmt::format("{}: exists; nothing was written", out_dir));
  const std::string partial = fmt::format("{}.partial-{}", out_dir, ::getpid());
  if (::mkdir(partial.c_str(), 0755) != 0)
    throw CheckpointWriteError(fmt::format("{}: cannot create: {}", partial, std::strerror(errno)));
  std::vector<std::string> written;
  const auto remove_partial = [&] {
    for (const std::string& name : written) ::unlink((partial + "/" + name).c_str());
    ::rmdir(partial.c_str());
  };
  try {
    for (const ShardedFile& file : sharded->layout().files) {
      std::vector<TensorSpec> specs;
      for (const ShardedTensor& tensor : file.tensors) {
        specs.push_back({tensor.name, sharded->dtype(file, tensor), tensor.shape});
      }
      written.push_back(file.name);
      save_safetensors_streamed(partial + "/" + file.name, specs, file.metadata,
                                [&](std::size_t i) { return sharded->read(file, file.tensors[i]); });
    }
    // The files every rank holds whole (the weights, the trainer's counters) are copied as they are.
    std::ifstream manifest_in(checkpoint_dir + "/manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(manifest_in);
    for (const nlohmann::json& entry : manifest.at("files")) {
      const std::string name = entry.at("name").get<std::string>();
      if (name.rfind("shard-", 0) == 0) continue;
      written.push_back(name);
      const SafetensorsFile source(checkpoint_dir + "/" + name);
      save_safetensors_streamed(partial + "/" + name, source.tensors(), source.metadata(),
                                [&](std::size_t i) { return source.read(source.tensors()[i].name); });
    }
    if (::rename(partial.c_str(), out_dir.c_str()) != 0)
      throw CheckpointWriteError(fmt::format("{}: cannot move into place: {}", out_dir, std::strerror(errno)));
  } catch (const SafetensorsError& error) {
    remove_partial();
    throw CheckpointWriteError(error.what());
  } catch (...) {
    remove_partial();
    throw;
  }
  return written;
}

}  // namespace runner::ckpt
