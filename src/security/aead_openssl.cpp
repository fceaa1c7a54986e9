// AeadCipher's OpenSSL library (security/aead_backend.hpp).
#include <openssl/evp.h>

#include <algorithm>
#include <climits>
#include <string>

#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"
#include "security/aead_backend.hpp"

namespace fedwan::security::backend {
namespace {

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

// The EVP context holds the only copy of the key (as its key schedule):
// set_key() overwrites it in place and EVP_CIPHER_CTX_free cleanses it. The
// direction flag is switched per message with the IV, which re-initialises
// nothing else: both modes use the same key schedule to encrypt and to
// decrypt.
class OpenSslAead final : public AeadBackend {
 public:
  explicit OpenSslAead(const char* openssl_name)
      : cipher_(::fedwan::detail::openssl_check_ptr(
            EVP_CIPHER_fetch(nullptr, openssl_name, nullptr), "EVP_CIPHER_fetch")),
        ctx_(::fedwan::detail::openssl_check_ptr(EVP_CIPHER_CTX_new(), "EVP_CIPHER_CTX_new")) {
    if (EVP_CIPHER_get_key_length(cipher_.get()) != int(kAeadKeySize) ||
        EVP_CIPHER_get_iv_length(cipher_.get()) != int(kAeadNonceSize)) {
      throw CryptoError(std::string("OpenSSL's ") + openssl_name +
                        " does not use 32-byte keys and 12-byte nonces");
    }
    FEDWAN_OPENSSL_CHECK(
        EVP_CipherInit_ex(ctx_.get(), cipher_.get(), nullptr, nullptr, nullptr, 1));
  }

  void set_key(const AeadKey& key) override {
    FEDWAN_OPENSSL_CHECK(EVP_CipherInit_ex(ctx_.get(), nullptr, nullptr, key.data(), nullptr, -1));
  }

  void seal(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size, const uint8_t* in,
            size_t size, uint8_t* out, uint8_t tag[kAeadTagSize]) override {
    start(nonce, 1, aad, aad_size);
    update(ctx_.get(), in, size, out);
    int outl = 0;
    FEDWAN_OPENSSL_CHECK(EVP_CipherFinal_ex(ctx_.get(), out + size, &outl));
    FEDWAN_OPENSSL_CHECK(
        EVP_CIPHER_CTX_ctrl(ctx_.get(), EVP_CTRL_AEAD_GET_TAG, int(kAeadTagSize), tag));
  }

  bool open(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size, const uint8_t* in,
            size_t size, uint8_t* out, const uint8_t tag[kAeadTagSize]) override {
    start(nonce, 0, aad, aad_size);
    update(ctx_.get(), in, size, out);
    // SET_TAG only copies the tag into the context; the cast is OpenSSL's API.
    FEDWAN_OPENSSL_CHECK(EVP_CIPHER_CTX_ctrl(ctx_.get(), EVP_CTRL_AEAD_SET_TAG, int(kAeadTagSize),
                                             const_cast<uint8_t*>(tag)));
    int outl = 0;
    if (EVP_CipherFinal_ex(ctx_.get(), out + size, &outl) <= 0) {
      // A mismatched tag is an expected outcome on a hostile link, not an
      // OpenSSL failure: leave nothing in this thread's error queue for the
      // next, unrelated check to report.
      ERR_clear_error();
      return false;
    }
    return true;
  }

 private:
  // Per message: only the nonce and the direction change.
  void start(const AeadNonce& nonce, int enc, const uint8_t* aad, size_t aad_size) {
    FEDWAN_OPENSSL_CHECK(
        EVP_CipherInit_ex(ctx_.get(), nullptr, nullptr, nullptr, nonce.data(), enc));
    update(ctx_.get(), aad, aad_size, nullptr);
  }

  ::fedwan::detail::OpenSslPtr<EVP_CIPHER, EVP_CIPHER_free> cipher_;
  ::fedwan::detail::OpenSslPtr<EVP_CIPHER_CTX, EVP_CIPHER_CTX_free> ctx_;
};

}  // namespace

std::unique_ptr<AeadBackend> openssl_aead(const char* openssl_name) {
  return std::make_unique<OpenSslAead>(openssl_name);
}

}  // namespace fedwan::security::backend
