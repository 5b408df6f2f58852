// Tests for runtime/ckpt/safetensors: round trips, exact file layout, rejected malformations, atomic saves.
#include "tests/cpp/temp_directory.h"
#include "runtime/ckpt/safetensors.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using runner::ckpt::load_safetensors;
using runner::ckpt::NamedTensor;
using runner::ckpt::parse_safetensors;
using runner::ckpt::SafetensorsContents;
using runner::ckpt::SafetensorsError;
using runner::ckpt::save_safetensors;

namespace {

using runner::testing::TempDir;

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream stream(path, std::ios::binary);
  stream.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A file image: the 8-byte length (of `header`, unless overridden), the header text, then `data`.
std::vector<std::uint8_t> file_image(std::string_view header, const std::vector<std::uint8_t>& data = {},
                                     std::optional<std::uint64_t> header_length = std::nullopt) {
  const std::uint64_t length = header_length.value_or(header.size());
  std::vector<std::uint8_t> bytes(8);
  std::memcpy(bytes.data(), &length, 8);
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

SafetensorsContents parse(const std::vector<std::uint8_t>& bytes) {
  return parse_safetensors(bytes.data(), bytes.size(), "mem");
}

bool same_tensor_bytes(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor expected_cpu = expected.contiguous();
  if (actual.scalar_type() != expected_cpu.scalar_type() || actual.sizes() != expected_cpu.sizes()) return false;
  if (!actual.is_contiguous() || actual.device() != at::Device(at::kCPU)) return false;
  return actual.nbytes() == expected_cpu.nbytes() &&
         (actual.nbytes() == 0 || std::memcmp(actual.data_ptr(), expected_cpu.data_ptr(), actual.nbytes()) == 0);
}

std::vector<NamedTensor> one_tensor_of_every_dtype() {
  const auto floats = at::tensor({1.5, -0.25, 0.0, -448.0, 3.0, 0.125}, at::kDouble).reshape({2, 3});
  return {
      {"f64", at::tensor({1.5, -2.25, 1e300, std::numeric_limits<double>::denorm_min()}, at::kDouble)},
      {"f32", at::tensor({1.5f, -2.25f, 3.4e38f, std::numeric_limits<float>::quiet_NaN()}, at::kFloat)},
      {"f16", floats.to(at::kHalf)},
      {"bf16", floats.to(at::kBFloat16)},
      {"i64",
       at::tensor({std::numeric_limits<std::int64_t>::min(), std::int64_t{0}, std::numeric_limits<std::int64_t>::max()},
                  at::kLong)},
      {"i32",
       at::tensor({std::numeric_limits<std::int32_t>::min(), -1, std::numeric_limits<std::int32_t>::max()}, at::kInt)},
      {"i16", at::tensor({-32768, 7, 32767}, at::kShort)},
      {"i8", at::tensor({-128, 5, 127}, at::kChar)},
      {"u8", at::tensor({0, 128, 255}, at::kByte)},
      {"bool", at::tensor({1, 0, 1, 1}, at::kByte).to(at::kBool)},
      {"f8_e4m3", floats.to(at::kFloat8_e4m3fn)},
      {"f8_e5m2", floats.to(at::kFloat8_e5m2)},
  };
}

constexpr std::string_view kValidHeader =
    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})";

std::vector<std::uint8_t> valid_data() { return std::vector<std::uint8_t>(12, 0); }

// Wraps one tensor entry's JSON as a complete header.
std::string single_entry(std::string_view entry) { return R"({"w":)" + std::string(entry) + "}"; }

}  // namespace

