#include "privacy/random_source.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

#include "fedwan/error.hpp"

namespace fedwan::privacy {
namespace {

int bytes_for(u128 max) {
  int bytes = 0;
  while (max != 0) {
    ++bytes;
    max >>= 8;
  }
  return bytes;
}

template <typename T>
T uniform_below(RandomSource& rng, T n) {
  if (n <= 1) return 0;
  const T max = n - 1;
  const int bytes = bytes_for(max);
  // The smallest all-ones mask over max: values above it are never drawn,
  // so a draw is rejected with probability below one half.
  T mask = max;
  for (int shift = 1; shift < static_cast<int>(8 * sizeof(T)); shift <<= 1) mask |= mask >> shift;
  for (;;) {
    uint8_t raw[16];
    rng.fill(raw, static_cast<size_t>(bytes));
    T v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | raw[i];
    v &= mask;
    if (v <= max) return v;
  }
}

}  // namespace

uint64_t RandomSource::below(uint64_t n) { return uniform_below<uint64_t>(*this, n); }
u128 RandomSource::below(u128 n) { return uniform_below<u128>(*this, n); }

void CryptoRandom::fill(uint8_t* out, size_t bytes) {
  while (bytes > 0) {
    if (used_ == buf_.size()) {
      if (RAND_bytes(buf_.data(), static_cast<int>(buf_.size())) != 1) {
        throw CryptoError("the cryptographic random generator failed (RAND_bytes)");
      }
      used_ = 0;
    }
    const size_t n = std::min(bytes, buf_.size() - used_);
    std::memcpy(out, buf_.data() + used_, n);
    // What was handed out is not kept.
    std::memset(buf_.data() + used_, 0, n);
    used_ += n;
    out += n;
    bytes -= n;
  }
}

void SeededRandom::fill(uint8_t* out, size_t bytes) {
  while (bytes > 0) {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const size_t n = std::min<size_t>(bytes, 8);
    std::memcpy(out, &z, n);
    out += n;
    bytes -= n;
  }
}

}  // namespace fedwan::privacy
