// libFuzzer target for the safetensors parser: any input must parse or throw SafetensorsError.
#include "runtime/ckpt/safetensors.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    runner::ckpt::parse_safetensors(data, size, "fuzz");
  } catch (const runner::ckpt::SafetensorsError&) {
  }
  return 0;
}