TEST_CASE("every dtype round-trips with exact bytes and metadata", "[safetensors]") {
  TempDir dir("runner-safetensors-test");
  const std::string path = dir.file("all.safetensors");
  const auto tensors = one_tensor_of_every_dtype();
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"step", "1200"}, {"note", "ünïcode ✓"}};
  save_safetensors(path, tensors, metadata);

  const SafetensorsContents loaded = load_safetensors(path);
  CHECK(loaded.metadata == metadata);
  REQUIRE(loaded.tensors.size() == tensors.size());
  for (std::size_t index = 0; index < tensors.size(); ++index) {
    INFO("tensor " << tensors[index].name);
    CHECK(loaded.tensors[index].name == tensors[index].name);  // data is written in the given order
    CHECK(same_tensor_bytes(loaded.tensors[index].tensor, tensors[index].tensor));
    const at::Tensor* found = loaded.find(tensors[index].name);
    REQUIRE(found != nullptr);
    CHECK(found->data_ptr() == loaded.tensors[index].tensor.data_ptr());
  }
  CHECK(loaded.find("missing") == nullptr);

  const std::vector<std::uint8_t> bytes = read_bytes(path);
  const SafetensorsContents parsed = parse_safetensors(bytes.data(), bytes.size(), path);
  REQUIRE(parsed.tensors.size() == tensors.size());
  for (std::size_t index = 0; index < tensors.size(); ++index) {
    CHECK(same_tensor_bytes(parsed.tensors[index].tensor, tensors[index].tensor));
  }
  CHECK(dir.entries() == std::vector<std::string>{"all.safetensors"});
}

TEST_CASE("the written file has the exact safetensors layout", "[safetensors]") {
  TempDir dir("runner-safetensors-test");
  const std::string path = dir.file("layout.safetensors");
  save_safetensors(path, {{"w", at::tensor({1.0f, 2.0f})}, {"b", at::tensor({7}, at::kByte)}}, {{"format", "pt"}});

  std::string header = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"U8","shape":[1],"data_offsets":[8,9]}})";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::vector<std::uint8_t> data(9);
  const float values[2] = {1.0f, 2.0f};
  std::memcpy(data.data(), values, 8);
  data[8] = 7;
  CHECK(read_bytes(path) == file_image(header, data));

  SECTION("no __metadata__ key without metadata") {
    save_safetensors(path, {{"s", at::scalar_tensor(2.5, at::kDouble)}});
    std::string plain = R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})";
    plain.resize((plain.size() + 7) / 8 * 8, ' ');
    const double scalar = 2.5;
    std::vector<std::uint8_t> scalar_bytes(8);
    std::memcpy(scalar_bytes.data(), &scalar, 8);
    CHECK(read_bytes(path) == file_image(plain, scalar_bytes));
  }
}

TEST_CASE("non-contiguous, offset, sparse and grad-requiring tensors are saved as their values", "[safetensors]") {
  TempDir dir("runner-safetensors-test");
  const std::string path = dir.file("views.safetensors");
  const at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor transposed = base.t();
  const at::Tensor column = base.select(1, 2);
  const at::Tensor strided = base.slice(1, 0, 4, 2);
  const at::Tensor sparse = at::eye(3, at::kDouble).to_sparse();
  const at::Tensor trainable = at::ones({2, 2}).requires_grad_(true);
  REQUIRE_FALSE(transposed.is_contiguous());
  REQUIRE(column.storage_offset() == 2);
  save_safetensors(path, {{"transposed", transposed},
                          {"column", column},
                          {"strided", strided},
                          {"sparse", sparse},
                          {"trainable", trainable}});

  const SafetensorsContents loaded = load_safetensors(path);
  REQUIRE(loaded.tensors.size() == 5);
  CHECK(loaded.find("transposed")->sizes() == at::IntArrayRef{4, 3});
  CHECK(at::equal(*loaded.find("transposed"), transposed));
  CHECK(at::equal(*loaded.find("column"), column));
  CHECK(at::equal(*loaded.find("strided"), strided));
  CHECK(at::equal(*loaded.find("sparse"), at::eye(3, at::kDouble)));
  CHECK(at::equal(*loaded.find("trainable"), at::ones({2, 2})));
  CHECK_FALSE(loaded.find("trainable")->requires_grad());
}

