#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

std::string hex(const Sha256Digest& d) { return to_hex(d.data(), d.size()); }

// FIPS 180-2 / NIST example vectors.
constexpr const char* kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr const char* kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr const char* kTwoBlock =
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
constexpr const char* kTwoBlockInput = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(hex(sha256("", 0)), kEmpty);
  EXPECT_EQ(hex(sha256(nullptr, 0)), kEmpty);
  EXPECT_EQ(hex(sha256("abc", 3)), kAbc);
  EXPECT_EQ(hex(sha256(kTwoBlockInput, std::string(kTwoBlockInput).size())), kTwoBlock);
}

TEST(Sha256, MillionAs) {
  std::string a(1000000, 'a');
  EXPECT_EQ(hex(sha256(a.data(), a.size())),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalMatchesOneShotAtEverySplit) {
  std::string msg(kTwoBlockInput);
  for (size_t split = 0; split <= msg.size(); ++split) {
    Sha256 h;
    h.update(msg.data(), split);
    h.update(msg.data() + split, msg.size() - split);
    EXPECT_EQ(hex(h.finish()), kTwoBlock) << "split at " << split;
  }
}

TEST(Sha256, FinishResetsForReuse) {
  Sha256 h;
  h.update("abc", 3);
  EXPECT_EQ(hex(h.finish()), kAbc);
  EXPECT_EQ(hex(h.finish()), kEmpty);
  h.update("a", 1);
  h.update("bc", 2);
  EXPECT_EQ(hex(h.finish()), kAbc);
}

TEST(Sha256, MovedHasherKeepsState) {
  Sha256 a;
  a.update("ab", 2);
  Sha256 b(std::move(a));
  b.update("c", 1);
  EXPECT_EQ(hex(b.finish()), kAbc);
  EXPECT_THROW(a.update("x", 1), CryptoError);  // NOLINT(bugprone-use-after-move)
}

TEST(Sha256, ToHex) {
  const uint8_t bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(to_hex(bytes, sizeof(bytes)), "000fa5ff");
  EXPECT_EQ(to_hex(bytes, 0), "");
}

}  // namespace
}  // namespace fedwan
