#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "security/aead.hpp"
#include "security/aead_backend.hpp"

namespace fedwan::security {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes from_hex(const std::string& hex) {
  Bytes out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = uint8_t(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

template <size_t N>
std::array<uint8_t, N> array_from_hex(const std::string& hex) {
  const Bytes b = from_hex(hex);
  std::array<uint8_t, N> out{};
  EXPECT_EQ(b.size(), N);
  std::copy(b.begin(), b.end(), out.begin());
  return out;
}

std::string hex(const uint8_t* p, size_t n) { return to_hex(p, n); }
std::string hex(const Bytes& b) { return to_hex(b.data(), b.size()); }

struct KnownAnswer {
  const char* label;
  AeadAlgorithm algorithm;
  const char* key;
  const char* nonce;
  const char* aad;
  const char* plaintext;  // hex
  const char* ciphertext;
  const char* tag;
};

std::string ascii_hex(const std::string& s) {
  return to_hex(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// RFC 8439 section 2.8.2 (the "sunscreen" AEAD example) and the GCM
// specification's Test Case 16 (McGrew and Viega, the AES-256 case with
// associated data, as published with NIST SP 800-38D).
std::vector<KnownAnswer> known_answers() {
  static const std::string kSunscreen = ascii_hex(
      "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the "
      "future, sunscreen would be it.");
  return {
      {"rfc8439_2_8_2", AeadAlgorithm::kChaCha20Poly1305,
       "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f",
       "070000004041424344454647", "50515253c0c1c2c3c4c5c6c7", kSunscreen.c_str(),
       "d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d63dbea45e8ca9671282fafb69"
       "da92728b1a71de0a9e060b2905d6a5b67ecd3b3692ddbd7f2d778b8c9803aee328091b58fab324e4fad675945"
       "585808b4831d7bc3ff4def08e4b7a9de576d26586cec64b6116",
       "1ae10b594f09e26a7e902ecbd0600691"},
      {"gcm_spec_test_case_16", AeadAlgorithm::kAes256Gcm,
       "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
       "cafebabefacedbaddecaf888", "feedfacedeadbeeffeedfacedeadbeefabaddad2",
       "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e24"
       "49a6b525b16aedf5aa0de657ba637b39",
       "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b10"
       "56828838c5f61e6393ba7a0abcc9f662",
       "76fc6ece0f4e1768cddf8853bb2d551b"},
  };
}

// Every library that serves `a` in this build: OpenSSL always, libgcrypt
// for AES-256-GCM where built in (whatever this CPU's vector AES).
std::vector<AeadLibrary> libraries_for(AeadAlgorithm a) {
  std::vector<AeadLibrary> out{AeadLibrary::kOpenSsl};
  if (a == AeadAlgorithm::kAes256Gcm && backend::gcrypt_built_in()) {
    out.push_back(AeadLibrary::kGcrypt);
  }
  return out;
}

TEST(AeadRegistry, NamesRoundTrip) {
  EXPECT_EQ(aead_names(), (std::vector<std::string>{"aes-256-gcm", "chacha20-poly1305"}));
  for (const std::string& name : aead_names()) EXPECT_EQ(aead_name(aead_by_name(name)), name);
  EXPECT_EQ(aead_by_name("aes-256-gcm"), AeadAlgorithm::kAes256Gcm);
  EXPECT_EQ(aead_by_name("chacha20-poly1305"), AeadAlgorithm::kChaCha20Poly1305);
}

TEST(AeadRegistry, UnknownNameListsTheValidOnes) {
  try {
    aead_by_name("aes-128-cbc");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("aes-128-cbc"), std::string::npos) << what;
    EXPECT_NE(what.find("aes-256-gcm"), std::string::npos) << what;
    EXPECT_NE(what.find("chacha20-poly1305"), std::string::npos) << what;
  }
  EXPECT_THROW(AeadCipher(static_cast<AeadAlgorithm>(9), AeadKey{}), ConfigError);
}

TEST(AeadKnownAnswer, SealMatchesPublishedVectors) {
  for (const KnownAnswer& v : known_answers()) {
    for (AeadLibrary library : libraries_for(v.algorithm)) {
      SCOPED_TRACE(std::string(v.label) + " by " + aead_library_name(library));
      AeadCipher c(v.algorithm, array_from_hex<kAeadKeySize>(v.key), library);
      const Bytes aad = from_hex(v.aad), pt = from_hex(v.plaintext);
      Bytes ct(pt.size());
      uint8_t tag[kAeadTagSize];
      c.seal(array_from_hex<kAeadNonceSize>(v.nonce), aad.data(), aad.size(), pt.data(), pt.size(),
             ct.data(), tag);
      EXPECT_EQ(hex(ct), v.ciphertext);
      EXPECT_EQ(hex(tag, sizeof(tag)), v.tag);
    }
  }
}

TEST(AeadKnownAnswer, OpenRecoversPublishedPlaintextInPlace) {
  for (const KnownAnswer& v : known_answers()) {
    for (AeadLibrary library : libraries_for(v.algorithm)) {
      SCOPED_TRACE(std::string(v.label) + " by " + aead_library_name(library));
      AeadCipher c(v.algorithm, array_from_hex<kAeadKeySize>(v.key), library);
      const Bytes aad = from_hex(v.aad), tag = from_hex(v.tag);
      Bytes buf = from_hex(v.ciphertext);
      ASSERT_TRUE(c.open(array_from_hex<kAeadNonceSize>(v.nonce), aad.data(), aad.size(),
                         buf.data(), buf.size(), buf.data(), tag.data()));
      EXPECT_EQ(hex(buf), v.plaintext);
    }
  }
}

// Every single-bit flip of ciphertext, associated data or tag is refused,
// without an exception and without disturbing the next genuine message.
TEST(AeadKnownAnswer, EveryBitFlipIsRefused) {
  for (const KnownAnswer& v : known_answers()) {
    for (AeadLibrary library : libraries_for(v.algorithm)) {
      SCOPED_TRACE(std::string(v.label) + " by " + aead_library_name(library));
      AeadCipher c(v.algorithm, array_from_hex<kAeadKeySize>(v.key), library);
      const AeadNonce nonce = array_from_hex<kAeadNonceSize>(v.nonce);
      const Bytes aad = from_hex(v.aad), ct = from_hex(v.ciphertext), tag = from_hex(v.tag);
      auto opens = [&](const Bytes& a, const Bytes& x, const Bytes& t) {
        Bytes out(x.size());
        return c.open(nonce, a.data(), a.size(), x.data(), x.size(), out.data(), t.data());
      };
      size_t refused = 0, tried = 0;
      for (int part = 0; part < 3; ++part) {
        const Bytes& target = part == 0 ? ct : part == 1 ? aad : tag;
        for (size_t bit = 0; bit < 8 * target.size(); ++bit) {
          Bytes a = aad, x = ct, t = tag;
          Bytes& flip = part == 0 ? x : part == 1 ? a : t;
          flip[bit / 8] ^= uint8_t(1u << (bit % 8));
          ++tried;
          refused += !opens(a, x, t);
        }
      }
      EXPECT_EQ(refused, tried);
      EXPECT_TRUE(opens(aad, ct, tag));
      // A nonce off by one bit is a different message too.
      AeadNonce other = nonce;
      other[11] ^= 1;
      Bytes out(ct.size());
      EXPECT_FALSE(
          c.open(other, aad.data(), aad.size(), ct.data(), ct.size(), out.data(), tag.data()));
    }
  }
}

class AeadRoundTrip : public ::testing::TestWithParam<AeadAlgorithm> {};

TEST_P(AeadRoundTrip, SizesFromEmptyToSeveralBlocks) {
  AeadKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = uint8_t(i * 7 + 1);
  AeadCipher sealer(GetParam(), key), opener(GetParam(), key);
  const Bytes aad = {1, 2, 3, 4, 5};
  for (size_t size : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(64),
                      size_t(1000), size_t(65537)}) {
    SCOPED_TRACE(size);
    Bytes pt(size);
    for (size_t i = 0; i < size; ++i) pt[i] = uint8_t(i * 131 + 3);
    const AeadNonce nonce = nonce_for(AeadNonce{9, 8, 7}, size);
    Bytes buf = pt;
    uint8_t tag[kAeadTagSize];
    sealer.seal(nonce, aad.data(), aad.size(), buf.data(), buf.size(), buf.data(), tag);
    if (size >= 16) {
      EXPECT_NE(buf, pt);
    }
    ASSERT_TRUE(
        opener.open(nonce, aad.data(), aad.size(), buf.data(), buf.size(), buf.data(), tag));
    EXPECT_EQ(buf, pt);
  }
}

TEST_P(AeadRoundTrip, SealAndOpenInterleaveOnOneCipher) {
  AeadCipher c(GetParam(), AeadKey{42});
  for (uint64_t seq = 0; seq < 5; ++seq) {
    Bytes pt(100, uint8_t(seq)), ct(100);
    uint8_t tag[kAeadTagSize];
    const AeadNonce nonce = nonce_for(AeadNonce{}, seq);
    c.seal(nonce, nullptr, 0, pt.data(), pt.size(), ct.data(), tag);
    Bytes back(100);
    ASSERT_TRUE(c.open(nonce, nullptr, 0, ct.data(), ct.size(), back.data(), tag));
    EXPECT_EQ(back, pt);
  }
}

TEST_P(AeadRoundTrip, RekeyChangesTheKey) {
  const AeadKey a{1}, b{2};
  AeadCipher sealer(GetParam(), a), opener(GetParam(), a);
  Bytes msg(32, 0x5a);
  uint8_t tag[kAeadTagSize];
  sealer.rekey(b);
  sealer.seal(AeadNonce{}, nullptr, 0, msg.data(), msg.size(), msg.data(), tag);
  Bytes copy = msg;
  EXPECT_FALSE(opener.open(AeadNonce{}, nullptr, 0, copy.data(), copy.size(), copy.data(), tag));
  opener.rekey(b);
  ASSERT_TRUE(opener.open(AeadNonce{}, nullptr, 0, msg.data(), msg.size(), msg.data(), tag));
  EXPECT_EQ(msg, Bytes(32, 0x5a));
}

INSTANTIATE_TEST_SUITE_P(AeadCiphers, AeadRoundTrip,
                         ::testing::Values(AeadAlgorithm::kAes256Gcm,
                                           AeadAlgorithm::kChaCha20Poly1305),
                         [](const auto& info) {
                           return info.param == AeadAlgorithm::kAes256Gcm ? "Aes256Gcm"
                                                                          : "ChaCha20Poly1305";
                         });

TEST(AeadNonce, XorsTheSequenceBigEndianIntoTheLastEightBytes) {
  const AeadNonce iv = array_from_hex<kAeadNonceSize>("000102030405060708090a0b");
  EXPECT_EQ(nonce_for(iv, 0), iv);
  EXPECT_EQ(hex(nonce_for(iv, 1).data(), kAeadNonceSize), "000102030405060708090a0a");
  EXPECT_EQ(hex(nonce_for(iv, 0x1122334455667788ull).data(), kAeadNonceSize),
            "00010203152735435d6f7d83");
  EXPECT_EQ(hex(nonce_for(AeadNonce{}, ~uint64_t{0}).data(), kAeadNonceSize),
            "00000000ffffffffffffffff");
}

// The ratchet is part of the wire protocol (both ends must derive the same
// next key), so it is pinned to HKDF-Expand as computed independently
// (Python hmac/hashlib): T1 = HMAC-SHA256(key, info || 01),
// T2 = HMAC-SHA256(key, T1 || info || 02), output = (T1 || T2)[0, 44).
TEST(AeadRatchet, MatchesHkdfExpandSha256) {
  AeadKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = uint8_t(i);
  AeadNonce iv{};
  ratchet(&key, &iv);
  EXPECT_EQ(hex(key.data(), key.size()),
            "46c375da61bbf918b44599254993cfe39bdc5632059a5d2d7501982b37235fe0");
  EXPECT_EQ(hex(iv.data(), iv.size()), "4577ca981dc4aaff3fd7ef51");
  ratchet(&key, &iv);
  EXPECT_EQ(hex(key.data(), key.size()),
            "3b56fe35049172a4c36c2686ae153575fe3190ea07ec62185ff5fe7abb09ae17");
  EXPECT_EQ(hex(iv.data(), iv.size()), "bacffb68c14d9d2c64e52851");
}

TEST(AeadRatchet, DeterministicAndIndependentOfTheOldIv) {
  AeadKey k1{7}, k2{7};
  AeadNonce iv1{}, iv2{};
  iv2.fill(0xff);
  ratchet(&k1, &iv1);
  ratchet(&k2, &iv2);
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(iv1, iv2);
  EXPECT_NE(k1, (AeadKey{7}));
  EXPECT_NE(iv1, AeadNonce{});
  AeadKey k3 = k1;
  AeadNonce iv3 = iv1;
  ratchet(&k3, &iv3);
  EXPECT_NE(k3, k1);
  EXPECT_NE(iv3, iv1);
}

}  // namespace
}  // namespace fedwan::security
