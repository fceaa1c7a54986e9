// AeadCipher's libgcrypt library for AES-256-GCM (security/aead_backend.hpp).
// Compiled with FEDWAN_HAVE_GCRYPT=1 where CMake found libgcrypt; without
// it every entry point says so.
#include <string>

#include "fedwan/error.hpp"
#include "security/aead_backend.hpp"

#if FEDWAN_HAVE_GCRYPT
#include <gcrypt.h>

#include <mutex>
#endif

namespace fedwan::security::backend {

#if FEDWAN_HAVE_GCRYPT
namespace {

constexpr const char* kMinVersion = "1.8.0";

[[noreturn]] void fail(const char* what, gcry_error_t err) {
  throw CryptoError(std::string("libgcrypt ") + what + " failed: " + gcry_strsource(err) + ": " +
                    gcry_strerror(err));
}

void check(gcry_error_t err, const char* what) {
  if (err != 0) fail(what, err);
}

// Initialises libgcrypt as a library should where the program has not:
// version check first (it sets the library up), no secure memory (fedwan's
// keys live in the cipher handle, which libgcrypt wipes when it is closed),
// then initialisation finished. A program that initialised it itself keeps
// its own settings. Returns the version, or nullptr if too old.
const char* initialised() {
  static const char* version = [] {
    const char* v = gcry_check_version(kMinVersion);
    if (v != nullptr && gcry_control(GCRYCTL_INITIALIZATION_FINISHED_P) == 0) {
      gcry_control(GCRYCTL_DISABLE_SECMEM, 0);
      gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
    }
    return v;
  }();
  return version;
}

class GcryptAead final : public AeadBackend {
 public:
  GcryptAead() {
    if (initialised() == nullptr) {
      throw ConfigError(std::string("libgcrypt is older than ") + kMinVersion +
                        "; set FEDWAN_AEAD_LIBRARY=openssl");
    }
    check(gcry_cipher_open(&h_, GCRY_CIPHER_AES256, GCRY_CIPHER_MODE_GCM, 0), "cipher_open");
  }
  ~GcryptAead() override { gcry_cipher_close(h_); }  // wipes the key schedule
  GcryptAead(const GcryptAead&) = delete;
  GcryptAead& operator=(const GcryptAead&) = delete;

  void set_key(const AeadKey& key) override {
    check(gcry_cipher_setkey(h_, key.data(), key.size()), "setkey");
  }

  void seal(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size, const uint8_t* in,
            size_t size, uint8_t* out, uint8_t tag[kAeadTagSize]) override {
    start(nonce, aad, aad_size);
    // In place is libgcrypt's (null input); the last call may end mid-block.
    check(gcry_cipher_final(h_), "final");
    check(in == out ? gcry_cipher_encrypt(h_, out, size, nullptr, 0)
                    : gcry_cipher_encrypt(h_, out, size, in, size),
          "encrypt");
    check(gcry_cipher_gettag(h_, tag, kAeadTagSize), "gettag");
  }

  bool open(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size, const uint8_t* in,
            size_t size, uint8_t* out, const uint8_t tag[kAeadTagSize]) override {
    start(nonce, aad, aad_size);
    check(gcry_cipher_final(h_), "final");
    check(in == out ? gcry_cipher_decrypt(h_, out, size, nullptr, 0)
                    : gcry_cipher_decrypt(h_, out, size, in, size),
          "decrypt");
    const gcry_error_t err = gcry_cipher_checktag(h_, tag, kAeadTagSize);
    // A mismatched tag is an expected outcome on a hostile link.
    if (gcry_err_code(err) == GPG_ERR_CHECKSUM) return false;
    check(err, "checktag");
    return true;
  }

 private:
  // Per message: a new nonce resets the mode's state under the same key.
  void start(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size) {
    check(gcry_cipher_setiv(h_, nonce.data(), nonce.size()), "setiv");
    if (aad_size > 0) check(gcry_cipher_authenticate(h_, aad, aad_size), "authenticate");
  }

  gcry_cipher_hd_t h_ = nullptr;
};

}  // namespace

std::unique_ptr<AeadBackend> gcrypt_aead(AeadAlgorithm algorithm) {
  if (algorithm != AeadAlgorithm::kAes256Gcm) {
    throw ConfigError(std::string("libgcrypt serves aes-256-gcm only, not ") +
                      aead_name(algorithm) + "; set FEDWAN_AEAD_LIBRARY=openssl or auto");
  }
  return std::make_unique<GcryptAead>();
}

bool gcrypt_built_in() { return true; }

bool gcrypt_has_vector_aes() {
  static const bool vector = [] {
    // In FIPS mode libgcrypt does not take a GCM nonce from its caller as
    // an approved service: OpenSSL (and its provider) seals there.
    if (initialised() == nullptr || gcry_fips_mode_active()) return false;
    // The feature libgcrypt takes its AES-GCM VAES/VPCLMULQDQ path on, as
    // its configuration lists what it found and left on.
    char* config = gcry_get_config(0, "hwflist");
    if (config == nullptr) return false;
    const bool on = std::string(config).find("intel-vaes-vpclmul") != std::string::npos;
    gcry_free(config);
    return on;
  }();
  return vector;
}

std::string gcrypt_version() {
  const char* v = initialised();
  return v == nullptr ? std::string() : std::string("libgcrypt ") + v;
}

#else  // !FEDWAN_HAVE_GCRYPT

std::unique_ptr<AeadBackend> gcrypt_aead(AeadAlgorithm /*algorithm*/) {
  throw ConfigError(
      "this fedwan was built without libgcrypt (libgcrypt20-dev); set FEDWAN_AEAD_LIBRARY=openssl "
      "or auto");
}

bool gcrypt_built_in() { return false; }
bool gcrypt_has_vector_aes() { return false; }
std::string gcrypt_version() { return {}; }

#endif

}  // namespace fedwan::security::backend
