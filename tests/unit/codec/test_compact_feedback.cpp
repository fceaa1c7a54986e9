// Error feedback with a bf16 residual (codec/compact_feedback.hpp): the
// first encoding is the codec's own; over many rounds what was sent tracks
// what was meant as closely as an fp32 residual does; the residual keeps
// values fp16 would flush.
#include "codec/compact_feedback.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "codec/half.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

std::vector<float> gaussian(size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

TEST(CompactFeedback, FirstEncodingIsTheCodecsOwn) {
  const Codec& fp16 = codec_by_name("fp16");
  const size_t n = 4099;
  const std::vector<float> x = gaussian(n, 1e-3f, 1);
  std::vector<uint8_t> plain(fp16.encoded_size(n)), compact(fp16.encoded_size(n));
  fp16.encode(x.data(), n, nullptr, plain.data());
  std::vector<uint16_t> residual(n, 0);
  std::vector<float> scratch;
  codec::encode_with_bf16_residual(fp16, x.data(), n, residual.data(), scratch, compact.data());
  EXPECT_EQ(plain, compact);
  // The residual now holds what fp16 lost, to bf16.
  std::vector<float> sent(n), kept(n);
  fp16.decode(plain.data(), n, sent.data());
  kernels::half_kernels().bf16_decode(reinterpret_cast<const uint8_t*>(residual.data()), n,
                                      kept.data());
  for (size_t i = 0; i < n; ++i) {
    const float lost = x[i] - sent[i];
    ASSERT_LE(std::fabs(kept[i] - lost), std::ldexp(std::fabs(lost), -8)) << i;
  }
}

// What the codec's own encode with an fp32 copy of the residual gives: the
// residual decoded whole, encoded against, and kept to bf16 again.
void whole_chunk(const Codec& c, const float* x, size_t n, std::vector<uint16_t>& residual,
                 uint8_t* out) {
  const kernels::HalfKernels& k = kernels::half_kernels();
  auto* bits = reinterpret_cast<uint8_t*>(residual.data());
  std::vector<float> r(n);
  k.bf16_decode(bits, n, r.data());
  c.encode(x, n, r.data(), out);
  k.bf16_encode(r.data(), nullptr, n, bits);
}

// fp16 goes a block at a time with the residual in L1: the same payload and
// the same residual bits as the whole chunk at once, over rounds and sizes
// with short last blocks; a non-finite value still throws and leaves the
// residual as it was.
TEST(CompactFeedback, Fp16ABlockAtATimeIsTheWholeChunksEncoding) {
  const Codec& fp16 = codec_by_name("fp16");
  for (size_t n : {1, 7, 2047, 2048, 2049, 6000, 262144}) {
    std::vector<uint16_t> fast(n, 0), slow(n, 0);
    std::vector<float> scratch;
    std::vector<uint8_t> a(fp16.encoded_size(n)), b(fp16.encoded_size(n));
    for (unsigned round = 0; round < 3; ++round) {
      std::vector<float> x = gaussian(n, round == 1 ? 1e3f : 1e-3f, 7 + round);
      if (n > 100) x[n / 2] = 0.0f;
      codec::encode_with_bf16_residual(fp16, x.data(), n, fast.data(), scratch, a.data());
      whole_chunk(fp16, x.data(), n, slow, b.data());
      ASSERT_EQ(a, b) << n << " round " << round;
      ASSERT_EQ(fast, slow) << n << " round " << round;
    }
    for (size_t at : {n - 1, n / 2, size_t{0}}) {
      std::vector<float> bad = gaussian(n, 1.0f, 99);
      bad[at] = std::numeric_limits<float>::infinity();
      const std::vector<uint16_t> before = fast;
      EXPECT_THROW(
          codec::encode_with_bf16_residual(fp16, bad.data(), n, fast.data(), scratch, a.data()),
          Error);
      EXPECT_EQ(fast, before) << n << " at " << at;
    }
  }
}

// A site's update encoded as a difference: the payload and residual of
// the difference made whole and encoded, for every codec; a non-finite
// value in any block throws and leaves the residual as it was.
TEST(CompactFeedback, ADifferenceIsEncodedAsTheValuesWouldBe) {
  for (const char* name : {"fp16", "int8", "bf16"}) {
    const Codec& c = codec_by_name(name);
    for (size_t n : {1, 2049, 6000}) {
      std::vector<uint16_t> fast(n, 0), slow(n, 0);
      std::vector<float> scratch, diff, x(n);
      std::vector<uint8_t> a(c.encoded_size(n)), b(c.encoded_size(n));
      for (unsigned round = 0; round < 3; ++round) {
        const std::vector<float> anchor = gaussian(n, 1.0f, 20 + round);
        const std::vector<float> params = gaussian(n, 1.0f, 30 + round);
        for (size_t i = 0; i < n; ++i) x[i] = anchor[i] - params[i];
        codec::encode_difference_with_bf16_residual(c, anchor.data(), params.data(), n, fast.data(),
                                                    scratch, diff, a.data());
        codec::encode_with_bf16_residual(c, x.data(), n, slow.data(), scratch, b.data());
        ASSERT_EQ(a, b) << name << " " << n << " round " << round;
        ASSERT_EQ(fast, slow) << name << " " << n << " round " << round;
      }
      for (size_t at : {size_t{0}, n / 2, n - 1}) {
        std::vector<float> anchor = gaussian(n, 1.0f, 40), params = gaussian(n, 1.0f, 41);
        params[at] = std::numeric_limits<float>::quiet_NaN();
        const std::vector<uint16_t> before = fast;
        EXPECT_THROW(codec::encode_difference_with_bf16_residual(
                         c, anchor.data(), params.data(), n, fast.data(), scratch, diff, a.data()),
                     Error)
            << name << " " << n << " at " << at;
        EXPECT_EQ(fast, before) << name << " " << n << " at " << at;
      }
    }
  }
}

// Over 200 rounds the sum of what was sent stays within one quantum of the
// sum of what was meant, for fp16 and int8, as with an fp32 residual.
TEST(CompactFeedback, SentTracksMeantOverManyRounds) {
  for (const char* name : {"fp16", "int8"}) {
    const Codec& c = codec_by_name(name);
    const size_t n = 2048;
    std::vector<uint16_t> compact(n, 0);
    std::vector<float> fp32(n, 0.0f), scratch, meant(n, 0.0f), sent_compact(n, 0.0f),
        sent_fp32(n, 0.0f);
    std::vector<uint8_t> out(c.encoded_size(n));
    for (unsigned round = 0; round < 200; ++round) {
      const std::vector<float> x = gaussian(n, 1e-4f, 100 + round);
      for (size_t i = 0; i < n; ++i) meant[i] += x[i];
      codec::encode_with_bf16_residual(c, x.data(), n, compact.data(), scratch, out.data());
      c.decode_accumulate(out.data(), n, 1.0f, sent_compact.data());
      c.encode(x.data(), n, fp32.data(), out.data());
      c.decode_accumulate(out.data(), n, 1.0f, sent_fp32.data());
    }
    double worst_compact = 0, worst_fp32 = 0;
    for (size_t i = 0; i < n; ++i) {
      worst_compact =
          std::max(worst_compact, static_cast<double>(std::fabs(meant[i] - sent_compact[i])));
      worst_fp32 = std::max(worst_fp32, static_cast<double>(std::fabs(meant[i] - sent_fp32[i])));
    }
    // Without feedback the error would grow with the rounds (fp16: ~1e-4
    // each); with it, it stays at the last round's quantum.
    EXPECT_LT(worst_compact, 2 * worst_fp32 + 1e-9) << name;
    EXPECT_LT(worst_compact, 1e-5) << name;
  }
}

// Residuals below fp16's smallest subnormal survive in bf16.
TEST(CompactFeedback, TinyResidualsAreKept) {
  const Codec& fp16 = codec_by_name("fp16");
  // fp16 loses 2^-23 of the first and all of the others.
  const std::vector<float> x = {std::nextafter(1.0f, 2.0f), 3e-9f, -5e-10f};
  std::vector<uint16_t> residual(x.size(), 0);
  std::vector<float> scratch, kept(x.size());
  std::vector<uint8_t> out(fp16.encoded_size(x.size()));
  codec::encode_with_bf16_residual(fp16, x.data(), x.size(), residual.data(), scratch, out.data());
  kernels::half_kernels().bf16_decode(reinterpret_cast<const uint8_t*>(residual.data()), x.size(),
                                      kept.data());
  for (const float k : kept) EXPECT_NE(k, 0.0f);
}

}  // namespace
}  // namespace fedwan
