// Tests of runtime/core: device and dtype names, the interrupt flag, logging levels.
#include <catch2/catch.hpp>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/logging.h"

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
