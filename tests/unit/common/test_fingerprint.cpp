#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include <xxhash.h>

#include "common/fingerprint.hpp"

namespace fedwan {
namespace {

TEST(Fingerprint, EqualBytesAgreeAndAnyChangedByteDiffers) {
  std::vector<uint8_t> a(100000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint64_t fa = fingerprint64(a.data(), a.size());
  EXPECT_EQ(fingerprint64(a.data(), a.size()), fa);
  const std::vector<uint8_t> copy = a;
  EXPECT_EQ(fingerprint64(copy.data(), copy.size()), fa);
  std::set<uint64_t> seen{fa};
  for (size_t at : {size_t{0}, size_t{15}, size_t{16}, size_t{4097}, a.size() - 1}) {
    std::vector<uint8_t> b = a;
    b[at] ^= 1;
    EXPECT_TRUE(seen.insert(fingerprint64(b.data(), b.size())).second) << "byte " << at;
  }
  // A prefix, or the same bytes with a zero appended, is another string.
  EXPECT_TRUE(seen.insert(fingerprint64(a.data(), a.size() - 1)).second);
  std::vector<uint8_t> longer = a;
  longer.push_back(0);
  EXPECT_TRUE(seen.insert(fingerprint64(longer.data(), longer.size())).second);
  // All-zero strings of different lengths differ too, at every length XXH3
  // treats apart (up to 16, 128, 240 bytes, longer).
  const std::vector<uint8_t> z16(16, 0), z32(32, 0);
  EXPECT_NE(fingerprint64(z16.data(), z16.size()), fingerprint64(z32.data(), z32.size()));
  std::set<uint64_t> zeros;
  const std::vector<uint8_t> z(2000, 0);
  for (size_t n : {1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 2000}) {
    EXPECT_TRUE(zeros.insert(fingerprint64(z.data(), n)).second) << n << " zero bytes";
  }
  EXPECT_EQ(fingerprint64(nullptr, 0), fingerprint64(z16.data(), 0));
}

// Not a fixed function: the secret is the process's own, so the
// fingerprint is not XXH3's with its published default secret (which
// anyone could compute collisions for offline).
TEST(Fingerprint, UnderTheProcessesOwnSecret) {
  const std::vector<uint8_t> a(4096, 0x5a);
  EXPECT_NE(fingerprint64(a.data(), a.size()), XXH3_64bits(a.data(), a.size()));
  EXPECT_NE(fingerprint64(a.data(), a.size()), XXH3_64bits_withSeed(a.data(), a.size(), 0));
}

TEST(Fingerprint, TheSameOnEveryThreadOfTheProcess) {
  std::vector<uint8_t> a(4096, 0x5a);
  const uint64_t here = fingerprint64(a.data(), a.size());
  uint64_t there = 0;
  std::thread t([&] { there = fingerprint64(a.data(), a.size()); });
  t.join();
  EXPECT_EQ(there, here);
}

}  // namespace
}  // namespace fedwan
