// Where the privacy noise's randomness comes from (docs/security.md,
// "Differential privacy"): a cryptographic generator (OpenSSL's RAND_bytes,
// a NIST SP 800-90A DRBG seeded by the operating system), read through a
// buffer; and exact uniform integers drawn from it by rejection, so that no
// floating-point value ever stands between the random bits and the noise.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace fedwan::privacy {

using u128 = unsigned __int128;

class RandomSource {
 public:
  virtual ~RandomSource() = default;
  virtual void fill(uint8_t* out, size_t bytes) = 0;

  // Uniform in [0, n), n >= 1: the fewest whole bytes that hold n - 1, drawn
  // again while the value is n or more (at most twice on average).
  uint64_t below(uint64_t n);
  u128 below(u128 n);
  // 1 with probability num / den (0 < den, num <= den), exactly.
  bool bernoulli(u128 num, u128 den) { return below(den) < num; }
};

// OpenSSL's RAND_bytes through a 4 KiB buffer. Not thread safe: one per
// thread that samples. Throws CryptoError when the generator fails.
class CryptoRandom final : public RandomSource {
 public:
  void fill(uint8_t* out, size_t bytes) override;

 private:
  std::array<uint8_t, 4096> buf_{};
  size_t used_ = 4096;
};

// A seeded, reproducible stream (SplitMix64) for tests of the samplers'
// logic and statistics: never for noise that protects anything.
class SeededRandom final : public RandomSource {
 public:
  explicit SeededRandom(uint64_t seed) : state_(seed) {}
  void fill(uint8_t* out, size_t bytes) override;

 private:
  uint64_t state_;
};

}  // namespace fedwan::privacy