TEST_CASE("scalar and zero-element tensors round-trip", "[safetensors]") {
  TempDir dir("runner-safetensors-test");
  const std::string path = dir.file("edge.safetensors");
  const std::vector<NamedTensor> tensors{
      {"empty_first", at::empty({0}, at::kFloat)},       {"scalar", at::scalar_tensor(-3.5, at::kFloat)},
      {"empty_middle", at::empty({2, 0, 3}, at::kLong)}, {"scalar_bool", at::scalar_tensor(true, at::kBool)},
      {"empty_last", at::empty({0, 5}, at::kBFloat16)},
  };
  save_safetensors(path, tensors);
  const SafetensorsContents loaded = load_safetensors(path);
  REQUIRE(loaded.tensors.size() == tensors.size());
  for (const NamedTensor& expected : tensors) {
    INFO("tensor " << expected.name);
    const at::Tensor* found = loaded.find(expected.name);
    REQUIRE(found != nullptr);
    CHECK(same_tensor_bytes(*found, expected.tensor));
  }
  CHECK(loaded.find("scalar")->dim() == 0);
  CHECK(loaded.find("scalar")->item<float>() == -3.5f);
  CHECK(loaded.find("empty_middle")->sizes() == at::IntArrayRef{2, 0, 3});

  SECTION("a file with no tensors at all") {
    save_safetensors(path, {});
    CHECK(read_bytes(path) == file_image("{}      "));
    const SafetensorsContents nothing = load_safetensors(path);
    CHECK(nothing.tensors.empty());
    CHECK(nothing.metadata.empty());
  }
}

TEST_CASE("headers in any key order and with whitespace are accepted", "[safetensors]") {
  // Offsets out of name order, leading and trailing whitespace, metadata last.
  const std::string header =
      "\n { \"z\": {\"shape\": [1], \"data_offsets\": [0, 4], \"dtype\": \"I32\"},"
      " \"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
      " \"__metadata__\": {\"k\": \"v\"} } \t\r\n  ";
  const SafetensorsContents contents = parse(file_image(header, {1, 0, 0, 0, 2, 3}));
  REQUIRE(contents.tensors.size() == 2);
  CHECK(contents.tensors[0].name == "z");
  CHECK(contents.tensors[0].tensor.item<std::int32_t>() == 1);
  CHECK(contents.tensors[1].name == "a");
  CHECK(contents.metadata == std::map<std::string, std::string>{{"k", "v"}});
}

