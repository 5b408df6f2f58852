// libFuzzer target for the CIFAR-10 batch validator: any input must give its record count or throw DataError.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const std::int64_t records = runner::data::parse_cifar10_batch(data, size, "fuzz");
    if (records <= 0 || static_cast<std::size_t>(records) * 3073 != size) std::abort();
  } catch (const runner::data::DataError&) {
  }
  return 0;
}
