// Checkpoint directories: atomic writing, manifests, verification of damaged files, a failing disk.
#include <ATen/ATen.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/ckpt/checkpoint_rotation.h"
#include "runtime/core/sha256.h"
#include "tests/cpp/temp_directory.h"

using namespace runner::ckpt;
using runner::testing::TempDir;

namespace {

std::vector<CheckpointFileContent> sample_files(float fill, int64_t elements = 1000) {
  return {
      {"model.safetensors", {{"w", at::full({elements}, fill)}, {"b", at::arange(5, at::kFloat)}}, {{"kind", "model"}}},
      {"state.safetensors", {{"step", at::tensor({static_cast<int64_t>(fill)})}}, {}}};
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a checkpoint is written as one directory with a manifest of sizes and hashes", "[checkpoint]") {
  TempDir run("checkpoint-test");
  const WrittenCheckpoint written = write_checkpoint(run.path, 100, sample_files(3), {{"run", "abc"}});
  CHECK(written.path == "checkpoints/step-0000100");
  REQUIRE(written.files.size() == 3);
  CHECK(written.files[0].name == "model.safetensors");
  CHECK(written.files[2].name == "manifest.json");
  const std::string dir = run.path + "/checkpoints/step-0000100";
  CHECK(std::filesystem::exists(dir + "/model.safetensors"));
  int64_t total = 0;
  for (const auto& file : written.files) {
    CHECK(static_cast<int64_t>(std::filesystem::file_size(dir + "/" + file.name)) == file.bytes);
    CHECK(runner::core::sha256_file(dir + "/" + file.name) == file.sha256);
    total += file.bytes;
  }
  CHECK(written.bytes == total);
  const auto manifest = nlohmann::json::parse(read_text(dir + "/manifest.json"));
  CHECK(manifest["step"] == 100);
  CHECK(manifest["run"] == "abc");
  CHECK(manifest["files"].size() == 2);
  CHECK(manifest["files"][1]["name"] == "state.safetensors");
  CHECK(manifest["files"][0]["sha256"] == written.files[0].sha256);
  CHECK(written.sha256 == runner::core::sha256_file(dir + "/manifest.json"));
  const auto model = load_safetensors(dir + "/model.safetensors");
  CHECK(model.find("w")->equal(at::full({1000}, 3.0f)));
  CHECK(model.metadata.at("kind") == "model");
  // Only the finished directory is left in checkpoints/.
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(run.path + "/checkpoints"))
    names.push_back(entry.path().filename().string());
  CHECK(names == std::vector<std::string>{"step-0000100"});
  CHECK(verify_checkpoint(run.path, written.path, written.files).empty());
}

TEST_CASE("verification names each missing, truncated or damaged file", "[checkpoint]") {
  TempDir run("checkpoint-test");
  const WrittenCheckpoint written = write_checkpoint(run.path, 7, sample_files(1));
  const std::string dir = run.path + "/" + written.path;
  const int64_t model_bytes = written.files[0].bytes;
  std::filesystem::resize_file(dir + "/model.safetensors", 1200);
  {
    std::fstream state(dir + "/state.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    state.seekg(-1, std::ios::end);
    const char last = static_cast<char>(state.get());
    state.seekp(-1, std::ios::end);
    state.put(static_cast<char>(last ^ 0x01));
  }
  std::filesystem::remove(dir + "/manifest.json");
  const auto problems = verify_checkpoint(run.path, written.path, written.files);
  REQUIRE(problems.size() == 3);
  CHECK(problems[0] ==
        "model.safetensors: 1200 bytes, expected " + std::to_string(model_bytes) + " (truncated or replaced)");
  CHECK(problems[1] == "state.safetensors: sha256 differs (damaged)");
  CHECK(problems[2] == "manifest.json: missing");
  CHECK(verify_checkpoint(run.path, "checkpoints/step-0000008", written.files) ==
        std::vector<std::string>{"checkpoints/step-0000008: missing"});
}

TEST_CASE("a checkpoint of the same step replaces the earlier one whole", "[checkpoint]") {
  TempDir run("checkpoint-test");
  write_checkpoint(run.path, 5, sample_files(1));
  const WrittenCheckpoint second = write_checkpoint(run.path, 5, sample_files(2));
  CHECK(verify_checkpoint(run.path, second.path, second.files).empty());
  CHECK(load_safetensors(run.path + "/" + second.path + "/model.safetensors").find("w")->equal(at::full({1000}, 2.0f)));
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(run.path + "/checkpoints"))
    names.push_back(entry.path().filename().string());
  CHECK(names == std::vector<std::string>{"step-0000005"});
}

