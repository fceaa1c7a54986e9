// The two libraries behind AeadCipher (OpenSSL and libgcrypt for
// AES-256-GCM) seal the same bytes and open each other's frames, and the
// choice between them follows FEDWAN_AEAD_LIBRARY. The published vectors
// are checked against each library in test_aead.cpp.
#include <gtest/gtest.h>
#include <openssl/crypto.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "security/aead.hpp"
#include "security/aead_backend.hpp"

namespace fedwan::security {
namespace {

using Bytes = std::vector<uint8_t>;

// Sets FEDWAN_AEAD_LIBRARY for one scope and puts back what was there.
class AeadLibraryEnv {
 public:
  explicit AeadLibraryEnv(const char* value) {
    if (const char* old = std::getenv(kName)) old_ = old;
    if (value == nullptr) {
      ::unsetenv(kName);
    } else {
      ::setenv(kName, value, 1);
    }
  }
  ~AeadLibraryEnv() {
    if (old_) {
      ::setenv(kName, old_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }
  AeadLibraryEnv(const AeadLibraryEnv&) = delete;
  AeadLibraryEnv& operator=(const AeadLibraryEnv&) = delete;

 private:
  static constexpr const char* kName = "FEDWAN_AEAD_LIBRARY";
  std::optional<std::string> old_;
};

AeadKey test_key() {
  AeadKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = uint8_t(i * 29 + 11);
  return key;
}

Bytes pattern(size_t size, uint8_t seed) {
  Bytes out(size);
  for (size_t i = 0; i < size; ++i) out[i] = uint8_t(i * 131 + seed + (i >> 9));
  return out;
}

class AeadLibraries : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!backend::gcrypt_built_in()) GTEST_SKIP() << "built without libgcrypt";
  }
};

// Sizes around the block (16), libgcrypt's bulk stride and a frame of 1
// MiB, in place and not, with and without associated data: the same
// ciphertext and tag from both, and each opens the other's.
TEST_F(AeadLibraries, EachOpensWhatTheOtherSealsAndBothSealAlike) {
  AeadCipher openssl(AeadAlgorithm::kAes256Gcm, test_key(), AeadLibrary::kOpenSsl);
  AeadCipher gcrypt(AeadAlgorithm::kAes256Gcm, test_key(), AeadLibrary::kGcrypt);
  ASSERT_EQ(openssl.library(), AeadLibrary::kOpenSsl);
  ASSERT_EQ(gcrypt.library(), AeadLibrary::kGcrypt);
  const Bytes header = pattern(76, 3);
  uint64_t seq = 0;
  for (size_t size : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(255),
                      size_t(4095), size_t(65537), size_t(1 << 20) + 3}) {
    for (bool in_place : {true, false}) {
      for (size_t aad_size : {size_t(0), header.size()}) {
        SCOPED_TRACE("size " + std::to_string(size) + (in_place ? " in place" : " copied") +
                     " aad " + std::to_string(aad_size));
        const AeadNonce nonce = nonce_for(AeadNonce{1, 2, 3, 4}, seq++);
        const Bytes plain = pattern(size, uint8_t(seq));
        Bytes by_openssl = plain, by_gcrypt = plain, out(size);
        uint8_t tag_openssl[kAeadTagSize], tag_gcrypt[kAeadTagSize];
        openssl.seal(nonce, header.data(), aad_size, by_openssl.data(), size,
                     in_place ? by_openssl.data() : out.data(), tag_openssl);
        if (!in_place) by_openssl = out;
        gcrypt.seal(nonce, header.data(), aad_size, by_gcrypt.data(), size,
                    in_place ? by_gcrypt.data() : out.data(), tag_gcrypt);
        if (!in_place) by_gcrypt = out;
        ASSERT_EQ(by_gcrypt, by_openssl);
        ASSERT_EQ(Bytes(tag_gcrypt, tag_gcrypt + kAeadTagSize),
                  Bytes(tag_openssl, tag_openssl + kAeadTagSize));
        Bytes back(size);
        ASSERT_TRUE(gcrypt.open(nonce, header.data(), aad_size, by_openssl.data(), size,
                                back.data(), tag_openssl));
        EXPECT_EQ(back, plain);
        ASSERT_TRUE(openssl.open(nonce, header.data(), aad_size, by_gcrypt.data(), size,
                                 by_gcrypt.data(), tag_gcrypt));
        EXPECT_EQ(by_gcrypt, plain);
      }
    }
  }
}

