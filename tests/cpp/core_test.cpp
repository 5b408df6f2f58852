// Tests of runtime/core: device and dtype names, the interrupt flag, logging levels, terminal-safe text, UTF-8
// checks, atomic writes.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/core/atomic_file.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/logging.h"
#include "runtime/core/terminal_text.h"
#include "runtime/core/utf8_text.h"
#include "tests/cpp/temp_directory.h"

using namespace runner::core;

TEST_CASE("device names parse to devices and back", "[core]") {
  CHECK(parse_device("cpu") == c10::Device(c10::kCPU));
  CHECK(device_name(parse_device("cpu")) == "cpu");
  if (!cuda_available()) {
    CHECK(parse_device("auto") == c10::Device(c10::kCPU));
    REQUIRE_THROWS_WITH(parse_device("cuda"), "device 'cuda' requested but CUDA is not available");
    REQUIRE_THROWS_WITH(parse_device("cuda:1"), "device 'cuda:1' requested but CUDA is not available");
  } else {
    CHECK(parse_device("auto") == c10::Device(c10::kCUDA, 0));
    CHECK(device_name(parse_device("cuda")) == "cuda:0");
  }
  REQUIRE_THROWS_WITH(parse_device("gpu"), "unknown device 'gpu' (expected cpu, cuda, cuda:N or auto)");
  REQUIRE_THROWS_WITH(parse_device("cuda:x"), "unknown device 'cuda:x' (expected cpu, cuda, cuda:N or auto)");
  REQUIRE_THROWS_WITH(parse_device("cuda:-1"), "unknown device 'cuda:-1' (expected cpu, cuda, cuda:N or auto)");
}

TEST_CASE("dtype names parse, aliases included, and canonical names come back", "[core]") {
  CHECK(parse_dtype("float32") == c10::kFloat);
  CHECK(parse_dtype("float") == c10::kFloat);
  CHECK(parse_dtype("bfloat16") == c10::kBFloat16);
  CHECK(parse_dtype("half") == c10::kHalf);
  CHECK(parse_dtype("long") == c10::kLong);
  CHECK(parse_dtype("uint8") == c10::kByte);
  CHECK(parse_dtype("bool") == c10::kBool);
  CHECK(dtype_name(c10::kDouble) == "float64");
  CHECK(dtype_name(c10::kLong) == "int64");
  CHECK(dtype_name(c10::kByte) == "uint8");
  REQUIRE_THROWS_WITH(parse_dtype("f32"),
                      "unknown dtype 'f32' (expected float32, float64, float16, bfloat16, int64, int32, int16, int8, "
                      "uint8 or bool)");
}

TEST_CASE("the interrupt flag is taken once", "[core]") {
  take_interrupt();
  CHECK_FALSE(interrupt_requested());
  request_interrupt();
  CHECK(interrupt_requested());
  CHECK(take_interrupt());
  CHECK_FALSE(take_interrupt());
}

TEST_CASE("log levels are checked", "[core]") {
  set_log_level("warn");
  set_log_level("info");
  REQUIRE_THROWS_WITH(set_log_level("loud"),
                      "unknown log level 'loud' (expected trace, debug, info, warn, error or off)");
}

TEST_CASE("text printed from data cannot drive the terminal", "[core]") {
  CHECK(terminal_text("lr=0.1 \u00e9t\u00e9 \u7a7a \U0001F600") == "lr=0.1 \u00e9t\u00e9 \u7a7a \U0001F600");
  CHECK(terminal_text("a\x1b[31mred\x1b[0m\x07\x7f") == "a\\x1b[31mred\\x1b[0m\\x07\\x7f");
  CHECK(terminal_text("title\x1b]0;pwned\x07") == "title\\x1b]0;pwned\\x07");
  CHECK(terminal_text("line one\r\nline\ttwo") == "line one\\r\nline\ttwo");
  CHECK(terminal_text("line one\r\nline\ttwo", TextLines::escaped) == "line one\\r\\nline\\ttwo");
  // C1 controls (U+009B is CSI), bidirectional overrides, and bytes that are not UTF-8.
  CHECK(terminal_text("\xc2\x9b"
                      "31m") == "\\u009b31m");
  CHECK(terminal_text("abc\u202edcba") == "abc\\u202edcba");
  CHECK(terminal_text("\x9b"
                      "31m \xff \xc3") == "\\x9b31m \\xff \\xc3");
  CHECK(terminal_text("\xe0\x80\x80") == "\\xe0\\x80\\x80");  // an overlong encoding
  CHECK(terminal_text(std::string_view("nul\0byte", 8)) == "nul\\x00byte");
}

TEST_CASE("UTF-8 is checked as RFC 3629 defines it: no surrogates, nothing above U+10FFFF, no cut sequence", "[core]") {
  using runner::core::invalid_utf8_offset;
  CHECK_FALSE(invalid_utf8_offset("caf\xc3\xa9 \xf0\x9f\x99\x82").has_value());      // é and an emoji
  CHECK_FALSE(invalid_utf8_offset("\xed\x9f\xbf").has_value());                      // U+D7FF, below the surrogates
  CHECK_FALSE(invalid_utf8_offset("\xf4\x8f\xbf\xbf").has_value());                  // U+10FFFF, the last code point
  CHECK(invalid_utf8_offset("ab\xed\xa0\x80") == std::optional<std::size_t>(2));     // U+D800, a surrogate
  CHECK(invalid_utf8_offset("ab\xed\xbf\xbf") == std::optional<std::size_t>(2));     // U+DFFF
  CHECK(invalid_utf8_offset("a\xf4\x90\x80\x80") == std::optional<std::size_t>(1));  // U+110000
  CHECK(invalid_utf8_offset("abc\xe2\x82") == std::optional<std::size_t>(3));        // € cut by the end
  CHECK(invalid_utf8_offset(std::string_view("abc\xf0\x9f", 5)) == std::optional<std::size_t>(3));
  CHECK(invalid_utf8_offset("\xc0\xaf") == std::optional<std::size_t>(0));  // an overlong '/'
  // A view that ends inside a sequence whose next byte lies beyond it in memory: the check stops at the view's end.
  const std::string euro = "abc\xe2\x82\xac";
  CHECK(invalid_utf8_offset(std::string_view(euro.data(), 5)) == std::optional<std::size_t>(3));
}

TEST_CASE("an atomic write does not follow a symlink planted at its temporary path", "[core]") {
  runner::testing::TempDir folder("atomic");
  const std::string victim = folder.path + "/victim.txt", target = folder.path + "/out.txt";
  { std::ofstream(victim) << "precious"; }
  std::filesystem::create_symlink(victim, target + ".tmp-" + std::to_string(::getpid()));
  CHECK_THROWS_WITH(runner::core::AtomicFileWriter(target),
                    Catch::Contains("out.txt: cannot create temporary file '") && Catch::Contains(".tmp-"));
  std::ifstream in(victim);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "precious");
  CHECK_FALSE(std::filesystem::exists(target));
}
