// libFuzzer target for the IDX (MNIST) header parser: any input must parse, data filling the file, or throw DataError.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"

namespace {

std::uint64_t element_bytes(int type_code) {
  switch (type_code) {
    case 0x08:
    case 0x09:
      return 1;
    case 0x0B:
      return 2;
    case 0x0C:
    case 0x0D:
      return 4;
    case 0x0E:
      return 8;
    default:
      std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const runner::data::IdxHeader header = runner::data::parse_idx_header(data, size, "fuzz");
    // product(shape) * element size, without wrapping, must be exactly the bytes after the header.
    std::uint64_t bytes = element_bytes(header.type_code);
    bool has_zero_dim = false;
    for (const std::int64_t dim : header.shape) has_zero_dim = has_zero_dim || dim == 0;
    if (header.shape.empty() || header.data_offset != 4 + 4 * header.shape.size()) std::abort();
    for (const std::int64_t dim : header.shape) {
      if (dim < 0) std::abort();
      if (!has_zero_dim && __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(dim), &bytes)) std::abort();
    }
    if (header.data_offset + (has_zero_dim ? 0 : bytes) != size) std::abort();
  } catch (const runner::data::DataError&) {
  }
  return 0;
}
