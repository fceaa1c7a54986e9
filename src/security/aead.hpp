// Authenticated encryption of frame payloads: AES-256-GCM and
// ChaCha20-Poly1305, behind one small interface with a name-keyed registry.
// Keys are 32 bytes, nonces 12, tags 16.
//
// Two libraries can do the work, with the same bytes out (tests hold both
// to the published vectors and to each other): OpenSSL EVP (every
// algorithm) and, where fedwan was built with it, libgcrypt for
// AES-256-GCM, whose VAES/VPCLMULQDQ code seals 32 bytes an instruction on
// CPUs that have it (AMD Zen 3 and later, Intel Ice Lake and later), where
// OpenSSL 3.0 has only its 16-byte AES-NI code. See aead_library_for().
//
// An AeadCipher holds one key and reuses one context, so per-message cost
// is the cipher itself. Not thread safe: one owner. The key schedule is
// wiped on rekey and destruction (by the library that holds it).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fedwan::security {
namespace backend {
class AeadBackend;
}

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

enum class AeadLibrary : uint8_t { kAuto = 0, kOpenSsl = 1, kGcrypt = 2 };
// "openssl" | "libgcrypt" ("auto" for kAuto).
const char* aead_library_name(AeadLibrary library);

// The library a cipher of `algorithm` made with kAuto uses. ChaCha20-
// Poly1305 is OpenSSL's. For AES-256-GCM the environment variable
// FEDWAN_AEAD_LIBRARY decides when set ("openssl", "libgcrypt" or "auto";
// anything else is a ConfigError, as is libgcrypt in a build without it,
// when the cipher is made). Auto is libgcrypt where it runs its vector AES
// code on this CPU and OpenSSL has none (OpenSSL before 3.1, or a CPU
// without AVX-512), OpenSSL otherwise.
AeadLibrary aead_library_for(AeadAlgorithm algorithm);
// One line for logs and benchmarks: "aes-256-gcm by libgcrypt 1.10.1 (VAES)".
std::string aead_description(AeadAlgorithm algorithm);

class AeadCipher {
 public:
  AeadCipher(AeadAlgorithm algorithm, const AeadKey& key, AeadLibrary library = AeadLibrary::kAuto);
  ~AeadCipher();
  AeadCipher(const AeadCipher&) = delete;
  AeadCipher& operator=(const AeadCipher&) = delete;

  AeadAlgorithm algorithm() const { return algorithm_; }
  // The library this cipher seals with (never kAuto).
  AeadLibrary library() const { return library_; }
  // Replaces the key (the old one is wiped).
  void rekey(const AeadKey& key);

  // Encrypts `size` bytes from `in` to `out` (may equal `in`) and writes the
  // tag. `aad` is authenticated, not encrypted. Throws CryptoError only on a
  // failure of the library.
  void seal(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size, const uint8_t* in,
            size_t size, uint8_t* out, uint8_t tag[kAeadTagSize]);
  // Decrypts and verifies; false when the tag does not match (out is then
  // garbage and must not be used). `out` may equal `in`.
  [[nodiscard]] bool open(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size,
                          const uint8_t* in, size_t size, uint8_t* out,
                          const uint8_t tag[kAeadTagSize]);

 private:
  AeadAlgorithm algorithm_;
  AeadLibrary library_;
  std::unique_ptr<backend::AeadBackend> impl_;
};

// nonce = iv XOR (0^4 || seq as 8 bytes big-endian), as in TLS 1.3.
AeadNonce nonce_for(const AeadNonce& iv, uint64_t seq);

// One-way key update: HKDF-SHA256-Expand(secret, "fedwan rekey", 32+12) ->
// (next secret and key, next iv). Used for the per-direction ratchet.
void ratchet(AeadKey* key, AeadNonce* iv);

}  // namespace fedwan::security
