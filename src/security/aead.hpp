// Authenticated encryption of frame payloads: AES-256-GCM and
// ChaCha20-Poly1305 through OpenSSL EVP, behind one small interface with a
// name-keyed registry. Keys are 32 bytes, nonces 12, tags 16.
//
// A Sealer/Opener holds one key and reuses one EVP context, so per-message
// cost is the cipher itself. Not thread safe: one owner. The key is wiped
// (OPENSSL_cleanse) on rekey and destruction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fedwan::security {

inline constexpr size_t kAeadKeySize = 32;
inline constexpr size_t kAeadNonceSize = 12;
inline constexpr size_t kAeadTagSize = 16;

using AeadKey = std::array<uint8_t, kAeadKeySize>;
using AeadNonce = std::array<uint8_t, kAeadNonceSize>;

enum class AeadAlgorithm : uint8_t { kAes256Gcm = 1, kChaCha20Poly1305 = 2 };
// "aes-256-gcm" | "chacha20-poly1305"; throws ConfigError listing the names.
AeadAlgorithm aead_by_name(const std::string& name);
const char* aead_name(AeadAlgorithm a);
std::vector<std::string> aead_names();

class AeadCipher {
 public:
  AeadCipher(AeadAlgorithm algorithm, const AeadKey& key);
  ~AeadCipher();
  AeadCipher(const AeadCipher&) = delete;
  AeadCipher& operator=(const AeadCipher&) = delete;

  AeadAlgorithm algorithm() const { return algorithm_; }
  // Replaces the key (the old one is wiped).
  void rekey(const AeadKey& key);

  // Encrypts `size` bytes from `in` to `out` (may equal `in`) and writes the
  // tag. `aad` is authenticated, not encrypted. Throws CryptoError only on an
  // OpenSSL failure.
  void seal(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size, const uint8_t* in,
            size_t size, uint8_t* out, uint8_t tag[kAeadTagSize]);
  // Decrypts and verifies; false when the tag does not match (out is then
  // garbage and must not be used). `out` may equal `in`.
  [[nodiscard]] bool open(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size,
                          const uint8_t* in, size_t size, uint8_t* out,
                          const uint8_t tag[kAeadTagSize]);

 private:
  struct Impl;
  AeadAlgorithm algorithm_;
  std::unique_ptr<Impl> impl_;
};

// nonce = iv XOR (0^4 || seq as 8 bytes big-endian), as in TLS 1.3.
AeadNonce nonce_for(const AeadNonce& iv, uint64_t seq);

// One-way key update: HKDF-SHA256-Expand(secret, "fedwan rekey", 32+12) ->
// (next secret and key, next iv). Used for the per-direction ratchet.
void ratchet(AeadKey* key, AeadNonce* iv);

}  // namespace fedwan::security
