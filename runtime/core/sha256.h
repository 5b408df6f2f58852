// SHA-256 digests (OpenSSL's libcrypto) of byte strings and files, as lowercase hex.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace runner::core {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t bytes);
  // The hex digest; the object is then spent.
  std::string hex_digest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string sha256_hex(std::string_view bytes);
// Throws std::runtime_error "<path>: <reason>" when the file cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace runner::core