TEST_CASE("malformed files are rejected with a message saying what is wrong", "[safetensors]") {
  SECTION("too short for the length field") {
    const std::vector<std::uint8_t> bytes{1, 2, 3, 4, 5};
    REQUIRE_THROWS_AS(parse(bytes), SafetensorsError);
    REQUIRE_THROWS_WITH(parse(bytes), "mem: file is 5 bytes, too small for the 8-byte header length");
  }
  SECTION("header length beyond the file") {
    std::vector<std::uint8_t> bytes = file_image(kValidHeader, valid_data(), 99999);
    bytes.resize(120);
    REQUIRE_THROWS_WITH(parse(bytes), "mem: header length 99999 exceeds file size 120");
    REQUIRE_THROWS_WITH(parse(file_image("{}", {}, 3)), "mem: header length 3 exceeds file size 10");
  }
  SECTION("header length above the 100 MB limit") {
    REQUIRE_THROWS_WITH(parse(file_image("{}", {}, 100'000'001)),
                        "mem: header length 100000001 exceeds the limit of 100000000 bytes");
    REQUIRE_THROWS_WITH(parse(file_image("{}", {}, std::numeric_limits<std::uint64_t>::max())),
                        "mem: header length 18446744073709551615 exceeds the limit of 100000000 bytes");
  }
  SECTION("header is not JSON") {
    REQUIRE_THROWS_WITH(parse(file_image("")), StartsWith("mem: header is not valid JSON: "));
    REQUIRE_THROWS_WITH(parse(file_image("{\"a\":")), StartsWith("mem: header is not valid JSON: "));
    REQUIRE_THROWS_WITH(parse(file_image("{} x")), StartsWith("mem: header is not valid JSON: "));
    REQUIRE_THROWS_WITH(parse(file_image(std::string("{}\0\0", 4))),
                        "mem: header is not valid JSON: NUL byte at offset 2");
    REQUIRE_THROWS_WITH(parse(file_image(std::string("{}\0junk", 7))),
                        "mem: header is not valid JSON: NUL byte at offset 2");
    REQUIRE_THROWS_WITH(parse(file_image("{\"\xff\":1}")), StartsWith("mem: header is not valid JSON: "));
    REQUIRE_THROWS_WITH(parse(file_image("{} // comment")), StartsWith("mem: header is not valid JSON: "));
    REQUIRE_THROWS_WITH(parse(file_image(R"({"w":[1e400]})")),
                        "mem: header is not valid JSON: number overflow parsing '1e400'");
    REQUIRE_THROWS_WITH(parse(file_image("\xEF\xBB\xBF{}")),
                        "mem: header is not valid JSON: it starts with a byte order mark");
  }
  SECTION("header is not an object") {
    REQUIRE_THROWS_WITH(parse(file_image("[]")), "mem: header is not a JSON object");
    REQUIRE_THROWS_WITH(parse(file_image("7")), "mem: header is not a JSON object");
    REQUIRE_THROWS_WITH(parse(file_image("null")), "mem: header is not a JSON object");
  }
  SECTION("deep nesting") {
    const std::string deep = "{\"w\":" + std::string(200, '[') + std::string(200, ']') + "}";
    REQUIRE_THROWS_WITH(parse(file_image(deep)), "mem: header nests deeper than 128 levels");
    // The limit is serde_json's 128: the object and 127 arrays parse (and fail as an entry), one more does not.
    const auto nested = [](int arrays) {
      return "{\"w\":" + std::string(arrays, '[') + std::string(arrays, ']') + "}";
    };
    REQUIRE_THROWS_WITH(parse(file_image(nested(127))), "mem: tensor 'w': entry is not an object");
    REQUIRE_THROWS_WITH(parse(file_image(nested(128))), "mem: header nests deeper than 128 levels");
  }
  SECTION("duplicate keys") {
    REQUIRE_THROWS_WITH(parse(file_image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                         R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                                         {1})),
                        "mem: header has duplicate key 'a'");
    REQUIRE_THROWS_WITH(
        parse(file_image(single_entry(R"({"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]})"), {1})),
        "mem: header has duplicate key 'dtype'");
    REQUIRE_THROWS_WITH(parse(file_image(R"({"__metadata__":{"k":"1","k":"2"}})")),
                        "mem: header has duplicate key 'k'");
  }
  SECTION("bad __metadata__") {
    REQUIRE_THROWS_WITH(parse(file_image(R"({"__metadata__":["k"]})")), "mem: __metadata__ is not an object");
    REQUIRE_THROWS_WITH(parse(file_image(R"({"__metadata__":{"k":1}})")),
                        "mem: __metadata__ value for 'k' is not a string");
    REQUIRE_THROWS_WITH(parse(file_image(R"({"__metadata__":{"k":null}})")),
                        "mem: __metadata__ value for 'k' is not a string");
  }
  SECTION("entry structure") {
    REQUIRE_THROWS_WITH(parse(file_image(R"({"w":[1]})")), "mem: tensor 'w': entry is not an object");
    REQUIRE_THROWS_WITH(parse(file_image(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})")),
                        "mem: header has a tensor with an empty name");
    REQUIRE_THROWS_WITH(
        parse(file_image(single_entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":0})"), {1})),
        "mem: tensor 'w': unexpected field 'extra'");
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"U8","data_offsets":[0,1]})"), {1})),
                        "mem: tensor 'w': missing field 'shape'");
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"shape":[1],"data_offsets":[0,1]})"), {1})),
                        "mem: tensor 'w': missing field 'dtype'");
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"U8","shape":[1]})"), {1})),
                        "mem: tensor 'w': missing field 'data_offsets'");
  }
  SECTION("dtype") {
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":8,"shape":[1],"data_offsets":[0,1]})"), {1})),
                        "mem: tensor 'w': dtype is not a string");
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"C64","shape":[1],"data_offsets":[0,8]})"),
                                         std::vector<std::uint8_t>(8))),
                        "mem: tensor 'w': unsupported dtype 'C64'");
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})"),
                                         std::vector<std::uint8_t>(4))),
                        "mem: tensor 'w': unsupported dtype 'f32'");
  }
  SECTION("shape") {
    for (const std::string shape :
         {R"([-1])", R"([1.0])", R"([1e2])", R"(["2"])", R"([[1]])", R"(2)", R"(null)", R"([18446744073709551616])"}) {
      INFO("shape " << shape);
      REQUIRE_THROWS_WITH(
          parse(file_image(single_entry(R"({"dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,1]})"), {1})),
          "mem: tensor 'w': shape is not an array of non-negative integers");
    }
  }
  SECTION("data_offsets") {
    for (const std::string offsets : {R"([0])", R"([0,1,2])", R"([-1,1])", R"([0,1.5])", R"("0,1")", R"({})"}) {
      INFO("data_offsets " << offsets);
      REQUIRE_THROWS_WITH(
          parse(file_image(single_entry(R"({"dtype":"U8","shape":[1],"data_offsets":)" + offsets + "}"), {1})),
          "mem: tensor 'w': data_offsets is not an array of 2 non-negative integers");
    }
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"U8","shape":[4],"data_offsets":[8,4]})"),
                                         std::vector<std::uint8_t>(8))),
                        "mem: tensor 'w': data_offsets [8, 4] end before they begin");
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"F32","shape":[8],"data_offsets":[0,32]})"),
                                         std::vector<std::uint8_t>(24))),
                        "mem: tensor 'w': data_offsets [0, 32] exceed the data section of 24 bytes");
  }
  SECTION("byte count does not match shape and dtype") {
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,12]})"),
                                         std::vector<std::uint8_t>(12))),
                        "mem: tensor 'w': data_offsets [0, 12] do not match shape [2, 3] of F32 (24 bytes)");
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"BF16","shape":[],"data_offsets":[0,0]})"))),
                        "mem: tensor 'w': data_offsets [0, 0] do not match shape [] of BF16 (2 bytes)");
  }
  SECTION("byte count overflows") {
    REQUIRE_THROWS_WITH(
        parse(file_image(single_entry(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]})"))),
        "mem: tensor 'w': shape [4294967296, 4294967296] of F32 overflows the byte count");
    REQUIRE_THROWS_WITH(
        parse(file_image(single_entry(R"({"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0]})"))),
        "mem: tensor 'w': shape [4611686018427387904] of I64 overflows the byte count");
  }
  SECTION("zero-element shape too large for LibTorch strides") {
    REQUIRE_THROWS_WITH(
        parse(file_image(single_entry(R"({"dtype":"U8","shape":[0,9223372036854775807,2],"data_offsets":[0,0]})"))),
        "mem: tensor 'w': shape [0, 9223372036854775807, 2] is too large for a tensor");
    REQUIRE_THROWS_WITH(
        parse(file_image(single_entry(R"({"dtype":"U8","shape":[18446744073709551615,0],"data_offsets":[0,0]})"))),
        "mem: tensor 'w': shape [18446744073709551615, 0] is too large for a tensor");
    const SafetensorsContents largest =
        parse(file_image(single_entry(R"({"dtype":"U8","shape":[0,9223372036854775807],"data_offsets":[0,0]})")));
    CHECK(largest.tensors.at(0).tensor.size(1) == std::numeric_limits<std::int64_t>::max());
  }
  SECTION("tensors must tile the data section") {
    REQUIRE_THROWS_WITH(parse(file_image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[12,16]}})",
                                         std::vector<std::uint8_t>(16))),
                        "mem: tensor 'b': data_offsets [12, 16] leave bytes [8, 12) of the data section uncovered");
    REQUIRE_THROWS_WITH(parse(file_image(single_entry(R"({"dtype":"U8","shape":[4],"data_offsets":[4,8]})"),
                                         std::vector<std::uint8_t>(8))),
                        "mem: tensor 'w': data_offsets [4, 8] leave bytes [0, 4) of the data section uncovered");
    REQUIRE_THROWS_WITH(parse(file_image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                                         R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                                         std::vector<std::uint8_t>(12))),
                        "mem: tensor 'b': data_offsets [4, 12] overlap tensor 'a' at [0, 8]");
    REQUIRE_THROWS_WITH(parse(file_image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                                         R"("b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
                                         std::vector<std::uint8_t>(8))),
                        "mem: tensor 'b': data_offsets [0, 8] overlap tensor 'a' at [0, 8]");
    REQUIRE_THROWS_WITH(parse(file_image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                                         R"("e":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})",
                                         std::vector<std::uint8_t>(8))),
                        "mem: tensor 'e': data_offsets [4, 4] overlap tensor 'a' at [0, 8]");
  }
  SECTION("data not covered at the end") {
    REQUIRE_THROWS_WITH(parse(file_image(kValidHeader, std::vector<std::uint8_t>(13))),
                        "mem: bytes [12, 13) of the data section are not covered by any tensor");
    REQUIRE_THROWS_WITH(parse(file_image("{}", {0, 0, 0})),
                        "mem: bytes [0, 3) of the data section are not covered by any tensor");
  }
  SECTION("bool values other than 0 and 1") {
    REQUIRE_THROWS_WITH(
        parse(file_image(single_entry(R"({"dtype":"BOOL","shape":[3],"data_offsets":[0,3]})"), {1, 2, 0})),
        "mem: tensor 'w': BOOL element 1 has byte value 2 (not 0 or 1)");
  }
}