TEST_CASE("a write that fails (disk full) leaves the previous checkpoint intact and no partial directory",
          "[checkpoint]") {
  TempDir run("checkpoint-test");
  const WrittenCheckpoint good = write_checkpoint(run.path, 10, sample_files(1));
  // A file-size limit makes write() fail with EFBIG, as a full disk makes it fail with ENOSPC.
  struct rlimit saved {};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 64 * 1024;
  ::setrlimit(RLIMIT_FSIZE, &small);
  std::string message;
  try {
    write_checkpoint(run.path, 10, sample_files(9, 1 << 20));
  } catch (const CheckpointWriteError& error) {
    message = error.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  CHECK_THAT(message, Catch::Matchers::Contains("model.safetensors"));
  CHECK_THAT(message, Catch::Matchers::Contains("File too large"));
  CHECK(verify_checkpoint(run.path, good.path, good.files).empty());
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(run.path + "/checkpoints"))
    names.push_back(entry.path().filename().string());
  CHECK(names == std::vector<std::string>{"step-0000010"});
}

TEST_CASE("checkpoint arguments are checked", "[checkpoint]") {
  TempDir run("checkpoint-test");
  CHECK_THROWS_WITH(write_checkpoint(run.path, -1, sample_files(1)), "checkpoint step must be >= 0, got -1");
  CHECK_THROWS_WITH(
      write_checkpoint(run.path, 1, {{"../x", {}, {}}}),
      "checkpoint file name '../x' is not allowed: use letters, digits, '_', '-' and '.' (not manifest.json)");
  // A dot file would hide in the folder (and .partial-* / .staged-* are the writers' own names).
  CHECK_THROWS_WITH(write_checkpoint(run.path, 1, {{".model.safetensors", {}, {}}}),
                    "checkpoint file name '.model.safetensors' is not allowed: use letters, digits, '_', '-' and '.' "
                    "(not manifest.json)");
  CHECK_THROWS_WITH(
      write_checkpoint(run.path, 1, {{"manifest.json", {}, {}}}),
      "checkpoint file name 'manifest.json' is not allowed: use letters, digits, '_', '-' and '.' (not manifest.json)");
  auto twice = sample_files(1);
  twice.push_back(twice[0]);
  CHECK_THROWS_WITH(write_checkpoint(run.path, 1, twice), "checkpoint file 'model.safetensors' is given twice");
  CHECK(checkpoint_path(12345678) == "checkpoints/step-12345678");
}

TEST_CASE("rotation keeps the last K and the best N, and never the last good one", "[checkpoint]") {
  using runner::ckpt::RotationCandidate;
  using runner::ckpt::RotationPolicy;
  std::vector<RotationCandidate> candidates = {{1, 100, 0.50}, {2, 200, 0.20}, {3, 300, 0.40},
                                               {4, 400, 0.30}, {5, 500, 0.60}, {6, 600, std::nullopt}};
  CHECK(checkpoints_to_drop(candidates, {2, 0, true}) == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(checkpoints_to_drop(candidates, {2, 1, true}) == std::vector<int64_t>{1, 3, 4});
  CHECK(checkpoints_to_drop(candidates, {1, 2, false}) == std::vector<int64_t>{2, 3, 4});
  CHECK(checkpoints_to_drop(candidates, {0, 0, true}) == std::vector<int64_t>{1, 2, 3, 4, 5});
  // A damaged newest checkpoint: the newest good one stays even with keep_last 0, the damaged one goes.
  candidates[5].good = false;
  CHECK(checkpoints_to_drop(candidates, {0, 0, true}) == std::vector<int64_t>{1, 2, 3, 4, 6});
  CHECK(checkpoints_to_drop(candidates, {1, 1, true}) == std::vector<int64_t>{1, 3, 4, 6});
  // Nothing good: nothing is dropped.
  for (auto& candidate : candidates) candidate.good = false;
  CHECK(checkpoints_to_drop(candidates, {1, 0, true}).empty());
  // NaN is never among the best.
  std::vector<RotationCandidate> nan_case = {{1, 1, std::nan("")}, {2, 2, 5.0}, {3, 3, 9.0}};
  CHECK(checkpoints_to_drop(nan_case, {1, 1, true}) == std::vector<int64_t>{1});
  CHECK_THROWS_WITH(checkpoints_to_drop(nan_case, {-1, 0, true}),
                    "checkpoint rotation: keep_last and keep_best must be >= 0");
}
