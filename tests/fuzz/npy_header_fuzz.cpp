// libFuzzer target for the .npy header parser: any input must parse (data exactly filling the file) or throw DataError.
#include "runtime/data/npy.h"

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/data/data_error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const runner::data::NpyHeader header = runner::data::parse_npy_header(data, size, "fuzz");
    if (header.data_offset + header.data_bytes != size) std::abort();
    // data_bytes must be product(shape) * item size, computed without wrapping.
    std::uint64_t bytes = c10::elementSize(header.dtype);
    bool has_zero_dim = false;
    for (const std::int64_t dim : header.shape) has_zero_dim = has_zero_dim || dim == 0;
    for (const std::int64_t dim : header.shape) {
      if (dim < 0) std::abort();
      if (!has_zero_dim && __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(dim), &bytes)) std::abort();
    }
    if ((has_zero_dim ? 0 : bytes) != header.data_bytes) std::abort();
  } catch (const runner::data::DataError&) {
  }
  return 0;
}
