// SHA-256 over OpenSSL's EVP interface. Used for topology digests, model and
// checkpoint digests and the audit hash chain. Failures (which OpenSSL reports
// only on allocation failure or a broken provider setup) throw CryptoError.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace fedwan {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest sha256(const void* data, size_t n);

// Incremental hasher. Not thread safe: one owner at a time. Movable, not
// copyable (it owns an OpenSSL digest context).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t n);
  // Returns the digest of everything updated so far and resets the hasher to
  // the empty state, so one object can hash several messages in turn.
  std::array<uint8_t, 32> finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Lower-case hexadecimal, two characters per byte.
std::string to_hex(const uint8_t* data, size_t n);

}  // namespace fedwan
