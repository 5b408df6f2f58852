// Counter-based random numbers: a stream per (seed, epoch, index), independent of threads and restarts.
#pragma once

#include <cstdint>

namespace runner::core {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class SampleRng {
 public:
  SampleRng(std::uint64_t seed, std::uint64_t stream, std::uint64_t index)
      : state_(splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index)) {}
  std::uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return splitmix64(state_);
  }
  // Uniform in [0, bound) without modulo bias (Lemire's method with rejection).
  std::uint64_t below(std::uint64_t bound) {
    if (bound <= 1) return 0;
    while (true) {
      const unsigned __int128 product = static_cast<unsigned __int128>(next()) * bound;
      const std::uint64_t low = static_cast<std::uint64_t>(product);
      if (low >= (-bound) % bound) return static_cast<std::uint64_t>(product >> 64);
    }
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

}  // namespace runner::core
