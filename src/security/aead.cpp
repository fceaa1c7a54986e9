#include "security/aead.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"

namespace fedwan::security {
namespace {

struct AeadEntry {
  AeadAlgorithm algorithm;
  const char* name;          // fedwan's name (configuration, logs)
  const char* openssl_name;  // the provider's algorithm name for EVP_CIPHER_fetch
};

constexpr AeadEntry kAeads[] = {
    {AeadAlgorithm::kAes256Gcm, "aes-256-gcm", "AES-256-GCM"},
    {AeadAlgorithm::kChaCha20Poly1305, "chacha20-poly1305", "ChaCha20-Poly1305"},
};

const AeadEntry& entry(AeadAlgorithm a) {
  for (const AeadEntry& e : kAeads) {
    if (e.algorithm == a) return e;
  }
  throw ConfigError("unknown AEAD algorithm id " + std::to_string(static_cast<int>(a)) +
                    "; valid ids are 1 (aes-256-gcm) and 2 (chacha20-poly1305)");
}

// EVP lengths are int; larger buffers go through in pieces (both ciphers are
// stream modes, so splitting changes nothing in the output).
constexpr size_t kMaxUpdate = size_t{1} << 30;

void update(EVP_CIPHER_CTX* ctx, const uint8_t* in, size_t size, uint8_t* out) {
  while (size > 0) {
    const int n = static_cast<int>(std::min(size, kMaxUpdate));
    int outl = 0;
    FEDWAN_OPENSSL_CHECK(EVP_CipherUpdate(ctx, out, &outl, in, n));
    if (out != nullptr && outl != n) {
      throw CryptoError("EVP_CipherUpdate produced " + std::to_string(outl) + " of " +
                        std::to_string(n) + " bytes of a stream cipher");
    }
    in += n;
    if (out != nullptr) out += n;
    size -= size_t(n);
  }
}

}  // namespace

AeadAlgorithm aead_by_name(const std::string& name) {
  for (const AeadEntry& e : kAeads) {
    if (name == e.name) return e.algorithm;
  }
  std::string known;
  for (const AeadEntry& e : kAeads) known += std::string(known.empty() ? "" : ", ") + e.name;
  throw ConfigError("unknown cipher '" + name + "'; valid ciphers are: " + known);
}

const char* aead_name(AeadAlgorithm a) { return entry(a).name; }

std::vector<std::string> aead_names() {
  std::vector<std::string> out;
  for (const AeadEntry& e : kAeads) out.emplace_back(e.name);
  return out;
}

// The EVP context holds the only copy of the key (as its key schedule):
// rekey() overwrites it in place and EVP_CIPHER_CTX_free cleanses it, so
// AeadCipher keeps no key bytes of its own to wipe. The direction flag is
// switched per message with the IV, which re-initialises nothing else: both
// modes use the same key schedule to encrypt and to decrypt.
struct AeadCipher::Impl {
  detail::OpenSslPtr<EVP_CIPHER, EVP_CIPHER_free> cipher;
  detail::OpenSslPtr<EVP_CIPHER_CTX, EVP_CIPHER_CTX_free> ctx;

  explicit Impl(const AeadEntry& e)
      : cipher(detail::openssl_check_ptr(EVP_CIPHER_fetch(nullptr, e.openssl_name, nullptr),
                                         "EVP_CIPHER_fetch")),
        ctx(detail::openssl_check_ptr(EVP_CIPHER_CTX_new(), "EVP_CIPHER_CTX_new")) {
    if (EVP_CIPHER_get_key_length(cipher.get()) != int(kAeadKeySize) ||
        EVP_CIPHER_get_iv_length(cipher.get()) != int(kAeadNonceSize)) {
      throw CryptoError(std::string("OpenSSL's ") + e.openssl_name +
                        " does not use 32-byte keys and 12-byte nonces");
    }
    FEDWAN_OPENSSL_CHECK(EVP_CipherInit_ex(ctx.get(), cipher.get(), nullptr, nullptr, nullptr, 1));
  }