// One handle through many messages, a refused one among them, and a new
// key: every later message still seals as OpenSSL does.
TEST_F(AeadLibraries, AHandleStaysRightThroughRefusalsAndRekeys) {
  AeadCipher openssl(AeadAlgorithm::kAes256Gcm, test_key(), AeadLibrary::kOpenSsl);
  AeadCipher gcrypt(AeadAlgorithm::kAes256Gcm, test_key(), AeadLibrary::kGcrypt);
  for (uint64_t seq = 0; seq < 12; ++seq) {
    SCOPED_TRACE(seq);
    if (seq == 6) {
      AeadKey next = test_key();
      next[0] ^= 0x80;
      openssl.rekey(next);
      gcrypt.rekey(next);
    }
    const AeadNonce nonce = nonce_for(AeadNonce{9}, seq);
    Bytes a = pattern(1000 + seq * 7, uint8_t(seq)), b = a;
    uint8_t ta[kAeadTagSize], tb[kAeadTagSize];
    openssl.seal(nonce, nullptr, 0, a.data(), a.size(), a.data(), ta);
    gcrypt.seal(nonce, nullptr, 0, b.data(), b.size(), b.data(), tb);
    ASSERT_EQ(a, b);
    ASSERT_EQ(Bytes(ta, ta + kAeadTagSize), Bytes(tb, tb + kAeadTagSize));
    Bytes forged = b;
    forged[seq] ^= 1;
    Bytes out(forged.size());
    EXPECT_FALSE(gcrypt.open(nonce, nullptr, 0, forged.data(), forged.size(), out.data(), tb));
  }
}

TEST(AeadLibraryChoice, TheEnvironmentChoosesForAesGcm) {
  {
    AeadLibraryEnv env("openssl");
    EXPECT_EQ(aead_library_for(AeadAlgorithm::kAes256Gcm), AeadLibrary::kOpenSsl);
    EXPECT_EQ(AeadCipher(AeadAlgorithm::kAes256Gcm, AeadKey{}).library(), AeadLibrary::kOpenSsl);
  }
  {
    AeadLibraryEnv env("libgcrypt");
    EXPECT_EQ(aead_library_for(AeadAlgorithm::kAes256Gcm), AeadLibrary::kGcrypt);
    // ChaCha20-Poly1305 is OpenSSL's whatever the choice for AES.
    EXPECT_EQ(aead_library_for(AeadAlgorithm::kChaCha20Poly1305), AeadLibrary::kOpenSsl);
    if (backend::gcrypt_built_in()) {
      EXPECT_EQ(AeadCipher(AeadAlgorithm::kAes256Gcm, AeadKey{}).library(), AeadLibrary::kGcrypt);
    } else {
      try {
        AeadCipher c(AeadAlgorithm::kAes256Gcm, AeadKey{});
        FAIL() << "no ConfigError";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("libgcrypt20-dev"), std::string::npos) << e.what();
      }
    }
  }
  {
    AeadLibraryEnv env(nullptr);
    const AeadLibrary expected = aead_library_for(AeadAlgorithm::kAes256Gcm);
    EXPECT_EQ(AeadCipher(AeadAlgorithm::kAes256Gcm, AeadKey{}).library(), expected);
    if (!backend::gcrypt_has_vector_aes()) {
      EXPECT_EQ(expected, AeadLibrary::kOpenSsl);
    } else if (OpenSSL_version_num() < 0x30100000L) {
      // OpenSSL before 3.1 has no vector AES-GCM: libgcrypt's is faster.
      EXPECT_EQ(expected, AeadLibrary::kGcrypt);
    }
    const std::string described = aead_description(AeadAlgorithm::kAes256Gcm);
    EXPECT_EQ(described.rfind("aes-256-gcm by ", 0), 0u) << described;
    EXPECT_NE(described.find(expected == AeadLibrary::kGcrypt ? "libgcrypt" : "OpenSSL"),
              std::string::npos)
        << described;
  }
}

TEST(AeadLibraryChoice, AnUnknownLibraryIsAConfigErrorThatListsTheValidOnes) {
  AeadLibraryEnv env("boringssl");
  try {
    AeadCipher c(AeadAlgorithm::kAes256Gcm, AeadKey{});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("FEDWAN_AEAD_LIBRARY=boringssl"), std::string::npos) << what;
    EXPECT_NE(what.find("auto, openssl and libgcrypt"), std::string::npos) << what;
  }
}

TEST(AeadLibraryChoice, LibgcryptIsNotAskedForChaCha) {
  try {
    AeadCipher c(AeadAlgorithm::kChaCha20Poly1305, AeadKey{}, AeadLibrary::kGcrypt);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("chacha20-poly1305"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fedwan::security
