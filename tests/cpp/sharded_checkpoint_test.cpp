// Tests of runtime/ckpt/sharded_checkpoint and staged_files on their own: the layout's checks, rank files that do
// not hold what the manifest says, and a rank's failed write reaching rank 0 at once.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/ckpt/sharded_checkpoint.h"
#include "runtime/ckpt/staged_files.h"
#include "tests/cpp/temp_directory.h"

namespace ckpt = runner::ckpt;

namespace {

// A checkpoint folder of 2 ranks holding rows [0, 3) and [3, 5) of a [5, 2] tensor "w" of "ema.safetensors".
void write_sharded(const std::string& folder, const nlohmann::json& rows, std::int64_t rank1_rows = 2) {
  const at::Tensor w = at::arange(10, at::kFloat).reshape({5, 2});
  ckpt::save_safetensors(folder + "/shard-0-of-2.safetensors", {{"ema/w", w.narrow(0, 0, 3).contiguous()}});
  ckpt::save_safetensors(folder + "/shard-1-of-2.safetensors", {{"ema/w", w.narrow(0, 3, rank1_rows).contiguous()}});
  const nlohmann::json layout = {{"ranks", 2},
                                 {"files",
                                  {{{"name", "ema.safetensors"},
                                    {"metadata", nlohmann::json::object()},
                                    {"tensors", {{{"name", "w"}, {"shape", {5, 2}}, {"rows", rows}}}}}}}};
  std::ofstream(folder + "/manifest.json") << nlohmann::json{{"step", 1}, {"shards", layout}}.dump();
}

}  // namespace

TEST_CASE("sharded checkpoint: rows are read from the ranks that hold them, whatever range is asked", "[ckpt]") {
  runner::testing::TempDir folder("sharded");
  write_sharded(folder.path, {{0, 3}, {3, 5}});
  const auto checkpoint = ckpt::ShardedCheckpoint::open(folder.path);
  REQUIRE(checkpoint.has_value());
  const ckpt::ShardedFile& file = *checkpoint->file("ema.safetensors");
  const at::Tensor w = at::arange(10, at::kFloat).reshape({5, 2});
  CHECK(at::equal(checkpoint->read(file, file.tensors[0]), w));
  CHECK(at::equal(checkpoint->read_rows(file, file.tensors[0], 2, 4), w.narrow(0, 2, 2)));  // across the two files
  CHECK(checkpoint->read_rows(file, file.tensors[0], 4, 4).sizes() == c10::IntArrayRef({0, 2}));
  CHECK_THROWS_WITH(checkpoint->read_rows(file, file.tensors[0], 3, 6),
                    Catch::Contains("ema.safetensors w has 5 rows, not rows [3, 6)"));
  CHECK(ckpt::read_checkpoint_file(folder.path, "ema.safetensors").tensors.at(0).tensor.equal(w));
}

TEST_CASE("sharded checkpoint: a layout whose rows do not tile the tensor is refused", "[ckpt]") {
  runner::testing::TempDir folder("sharded");
  for (const nlohmann::json& rows : {nlohmann::json{{0, 3}, {3, 4}}, nlohmann::json{{0, 3}, {2, 5}},
                                     nlohmann::json{{0, 5}, {5, 5}, {5, 5}}, nlohmann::json::array()}) {
    INFO(rows.dump());
    write_sharded(folder.path, rows);
    CHECK_THROWS_WITH(ckpt::ShardedCheckpoint::open(folder.path),
                      Catch::Contains("manifest.json: the shard layout gives ema.safetensors w rows that do not cover "
                                      "its 5 rows"));
  }
}

TEST_CASE("sharded checkpoint: a rank file that holds other rows than the manifest says is named", "[ckpt]") {
  runner::testing::TempDir folder("sharded");
  write_sharded(folder.path, {{0, 3}, {3, 5}}, /*rank1_rows=*/1);
  const auto checkpoint = ckpt::ShardedCheckpoint::open(folder.path);
  const ckpt::ShardedFile& file = *checkpoint->file("ema.safetensors");
  CHECK_THROWS_WITH(
      checkpoint->read(file, file.tensors[0]),
      Catch::Contains("shard-1-of-2.safetensors does not hold rows [3, 5) of ema/w as the manifest says"));
}

TEST_CASE("staged files: a rank's failed write reaches rank 0 at once, naming the file and the cause", "[ckpt]") {
  runner::testing::TempDir run("staged");
  ckpt::StagedFileWriter writer(run.path);
  // A tensor of a dtype safetensors has no name for fails the write.
  writer.submit(4, {{"shard-1-of-2.safetensors", {{"x", at::zeros({2}, at::kComplexFloat)}}, {}, {}}}, {});
  writer.wait();
  const std::vector<std::string> errors = writer.take_errors();
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::Contains("unsupported dtype"));
  // Without the marker rank 0 would wait out the timeout and say that the file did not arrive.
  CHECK_THROWS_WITH(
      ckpt::wait_for_staged_files(run.path, 4, {"shard-1-of-2.safetensors"}, std::chrono::seconds(60)),
      Catch::Contains("shard-1-of-2.safetensors: its writer failed: ") && Catch::Contains("unsupported dtype"));
  // A file that never comes is named when the wait ends.
  CHECK_THROWS_WITH(
      ckpt::wait_for_staged_files(run.path, 5, {"shard-1-of-2.safetensors"}, std::chrono::milliseconds(50)),
      Catch::Contains("shard-1-of-2.safetensors of step 5 did not arrive within 0 s (did its rank stop?)"));
}