  void set_key(const AeadKey& key) {
    FEDWAN_OPENSSL_CHECK(EVP_CipherInit_ex(ctx.get(), nullptr, nullptr, key.data(), nullptr, -1));
  }

  // Per message: only the nonce and the direction change.
  void start(const AeadNonce& nonce, int enc, const uint8_t* aad, size_t aad_size) {
    FEDWAN_OPENSSL_CHECK(
        EVP_CipherInit_ex(ctx.get(), nullptr, nullptr, nullptr, nonce.data(), enc));
    update(ctx.get(), aad, aad_size, nullptr);
  }
};

AeadCipher::AeadCipher(AeadAlgorithm algorithm, const AeadKey& key)
    : algorithm_(algorithm), impl_(std::make_unique<Impl>(entry(algorithm))) {
  impl_->set_key(key);
}

AeadCipher::~AeadCipher() = default;

void AeadCipher::rekey(const AeadKey& key) { impl_->set_key(key); }

void AeadCipher::seal(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size,
                      const uint8_t* in, size_t size, uint8_t* out, uint8_t tag[kAeadTagSize]) {
  EVP_CIPHER_CTX* ctx = impl_->ctx.get();
  impl_->start(nonce, 1, aad, aad_size);
  update(ctx, in, size, out);
  int outl = 0;
  FEDWAN_OPENSSL_CHECK(EVP_CipherFinal_ex(ctx, out + size, &outl));
  FEDWAN_OPENSSL_CHECK(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, int(kAeadTagSize), tag));
}

bool AeadCipher::open(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size,
                      const uint8_t* in, size_t size, uint8_t* out,
                      const uint8_t tag[kAeadTagSize]) {
  EVP_CIPHER_CTX* ctx = impl_->ctx.get();
  impl_->start(nonce, 0, aad, aad_size);
  update(ctx, in, size, out);
  // SET_TAG only copies the tag into the context; the cast is OpenSSL's API.
  FEDWAN_OPENSSL_CHECK(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, int(kAeadTagSize),
                                           const_cast<uint8_t*>(tag)));
  int outl = 0;
  if (EVP_CipherFinal_ex(ctx, out + size, &outl) <= 0) {
    // A mismatched tag is an expected outcome on a hostile link, not an
    // OpenSSL failure: leave nothing in this thread's error queue for the
    // next, unrelated check to report.
    ERR_clear_error();
    return false;
  }
  return true;
}

AeadNonce nonce_for(const AeadNonce& iv, uint64_t seq) {
  AeadNonce n = iv;
  for (int i = 0; i < 8; ++i) n[kAeadNonceSize - 1 - i] ^= static_cast<uint8_t>(seq >> (8 * i));
  return n;
}

void ratchet(AeadKey* key, AeadNonce* iv) {
  static constexpr char kInfo[] = "fedwan rekey";
  detail::OpenSslPtr<EVP_KDF, EVP_KDF_free> kdf(
      detail::openssl_check_ptr(EVP_KDF_fetch(nullptr, "HKDF", nullptr), "EVP_KDF_fetch(HKDF)"));
  detail::OpenSslPtr<EVP_KDF_CTX, EVP_KDF_CTX_free> kctx(
      detail::openssl_check_ptr(EVP_KDF_CTX_new(kdf.get()), "EVP_KDF_CTX_new"));
  int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, key->data(), key->size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(kInfo),
                                        sizeof(kInfo) - 1),
      OSSL_PARAM_construct_end(),
  };
  uint8_t out[kAeadKeySize + kAeadNonceSize];
  try {
    FEDWAN_OPENSSL_CHECK(EVP_KDF_derive(kctx.get(), out, sizeof(out), params));
  } catch (...) {
    OPENSSL_cleanse(out, sizeof(out));
    throw;
  }
  OPENSSL_cleanse(key->data(), key->size());
  std::memcpy(key->data(), out, kAeadKeySize);
  std::memcpy(iv->data(), out + kAeadKeySize, kAeadNonceSize);
  OPENSSL_cleanse(out, sizeof(out));
}

}  // namespace fedwan::security