TEST_CASE("load_safetensors reports errors with the path", "[safetensors]") {
  TempDir dir("runner-safetensors-test");
  const std::string path = dir.file("bad.safetensors");
  REQUIRE_THROWS_WITH(load_safetensors(path), path + ": cannot open: No such file or directory");
  REQUIRE_THROWS_WITH(load_safetensors(dir.file("")), Contains("is not a regular file"));

  write_bytes(path, {1, 2, 3});
  REQUIRE_THROWS_WITH(load_safetensors(path), path + ": file is 3 bytes, too small for the 8-byte header length");

  std::vector<std::uint8_t> bytes = file_image(kValidHeader, valid_data(), 99999);
  bytes.resize(120);
  write_bytes(path, bytes);
  REQUIRE_THROWS_WITH(load_safetensors(path), path + ": header length 99999 exceeds file size 120");

  write_bytes(path, file_image(single_entry(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,12]})"),
                               std::vector<std::uint8_t>(12)));
  REQUIRE_THROWS_WITH(load_safetensors(path),
                      path + ": tensor 'w': data_offsets [0, 12] do not match shape [2, 3] of F32 (24 bytes)");

  write_bytes(path, file_image(kValidHeader, std::vector<std::uint8_t>(11)));
  REQUIRE_THROWS_WITH(load_safetensors(path),
                      path + ": tensor 'b': data_offsets [8, 12] exceed the data section of 11 bytes");

  write_bytes(path, file_image(single_entry(R"({"dtype":"BOOL","shape":[2],"data_offsets":[0,2]})"), {0, 9}));
  REQUIRE_THROWS_WITH(load_safetensors(path), path + ": tensor 'w': BOOL element 1 has byte value 9 (not 0 or 1)");
}

