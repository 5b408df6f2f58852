// .npz: the zip's central directory (zip64 too), stored or deflated members through zlib, .npy inside.
#include "runtime/data/npz.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <cstring>

#include "runtime/core/atomic_file.h"
#include "runtime/data/data_error.h"
#include "runtime/data/mapped_file.h"
#include "runtime/data/npy.h"

namespace runner::data {
namespace {

std::uint64_t little(const std::uint8_t* at, int bytes) {
  std::uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | at[i];
  return value;
}

struct Member {
  std::string name;
  int method = 0;
  std::uint64_t compressed = 0, size = 0, local_offset = 0;
};

// The zip64 extended information extra field replaces the 32-bit fields that are 0xFFFFFFFF, in order.
void apply_zip64(const std::uint8_t* extra, std::size_t length, Member& member, bool size_max, bool compressed_max,
                 bool offset_max) {
  std::size_t at = 0;
  while (at + 4 <= length) {
    const auto id = little(extra + at, 2), field = little(extra + at + 2, 2);
    if (at + 4 + field > length) break;
    if (id == 1) {
      std::size_t p = at + 4;
      auto next = [&](std::uint64_t& target) {
        if (p + 8 <= at + 4 + field) target = little(extra + p, 8), p += 8;
      };
      if (size_max) next(member.size);
      if (compressed_max) next(member.compressed);
      if (offset_max) next(member.local_offset);
    }
    at += 4 + field;
  }
}

std::vector<Member> central_directory(const std::uint8_t* data, std::size_t size, const std::string& path) {
  // The end of central directory record: within the last 64 KiB + 22 bytes.
  if (size < 22) throw DataError(path, "not an .npz (zip) file: too short");
  std::size_t end = size - 22;
  const std::size_t lowest = size > 22 + 65535 ? size - 22 - 65535 : 0;
  while (little(data + end, 4) != 0x06054b50) {
    if (end == lowest) throw DataError(path, "not an .npz (zip) file: no end of central directory");
    --end;
  }
  std::uint64_t entries = little(data + end + 10, 2);
  std::uint64_t directory = little(data + end + 16, 4);
  if ((entries == 0xFFFF || directory == 0xFFFFFFFF) && end >= 20 && little(data + end - 20, 4) == 0x07064b50) {
    const std::uint64_t record = little(data + end - 12, 8);
    if (record + 56 > size || little(data + record, 4) != 0x06064b50) throw DataError(path, "damaged zip64 directory");
    entries = little(data + record + 32, 8);
    directory = little(data + record + 48, 8);
  }
  std::vector<Member> members;
  std::uint64_t at = directory;
  for (std::uint64_t i = 0; i < entries; ++i) {
    if (at + 46 > size || little(data + at, 4) != 0x02014b50) throw DataError(path, "damaged zip central directory");
    Member member;
    member.method = static_cast<int>(little(data + at + 10, 2));
    member.compressed = little(data + at + 20, 4);
    member.size = little(data + at + 24, 4);
    const auto name_length = little(data + at + 28, 2), extra_length = little(data + at + 30, 2),
               comment_length = little(data + at + 32, 2);
    member.local_offset = little(data + at + 42, 4);
    if (at + 46 + name_length + extra_length > size) throw DataError(path, "damaged zip central directory");
    member.name.assign(reinterpret_cast<const char*>(data + at + 46), name_length);
    apply_zip64(data + at + 46 + name_length, extra_length, member, member.size == 0xFFFFFFFF,
                member.compressed == 0xFFFFFFFF, member.local_offset == 0xFFFFFFFF);
    members.push_back(member);
    at += 46 + name_length + extra_length + comment_length;
  }
  return members;
}

std::vector<std::uint8_t> member_bytes(const std::uint8_t* data, std::size_t size, const Member& member,
                                       const std::string& path) {
  const std::uint64_t local = member.local_offset;
  if (local + 30 > size || little(data + local, 4) != 0x04034b50)
    throw DataError(path, member.name + ": damaged zip entry");
  const std::uint64_t start = local + 30 + little(data + local + 26, 2) + little(data + local + 28, 2);
  if (start + member.compressed > size)
    throw DataError(path, member.name + ": the zip entry runs past the end of the file");
  std::vector<std::uint8_t> bytes(member.size);
  if (member.method == 0) {
    if (member.compressed != member.size) throw DataError(path, member.name + ": damaged stored zip entry");
    std::memcpy(bytes.data(), data + start, member.size);
    return bytes;
  }
  if (member.method != 8)
    throw DataError(path,
                    member.name + ": zip compression method " + std::to_string(member.method) + " is not supported");
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) throw DataError(path, "zlib cannot start");
  stream.next_in = const_cast<Bytef*>(data + start);
  stream.avail_in = static_cast<uInt>(member.compressed);
  stream.next_out = bytes.data();
  stream.avail_out = static_cast<uInt>(member.size);
  const int status = inflate(&stream, Z_FINISH);
  inflateEnd(&stream);
  if (status != Z_STREAM_END || stream.total_out != member.size)
    throw DataError(path, member.name + ": damaged deflated zip entry");
  return bytes;
}

void put(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

}  // namespace

std::map<std::string, at::Tensor> load_npz(const std::string& path) {
  const MappedFile file(path);
  std::map<std::string, at::Tensor> arrays;
  for (const Member& member : central_directory(file.data(), file.size(), path)) {
    if (member.name.size() < 4 || member.name.compare(member.name.size() - 4, 4, ".npy") != 0) continue;
    const std::vector<std::uint8_t> bytes = member_bytes(file.data(), file.size(), member, path);
    const std::string origin = path + ":" + member.name;
    const NpyHeader header = parse_npy_header(bytes.data(), bytes.size(), origin);
    at::Tensor tensor = at::empty(header.shape, at::TensorOptions().dtype(header.dtype));
    if (header.data_bytes > 0) std::memcpy(tensor.data_ptr(), bytes.data() + header.data_offset, header.data_bytes);
    arrays.emplace(member.name.substr(0, member.name.size() - 4), tensor);
  }
  return arrays;
}

void save_npz(const std::string& path, const std::map<std::string, at::Tensor>& arrays) {
  std::string out, directory;
  std::uint64_t count = 0;
  for (const auto& [name, tensor] : arrays) {
    const at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    std::string member = npy_header_bytes(cpu.scalar_type(), cpu.sizes().vec());
    member.append(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
    const std::string file_name = name + ".npy";
    const auto crc = crc32(0, reinterpret_cast<const Bytef*>(member.data()), static_cast<uInt>(member.size()));
    if (member.size() >= 0xFFFFFFFFull || out.size() >= 0xFFFFFFFFull)
      throw DataError(path, "an array of 4 GB or more is not supported");
    const std::uint64_t offset = out.size();
    put(out, 0x04034b50, 4), put(out, 20, 2), put(out, 0, 2), put(out, 0, 2), put(out, 0, 2), put(out, 0x21, 2);
    put(out, crc, 4), put(out, member.size(), 4), put(out, member.size(), 4), put(out, file_name.size(), 2),
        put(out, 0, 2);
    out += file_name;
    out += member;
    put(directory, 0x02014b50, 4), put(directory, 20, 2), put(directory, 20, 2), put(directory, 0, 2),
        put(directory, 0, 2);
    put(directory, 0, 2), put(directory, 0x21, 2), put(directory, crc, 4), put(directory, member.size(), 4);
    put(directory, member.size(), 4), put(directory, file_name.size(), 2), put(directory, 0, 2), put(directory, 0, 2);
    put(directory, 0, 2), put(directory, 0, 2), put(directory, 0, 4), put(directory, offset, 4);
    directory += file_name;
    ++count;
  }
  const std::uint64_t directory_offset = out.size();
  out += directory;
  put(out, 0x06054b50, 4), put(out, 0, 2), put(out, 0, 2), put(out, count, 2), put(out, count, 2);
  put(out, directory.size(), 4), put(out, directory_offset, 4), put(out, 0, 2);
  try {
    core::AtomicFileWriter file(path);
    file.write(out.data(), out.size(), "the archive");
    file.commit();
  } catch (const core::AtomicFileError& error) {
    throw DataError("", error.what());
  }
}

}  // namespace runner::data
