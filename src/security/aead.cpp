#include "security/aead.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/opensslv.h>
#include <openssl/params.h>

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"
#include "security/aead_backend.hpp"

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

// Whether OpenSSL has a vector AES-GCM of its own here: its AVX-512
// VAES/VPCLMULQDQ code came with 3.1 and needs AVX-512 (F, VL, BW) on the
// CPU (CPUID leaf 7).
bool openssl_has_vector_aes() {
  if (OpenSSL_version_num() < 0x30100000L) return false;
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool avx512 =
      (ebx & (1u << 16)) != 0 && (ebx & (1u << 30)) != 0 && (ebx & (1u << 31)) != 0;  // F, BW, VL
  const bool vector_aes = (ecx & (1u << 9)) != 0 && (ecx & (1u << 10)) != 0;  // VAES, VPCLMULQDQ
  return avx512 && vector_aes;
#else
  return false;
#endif
}

AeadLibrary library_from_environment() {
  const char* env = std::getenv("FEDWAN_AEAD_LIBRARY");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return AeadLibrary::kAuto;
  if (std::strcmp(env, "openssl") == 0) return AeadLibrary::kOpenSsl;
  if (std::strcmp(env, "libgcrypt") == 0) return AeadLibrary::kGcrypt;
  throw ConfigError(std::string("FEDWAN_AEAD_LIBRARY=") + env +
                    ": valid values are auto, openssl and libgcrypt");
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

const char* aead_library_name(AeadLibrary library) {
  switch (library) {
    case AeadLibrary::kOpenSsl: return "openssl";
    case AeadLibrary::kGcrypt: return "libgcrypt";
    case AeadLibrary::kAuto: break;
  }
  return "auto";
}

AeadLibrary aead_library_for(AeadAlgorithm algorithm) {
  (void)entry(algorithm);                                 // an unknown algorithm is named as such
  const AeadLibrary chosen = library_from_environment();  // checked whatever the algorithm
  if (algorithm != AeadAlgorithm::kAes256Gcm) return AeadLibrary::kOpenSsl;
  if (chosen != AeadLibrary::kAuto) return chosen;
  const bool gcrypt_faster = backend::gcrypt_has_vector_aes() && !openssl_has_vector_aes();
  return gcrypt_faster ? AeadLibrary::kGcrypt : AeadLibrary::kOpenSsl;
}

std::string aead_description(AeadAlgorithm algorithm) {
  const AeadLibrary library = aead_library_for(algorithm);
  std::string out = std::string(aead_name(algorithm)) + " by ";
  if (library == AeadLibrary::kGcrypt) {
    out += backend::gcrypt_version();
    if (backend::gcrypt_has_vector_aes()) out += " (VAES)";
  } else {
    out += OpenSSL_version(OPENSSL_VERSION);
  }
  return out;
}

AeadCipher::AeadCipher(AeadAlgorithm algorithm, const AeadKey& key, AeadLibrary library)
    : algorithm_(algorithm),
      library_(library == AeadLibrary::kAuto ? aead_library_for(algorithm) : library),
      impl_(library_ == AeadLibrary::kGcrypt
                ? backend::gcrypt_aead(algorithm)
                : backend::openssl_aead(entry(algorithm).openssl_name)) {
  impl_->set_key(key);
}

AeadCipher::~AeadCipher() = default;

void AeadCipher::rekey(const AeadKey& key) { impl_->set_key(key); }

void AeadCipher::seal(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size,
                      const uint8_t* in, size_t size, uint8_t* out, uint8_t tag[kAeadTagSize]) {
  impl_->seal(nonce, aad, aad_size, in, size, out, tag);
}

bool AeadCipher::open(const AeadNonce& nonce, const uint8_t* aad, size_t aad_size,
                      const uint8_t* in, size_t size, uint8_t* out,
                      const uint8_t tag[kAeadTagSize]) {
  return impl_->open(nonce, aad, aad_size, in, size, out, tag);
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