TEST_CASE("failed saves leave no file behind and keep an existing file", "[safetensors]") {
  TempDir dir("runner-safetensors-test");
  const std::string path = dir.file("model.safetensors");
  const at::Tensor weight = at::ones({2, 2});

  SECTION("directory does not exist") {
    const std::string missing = dir.file("no-such-dir") + "/model.safetensors";
    REQUIRE_THROWS_WITH(save_safetensors(missing, {{"w", weight}}),
                        StartsWith(missing + ": cannot create temporary file '" + missing + ".tmp-") &&
                            Contains("No such file or directory"));
    CHECK(dir.entries().empty());
  }

  SECTION("bad names, dtypes and tensors") {
    save_safetensors(path, {{"old", at::zeros({3})}});
    const std::vector<std::uint8_t> original = read_bytes(path);

    REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", weight}, {"w", weight}}), path + ": duplicate tensor name 'w'");
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", weight}, {"", weight}}), path + ": tensor #1 has an empty name");
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"__metadata__", weight}}),
                        path + ": tensor name '__metadata__' is reserved for the metadata");
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}}),
                        path + ": tensor 'c': unsupported dtype ComplexFloat");
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"u", at::Tensor()}}), path + ": tensor 'u' is undefined");
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"bad\xff", weight}}),
                        path + ": tensor 'bad\xff': the name is not valid UTF-8");
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", weight}}, {{"k", "\xc3"}}),
                        path + ": metadata value for 'k' is not valid UTF-8");
    // The header is written before a meta tensor fails to copy, so this exercises removing the temporary.
    REQUIRE_THROWS_WITH(
        save_safetensors(path, {{"w", weight}, {"m", at::empty({2}, at::TensorOptions().device(at::kMeta))}}),
        StartsWith(path + ": tensor 'm': cannot copy to CPU: "));

    CHECK(read_bytes(path) == original);
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
  }

  SECTION("destination is a directory") {
    fs::create_directory(path);
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", weight}}),
                        StartsWith(path + ": renaming '" + path + ".tmp-") && Contains("over it failed"));
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
    CHECK(fs::is_directory(path));
  }

  SECTION("a successful save replaces the old file") {
    save_safetensors(path, {{"old", at::zeros({3})}});
    save_safetensors(path, {{"new", weight}});
    const SafetensorsContents loaded = load_safetensors(path);
    REQUIRE(loaded.tensors.size() == 1);
    CHECK(loaded.tensors[0].name == "new");
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
  }
}

