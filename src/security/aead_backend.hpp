// The libraries behind AeadCipher (security/aead.hpp): each seals and opens
// with one key and one reused context. Both produce the same bytes for the
// same algorithm, key, nonce and data (the algorithms are standard), so the
// choice between them is one of speed only; tests hold them to the
// published vectors and to each other. Private to security/.
#pragma once

#include <memory>

#include "security/aead.hpp"

namespace fedwan::security::backend {

class AeadBackend {
 public:
  virtual ~AeadBackend() = default;
  virtual void set_key(const AeadKey& key) = 0;
  virtual void seal(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size, const uint8_t* in,
                    size_t size, uint8_t* out, uint8_t tag[kAeadTagSize]) = 0;
  virtual bool open(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size, const uint8_t* in,
                    size_t size, uint8_t* out, const uint8_t tag[kAeadTagSize]) = 0;
};

// OpenSSL EVP: every algorithm. `openssl_name` is the provider's name.
std::unique_ptr<AeadBackend> openssl_aead(const char* openssl_name);

// libgcrypt: AES-256-GCM only. Throws ConfigError where fedwan was built
// without it or the algorithm is another.
std::unique_ptr<AeadBackend> gcrypt_aead(AeadAlgorithm algorithm);

// Whether this build has libgcrypt, and whether libgcrypt runs AES-GCM on
// this CPU with its VAES/VPCLMULQDQ code (32 bytes an instruction), the
// case where it outpaces OpenSSL 3.0's AES-NI code (never in FIPS mode).
bool gcrypt_built_in();
bool gcrypt_has_vector_aes();
// "libgcrypt 1.10.1", or "" where not built in.
std::string gcrypt_version();

}  // namespace fedwan::security::backend