TEST_CASE("mutated files either parse or throw SafetensorsError", "[safetensors][mutation]") {
  TempDir dir("runner-safetensors-test");
  const std::string path = dir.file("seed.safetensors");
  save_safetensors(path,
                   {{"weight", at::arange(6, at::kFloat).reshape({2, 3})},
                    {"mask", at::tensor({1, 0, 1}, at::kByte).to(at::kBool)},
                    {"scalar", at::scalar_tensor(2, at::kLong)},
                    {"empty", at::empty({0, 4}, at::kHalf)},
                    {"f8", at::ones({3}).to(at::kFloat8_e5m2)}},
                   {{"format", "pt"}});
  const std::vector<std::uint8_t> seed = read_bytes(path);
  std::uint64_t seed_header_length = 0;
  std::memcpy(&seed_header_length, seed.data(), 8);

  std::mt19937_64 random(20240607);
  auto below = [&](std::uint64_t bound) { return std::uniform_int_distribution<std::uint64_t>(0, bound - 1)(random); };
  const std::string json_bytes = "{}[]\":,0123456789-.eE \\u\xff";

  int parsed = 0;
  int rejected = 0;
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::vector<std::uint8_t> bytes = seed;
    const int mutations = 1 + static_cast<int>(below(3));
    for (int step = 0; step < mutations && !bytes.empty(); ++step) {
      switch (below(8)) {
        case 0:  // flip bits of a random byte
          bytes[below(bytes.size())] ^= static_cast<std::uint8_t>(1 + below(255));
          break;
        case 1:  // overwrite a header byte with a JSON-significant one
          if (bytes.size() > 8)
            bytes[8 + below(std::min<std::uint64_t>(seed_header_length, bytes.size() - 8))] =
                static_cast<std::uint8_t>(json_bytes[below(json_bytes.size())]);
          break;
        case 2:  // truncate
          bytes.resize(below(bytes.size() + 1));
          break;
        case 3: {  // edit the header length
          std::uint64_t length = 0;
          if (bytes.size() >= 8) {
            std::memcpy(&length, bytes.data(), 8);
            const std::uint64_t choices[] = {
                length + 1,       length - 1, length + 8, below(bytes.size()), std::uint64_t{1} << below(64),
                ~std::uint64_t{0}};
            length = choices[below(std::size(choices))];
            std::memcpy(bytes.data(), &length, 8);
          }
          break;
        }
        case 4:  // insert a byte
          bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(below(bytes.size() + 1)),
                       static_cast<std::uint8_t>(below(256)));
          break;
        case 5:  // delete a byte
          bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(below(bytes.size())));
          break;
        case 6:  // flip a byte of the data section, which mostly keeps the file valid
          if (bytes.size() > 8 + seed_header_length) {
            bytes[8 + seed_header_length + below(bytes.size() - 8 - seed_header_length)] ^=
                static_cast<std::uint8_t>(1 + below(255));
          }
          break;
        default:  // append junk
          bytes.resize(bytes.size() + 1 + below(16), static_cast<std::uint8_t>(below(256)));
          break;
      }
    }
    try {
      parse_safetensors(bytes.data(), bytes.size(), "mutant");
      ++parsed;
    } catch (const SafetensorsError& error) {
      if (std::string_view(error.what()).rfind("mutant: ", 0) != 0) FAIL("message without origin: " << error.what());
      ++rejected;
    } catch (const std::exception& error) {
      FAIL("iteration " << iteration << " threw a non-SafetensorsError: " << error.what());
    }
  }
  CHECK(parsed + rejected == 20000);
  CHECK(parsed > 500);
  CHECK(rejected > 10000);
}
