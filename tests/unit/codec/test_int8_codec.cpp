// The int8 codec: its exact bytes (the CUDA encoder must produce the same),
// its error bound, error feedback, and what a receiver's validate() refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codec/codec_math.hpp"
#include "codec/int8_codec.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "harness/random_floats.hpp"

namespace fedwan {
namespace {

using Bytes = std::vector<uint8_t>;
using Floats = std::vector<float>;
namespace cm = codec_math;

constexpr size_t B = Int8Codec::kBlock;
constexpr float kFltMax = std::numeric_limits<float>::max();

const Codec& int8() { return codec_by_name("int8"); }

using testing::random_floats;

Bytes encode(const Floats& in, float* residual = nullptr) {
  Bytes out(int8().encoded_size(in.size()));
  int8().encode(in.data(), in.size(), residual, out.data());
  return out;
}

Floats decode(const Bytes& b, size_t n) {
  Floats out(n);
  int8().decode(b.data(), n, out.data());
  return out;
}

bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void put_f32(Bytes& b, size_t off, float f) {
  const uint32_t u = cm::bits_of(f);
  for (int i = 0; i < 4; ++i) b[off + i] = uint8_t(u >> (8 * i));
}

float get_f32(const Bytes& b, size_t off) {
  return cm::float_of(uint32_t(b[off]) | uint32_t(b[off + 1]) << 8 | uint32_t(b[off + 2]) << 16 |
                      uint32_t(b[off + 3]) << 24);
}

float scale_of(const Bytes& b, size_t block) { return get_f32(b, 4 * block); }

// Half a step of the element's block, plus what the roundings of the scale,
// its inverse and the decoding product can add (a few fp32 ulps of 127
// steps); anything coarser than this is a bug.
double error_bound(float scale) { return 0.5 * double(scale) * (1.0 + 0x1p-12); }

// The format, written out from its definition with the shared arithmetic:
// what the codec, and the CUDA encoder, must produce bit for bit.
Bytes reference_encode(const Floats& in, Floats* residual) {
  const size_t n = in.size(), blocks = Int8Codec::blocks(n);
  Bytes out(4 * blocks + n);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * B, end = std::min(n, begin + B);
    const auto value = [&](size_t i) {
      return residual ? cm::add_rn(in[i], (*residual)[i]) : in[i];
    };
    uint32_t max_bits = 0;
    for (size_t i = begin; i < end; ++i) {
      max_bits = std::max(max_bits, cm::bits_of(value(i)) & cm::kF32AbsMask);
    }
    const cm::Int8Scale s = cm::int8_scale_for(max_bits);
    put_f32(out, 4 * b, s.scale);
    for (size_t i = begin; i < end; ++i) {
      const float v = value(i);
      const int8_t q = cm::int8_quantise(v, s);
      out[4 * blocks + i] = uint8_t(q);
      if (residual) (*residual)[i] = cm::sub_rn(v, cm::int8_dequantise(q, s.scale));
    }
  }
  return out;
}

// Ties at several scales, zeros of both signs, fp32 subnormals and values
// over many binades, so rounding and clamping are all exercised.
Floats edge_values(size_t n, uint32_t seed) {
  const Floats special{0.0f,    -0.0f,  2.5f,    -2.5f,  3.5f,    0.5f,  -0.5f, 126.5f,
                       -126.5f, 127.0f, -127.0f, 1e-40f, -1e-45f, 63.5f, 1.5f,  12345.678f};
  Floats v = random_floats(n, seed, 30.0f);
  std::mt19937 rng(seed + 1);
  for (size_t i = 0; i < n; ++i) {
    if (i % 3 == 0) v[i] = special[(i / 3) % special.size()];
    if (i % 7 == 1) v[i] = std::ldexp(v[i], int(rng() % 60) - 40);
  }
  return v;
}

TEST(Int8Codec, IsRegisteredWithWireId4) {
  EXPECT_EQ(int8().id(), CodecId::kInt8);
  EXPECT_EQ(static_cast<uint8_t>(CodecId::kInt8), 4);
  EXPECT_EQ(codec_by_wire_id(4), &int8());
  EXPECT_EQ(int8().name(), "int8");
}

TEST(Int8Codec, PayloadIsBlockScalesThenOneBytePerValue) {
  EXPECT_EQ(B, 256u);
  for (size_t n : {size_t(0), size_t(1), B - 1, B, B + 1, 3 * B + 5}) {
    EXPECT_EQ(int8().encoded_size(n), 4 * ((n + B - 1) / B) + n) << n;
  }
  // A quarter of fp32 on the wire, plus 1.6% for the scales.
  const size_t n = size_t(1) << 20;
  EXPECT_LE(double(int8().encoded_size(n)) / double(4 * n), 0.254);
}

TEST(Int8Codec, ExactBytesForAHandComputedInput) {
  // Block 0: largest magnitude 127, so scale 1 and inverse 1: every value
  // rounds to the nearest integer, ties to even. Block 1 (short): largest 1,
  // so scale fp32(1/127) and inverse 127: -0.5 lands on the tie -63.5.
  Floats in(B + 4, 0.0f);
  const Floats head{127.0f, -127.0f, 2.5f, 3.5f,  -2.5f, -3.5f, 0.5f,  -0.5f,
                    1.5f,   126.5f,  0.4f, -0.6f, 0.0f,  -0.0f, 126.4f};
  std::copy(head.begin(), head.end(), in.begin());
  in[B] = 1.0f;
  in[B + 1] = -0.5f;
  in[B + 2] = 0.3f;  // 38.1 -> 38
  in[B + 3] = -1.0f;
  const Bytes b = encode(in);
  ASSERT_EQ(b.size(), 8 + B + 4);
  const Bytes scales{0x00, 0x00, 0x80, 0x3F,   // 1.0f
                     0x04, 0x02, 0x01, 0x3C};  // 1/127 rounded to fp32
  EXPECT_EQ(Bytes(b.begin(), b.begin() + 8), scales);
  const Bytes head_q{0x7F, 0x81, 0x02, 0x04, 0xFE, 0xFC, 0x00, 0x00,
                     0x02, 0x7E, 0x00, 0xFF, 0x00, 0x00, 0x7E};
  EXPECT_EQ(Bytes(b.begin() + 8, b.begin() + 8 + head_q.size()), head_q);
  for (size_t i = head_q.size(); i < B; ++i) ASSERT_EQ(b[8 + i], 0) << i;
  EXPECT_EQ(Bytes(b.begin() + 8 + B, b.end()), (Bytes{0x7F, 0xC0, 0x26, 0x81}));

  const Floats out = decode(b, in.size());
  EXPECT_EQ(out[0], 127.0f);
  EXPECT_EQ(out[1], -127.0f);
  EXPECT_EQ(out[2], 2.0f);
  EXPECT_EQ(out[4], -2.0f);
  EXPECT_EQ(out[B], 1.0f);  // 127 * fp32(1/127) rounds back to 1
  EXPECT_EQ(out[B + 1], -64.0f * (1.0f / 127.0f));
}

TEST(Int8Codec, MatchesTheFormatDefinitionBitForBit) {
  for (size_t n : {size_t(1), size_t(31), size_t(32), size_t(33), B - 1, B, B + 1,
                   size_t(16384 + 300), size_t(100003)}) {
    const Floats in = edge_values(n, uint32_t(n));
    EXPECT_EQ(encode(in), reference_encode(in, nullptr)) << n;
    Floats residual = random_floats(n, 3, 0.05f), expected = residual;
    EXPECT_EQ(encode(in, residual.data()), reference_encode(in, &expected)) << n;
    EXPECT_TRUE(same_bits(residual, expected)) << n;
  }
}

TEST(Int8Codec, RoundTripErrorIsAtMostHalfTheBlocksStep) {
  // Blocks 1e-8 to 1e4 apart, then a short one: each keeps its own step.
  const float sigmas[] = {1e-8f, 1e4f, 1e-3f, 30.0f, 1e-30f, 5.0f};
  const size_t n = 5 * B + 77;
  Floats in(n);
  for (size_t i = 0; i < n; ++i) in[i] = random_floats(1, uint32_t(i), sigmas[i / B])[0];
  for (bool ef : {false, true}) {
    Floats residual(n, 0.0f);
    const Bytes b = encode(in, ef ? residual.data() : nullptr);
    ASSERT_TRUE(int8().validate(b.data(), b.size(), n));
    const Floats out = decode(b, n);
    for (size_t k = 0; k < Int8Codec::blocks(n); ++k) {
      float block_max = 0;
      for (size_t i = k * B; i < std::min(n, (k + 1) * B); ++i) {
        block_max = std::max(block_max, std::fabs(in[i]));
      }
      EXPECT_EQ(scale_of(b, k), block_max / 127.0f) << "block " << k;
    }
    EXPECT_LT(scale_of(b, 0), 1e-10f * scale_of(b, 1));
    for (size_t i = 0; i < n; ++i) {
      const float scale = scale_of(b, i / B);
      ASSERT_LE(std::fabs(double(out[i]) - double(in[i])), error_bound(scale)) << i;
      if (ef) ASSERT_EQ(residual[i], in[i] - out[i]) << i;
    }
  }
}

TEST(Int8Codec, ErrorFeedbackKeepsTheDecodedSumWithinOneStep) {
  const size_t n = 3 * B + 40, rounds = 100;
  const Floats x = random_floats(n, 17, 0.02f);
  Floats residual(n, 0.0f);
  std::vector<double> with_ef(n, 0.0), without(n, 0.0);
  float largest_scale = 0;
  for (size_t r = 0; r < rounds; ++r) {
    Floats v(n);
    for (size_t i = 0; i < n; ++i) v[i] = x[i] + residual[i];
    const Bytes b = encode(x, residual.data());
    ASSERT_TRUE(int8().validate(b.data(), b.size(), n));
    const Floats out = decode(b, n);
    for (size_t k = 0; k < Int8Codec::blocks(n); ++k) {
      largest_scale = std::max(largest_scale, scale_of(b, k));
    }
    for (size_t i = 0; i < n; ++i) {
      // The residual is exactly what this round did not send...
      ASSERT_EQ(residual[i], v[i] - out[i]) << "round " << r << " element " << i;
      // ...so it stays within half a step instead of growing.
      ASSERT_LE(std::fabs(residual[i]), error_bound(scale_of(b, i / B))) << r << " " << i;
      with_ef[i] += out[i];
    }
    const Floats plain = decode(encode(x), n);
    for (size_t i = 0; i < n; ++i) without[i] += plain[i];
  }
  double max_ef = 0, max_plain = 0;
  for (size_t i = 0; i < n; ++i) {
    const double truth = double(rounds) * double(x[i]);
    max_ef = std::max(max_ef, std::fabs(with_ef[i] - truth));
    max_plain = std::max(max_plain, std::fabs(without[i] - truth));
  }
  EXPECT_LE(max_ef, largest_scale);
  // Without feedback each element's rounding error repeats every round.
  EXPECT_GT(max_plain, 10 * max_ef);
}

TEST(Int8Codec, ZeroAndTinyBlocksEncodeAsZerosAndTheResidualKeepsThem) {
  const float below = cm::float_of(cm::kInt8TinyBits - 1);  // just under 2^-120
  const float tiny = cm::float_of(cm::kInt8TinyBits);       // 2^-120
  const size_t n = 3 * B + 10;
  Floats in(n);
  for (size_t i = 0; i < B; ++i) in[i] = i % 3 == 0 ? -0.0f : 0.0f;
  const Floats small = random_floats(B, 5, 1e-38f);
  for (size_t i = 0; i < B; ++i) in[B + i] = std::max(-below, std::min(below, small[i]));
  in[B + 7] = below;
  in[B + 8] = std::numeric_limits<float>::denorm_min();
  const Floats mid = random_floats(B, 6);
  for (size_t i = 0; i < B; ++i) in[2 * B + i] = mid[i];
  for (size_t i = 3 * B; i < n; ++i) in[i] = i % 2 ? tiny : -0.5f * tiny;  // on the threshold
  for (bool ef : {false, true}) {
    Floats residual(n, 0.0f);
    const Bytes b = encode(in, ef ? residual.data() : nullptr);
    ASSERT_TRUE(int8().validate(b.data(), b.size(), n));
    EXPECT_EQ(cm::bits_of(scale_of(b, 0)), 0u);
    EXPECT_EQ(cm::bits_of(scale_of(b, 1)), 0u);
    EXPECT_GT(scale_of(b, 3), 0.0f);  // 2^-120 itself is encoded
    const Floats out = decode(b, n);
    for (size_t i = 0; i < 2 * B; ++i) {
      ASSERT_EQ(b[16 + i], 0) << i;
      ASSERT_EQ(cm::bits_of(out[i]), 0u) << i;
      // Error feedback keeps every bit of what was not sent: in + residual,
      // where -0 + 0 is +0.
      if (ef) ASSERT_EQ(cm::bits_of(residual[i]), cm::bits_of(cm::add_rn(in[i], 0.0f))) << i;
    }
    for (size_t i = 3 * B; i < n; ++i) {
      ASSERT_LE(std::fabs(double(out[i]) - double(in[i])), error_bound(scale_of(b, 3))) << i;
      ASSERT_NE(out[i], 0.0f) << i;
    }
  }
  // Sent again and again, tiny values build up in the residual until their
  // block reaches 2^-120 and goes out: nothing is lost for good.
  const Floats quarter(B, 0x1p-122f);
  Floats residual(B, 0.0f);
  double sent = 0;
  for (int r = 1; r <= 4; ++r) {
    const Floats out = decode(encode(quarter, residual.data()), B);
    sent += out[0];
    if (r < 4) EXPECT_EQ(sent, 0.0) << r;
  }
  EXPECT_NEAR(sent, 0x1p-120, 0x1p-120 / 254);
}

TEST(Int8Codec, ShortLastBlockAndTinyChunks) {
  // n = 0: no bytes, nothing touched.
  EXPECT_EQ(int8().encoded_size(0), 0u);
  uint8_t none = 0xAB;
  float untouched = 1.5f;
  int8().encode(&untouched, 0, &untouched, &none);
  EXPECT_EQ(none, 0xAB);
  EXPECT_EQ(untouched, 1.5f);
  EXPECT_TRUE(int8().validate(&none, 0, 0));
  EXPECT_FALSE(int8().validate(&none, 1, 0));
  int8().decode(&none, 0, &untouched);
  EXPECT_EQ(untouched, 1.5f);

  // n = 1: the value is its block's maximum, so it goes out as -127.
  Floats residual{0.0f};
  const Bytes one = encode(Floats{-0.75f}, residual.data());
  ASSERT_EQ(one.size(), 5u);
  EXPECT_EQ(scale_of(one, 0), 0.75f / 127.0f);
  EXPECT_EQ(one[4], 0x81);
  const float out = decode(one, 1)[0];
  EXPECT_NEAR(out, -0.75f, 1e-7f);
  EXPECT_EQ(residual[0], -0.75f - out);

  // A last block of one element gets its own scale, whatever block 0 holds.
  for (size_t extra : {size_t(1), size_t(100)}) {
    Floats in = random_floats(B + extra, 9, 1e3f);
    for (size_t i = B; i < B + extra; ++i) in[i] = 1e-3f * float(i % 7) - 3e-3f;  // within +-3e-3
    in[B] = 4e-3f;  // the last block's largest value
    const Bytes b = encode(in);
    ASSERT_TRUE(int8().validate(b.data(), b.size(), in.size()));
    EXPECT_EQ(scale_of(b, 1), 4e-3f / 127.0f);
    EXPECT_EQ(b[8 + B], 0x7F);
    const Floats dec = decode(b, in.size());
    for (size_t i = B; i < in.size(); ++i) {
      ASSERT_LE(std::fabs(double(dec[i]) - double(in[i])), error_bound(scale_of(b, 1))) << i;
    }
  }
}

TEST(Int8Codec, NonFiniteInputThrowsNamingTheCodecAndLeavesTheResidualUntouched) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t n : {size_t(1), B, B + 1, size_t(100003)}) {
    // The residual pass works backward from the last block: a bad value
    // anywhere must be found before any residual is written.
    for (size_t at : {size_t(0), n / 2, n - 1}) {
      for (float bad : {nan, inf, -inf, kFltMax}) {
        Floats in = random_floats(n, 5);
        Floats residual = random_floats(n, 6, 1e-3f);
        in[at] = bad;
        if (bad == kFltMax) residual[at] = kFltMax;  // finite parts, an infinite sum
        const Floats before = residual;
        Bytes out(int8().encoded_size(n));
        try {
          int8().encode(in.data(), n, residual.data(), out.data());
          ADD_FAILURE() << "no throw: n=" << n << " at " << at << " " << bad;
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("element " + std::to_string(at)), std::string::npos)
              << e.what();
        }
        EXPECT_TRUE(same_bits(residual, before)) << "n=" << n << " at " << at << " " << bad;
        if (bad != kFltMax) {
          EXPECT_THROW(int8().encode(in.data(), n, nullptr, out.data()), Error) << n << " " << at;
        }
      }
    }
  }
}

TEST(Int8Codec, ValidateAcceptsWhatEncodeProducesAndRejectsMalformedPayloads) {
  const size_t n = 4 * B - 24;  // four blocks, the last short
  const size_t values = 4 * Int8Codec::blocks(n);
  for (size_t m : {size_t(1), size_t(33), B, B + 1, size_t(100003)}) {
    const Bytes b = encode(edge_values(m, 77));
    EXPECT_TRUE(int8().validate(b.data(), b.size(), m)) << m;
  }
  const Bytes good = encode(random_floats(n, 9));
  ASSERT_TRUE(int8().validate(good.data(), good.size(), n));

  // Size: the bytes must be exactly encoded_size(n), and a huge n must not
  // overflow into a small size.
  EXPECT_FALSE(int8().validate(good.data(), good.size() - 1, n));
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_FALSE(int8().validate(longer.data(), longer.size(), n));
  EXPECT_FALSE(int8().validate(good.data(), good.size(), n - 1));
  EXPECT_FALSE(int8().validate(good.data(), good.size(), n + 1));
  for (size_t huge :
       {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() / 2 + 1,
        std::numeric_limits<size_t>::max() - good.size()}) {
    EXPECT_FALSE(int8().validate(good.data(), good.size(), huge)) << huge;
  }

  // Scales: finite, sign bit clear, and 127 * scale finite; checked in every
  // block, the short last one included.
  const float inf = std::numeric_limits<float>::infinity();
  const float top = kFltMax / 127.0f;  // 127 * it rounds up to Inf
  ASSERT_TRUE(std::isinf(127.0f * top));
  const float below_top = std::nextafter(top, 0.0f);
  ASSERT_TRUE(std::isfinite(127.0f * below_top));
  for (size_t k : {size_t(0), size_t(2), size_t(3)}) {
    for (float scale : {std::numeric_limits<float>::quiet_NaN(), inf, -inf, -1.0f, -0.0f,
                        -std::numeric_limits<float>::denorm_min(), 0x1p122f, kFltMax, top}) {
      Bytes bad = good;
      put_f32(bad, 4 * k, scale);
      EXPECT_FALSE(int8().validate(bad.data(), bad.size(), n)) << "block " << k << " " << scale;
    }
    for (float scale : {0.0f, below_top, std::numeric_limits<float>::denorm_min()}) {
      Bytes ok = good;
      put_f32(ok, 4 * k, scale);
      EXPECT_TRUE(int8().validate(ok.data(), ok.size(), n)) << "block " << k << " " << scale;
    }
  }

  // Values: -128 (0x80) is never produced, so it is refused anywhere; the
  // neighbours -127 and 127 are fine.
  for (size_t at : {size_t(0), size_t(31), size_t(32), n / 2, n - 1}) {
    Bytes bad = good;
    bad[values + at] = 0x80;
    EXPECT_FALSE(int8().validate(bad.data(), bad.size(), n)) << at;
    for (uint8_t q : {uint8_t(0x81), uint8_t(0x7F)}) {
      Bytes ok = good;
      ok[values + at] = q;
      EXPECT_TRUE(int8().validate(ok.data(), ok.size(), n)) << at;
    }
  }

  // Whatever validate() accepts decodes to finite values.
  Bytes extreme(int8().encoded_size(2), 0);
  put_f32(extreme, 0, below_top);
  extreme[4] = 0x7F;
  extreme[5] = 0x81;
  ASSERT_TRUE(int8().validate(extreme.data(), extreme.size(), 2));
  for (float v : decode(extreme, 2)) EXPECT_TRUE(std::isfinite(v)) << v;
}

TEST(Int8Codec, DecodeAccumulateEqualsDecodeThenAccumulateBitForBit) {
  for (size_t n : {size_t(1), size_t(7), size_t(33), B + 3, size_t(100003)}) {
    const Bytes b = encode(edge_values(n, 21));
    const Floats x = decode(b, n);
    for (float w : {1.0f, 0.3f, 1.0f / 3.0f, -2.5f, 1e-30f}) {
      Floats fused = random_floats(n, 12, 5.0f), reference = fused;
      int8().decode_accumulate(b.data(), n, w, fused.data());
      accumulate_weighted(reference.data(), x.data(), n, w);
      ASSERT_TRUE(same_bits(fused, reference)) << "n=" << n << " weight " << w;
    }
  }
}

TEST(Int8Codec, ValuesNearFltMaxEncodeAndDecodeFinite) {
  const float big = std::nextafter(kFltMax, 0.0f);
  const Floats in{big, -big, 3e38f, -1e38f, 1.0f, 0.0f, -2.5e38f, 1e30f};
  Floats residual(in.size(), 0.0f);
  const Bytes b = encode(in, residual.data());
  ASSERT_TRUE(int8().validate(b.data(), b.size(), in.size()));
  const Floats out = decode(b, in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i]) && std::isfinite(residual[i])) << i;
    ASSERT_LE(std::fabs(double(out[i]) - double(in[i])), error_bound(scale_of(b, 0))) << i;
  }
  EXPECT_EQ(b[4], 0x7F);
  EXPECT_EQ(b[5], 0x81);
}

// A block whose largest magnitude is exactly FLT_MAX: fp32(FLT_MAX / 127)
// times 127 would round up to Inf, so the scale steps down one ulp; the
// payload validates, decodes finite, and the residual stays finite.
TEST(Int8Codec, FltMaxItselfEncodesFinite) {
  const Floats in{kFltMax, -kFltMax, 1.0f};
  Floats residual(in.size(), 0.0f);
  const Bytes b = encode(in, residual.data());
  EXPECT_TRUE(int8().validate(b.data(), b.size(), in.size()));
  const Floats out = decode(b, in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_TRUE(std::isfinite(out[i]) && std::isfinite(residual[i])) << i;
  }
}

// ---- kernels ---------------------------------------------------------------

TEST(Int8Kernels, SimdMatchesScalarBitForBit) {
  const kernels::Int8Kernels* simd = kernels::avx2_int8_kernels();
  if (!simd) GTEST_SKIP() << "no AVX2 on this machine or build";
  const kernels::Int8Kernels& ref = kernels::scalar_int8_kernels();
  const cm::Int8Scale scales[] = {
      cm::int8_scale_for(cm::bits_of(127.0f)),  // scale 1: ties at k + 0.5
      cm::int8_scale_for(cm::bits_of(1.0f)),    // inverse 127
      cm::int8_scale_for(cm::bits_of(12345.678f)),
      cm::int8_scale_for(cm::bits_of(1e-3f)),  // most values clamp
      cm::int8_scale_for(0),                   // a tiny block: zeros
      cm::int8_scale_for(cm::kInt8TinyBits),   // subnormal scale
      cm::int8_scale_for(cm::bits_of(std::nextafter(kFltMax, 0.0f)))};
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(31), size_t(32),
                   size_t(33), size_t(63), B, B + 5, size_t(100003)}) {
    const Floats in = edge_values(n, 40 + uint32_t(n));
    const Floats res0 = random_floats(n, 44, 1e-3f);
    for (const cm::Int8Scale& s : scales) {
      for (bool ef : {false, true}) {
        Bytes a(n, 0xAA), b(n, 0x55);
        Floats ra = res0, rb = res0;
        simd->encode(in.data(), ef ? ra.data() : nullptr, n, s, a.data());
        ref.encode(in.data(), ef ? rb.data() : nullptr, n, s, b.data());
        ASSERT_EQ(a, b) << "n=" << n << " scale=" << s.scale << " ef=" << ef;
        ASSERT_TRUE(same_bits(ra, rb)) << "n=" << n << " scale=" << s.scale;
      }
    }
    // Decoding takes any byte; -128 included (validate() refuses it, the
    // kernels need not).
    std::mt19937 rng{uint32_t(n)};
    Bytes payload(n);
    for (auto& q : payload) q = uint8_t(rng());
    for (float scale : {1.0f / 127.0f, 0.0f, scales[5].scale, scales[6].scale}) {
      Floats da(n), db(n), acc_a = random_floats(n, 45), acc_b = acc_a;
      simd->decode(payload.data(), n, scale, da.data());
      ref.decode(payload.data(), n, scale, db.data());
      ASSERT_TRUE(same_bits(da, db)) << n << " " << scale;
      simd->decode_accumulate(payload.data(), n, scale, 0.7f, acc_a.data());
      ref.decode_accumulate(payload.data(), n, scale, 0.7f, acc_b.data());
      ASSERT_TRUE(same_bits(acc_a, acc_b)) << n << " " << scale;
    }
    for (auto& q : payload) q = q == 0x80 ? 0x7F : q;
    EXPECT_FALSE(simd->has_minus_128(payload.data(), n));
    EXPECT_FALSE(ref.has_minus_128(payload.data(), n));
    for (size_t at : {size_t(0), n / 2, n - 1}) {
      if (n == 0) break;
      Bytes bad = payload;
      bad[at] = 0x80;
      EXPECT_TRUE(simd->has_minus_128(bad.data(), n)) << n << " " << at;
      EXPECT_TRUE(ref.has_minus_128(bad.data(), n)) << n << " " << at;
    }
  }
}

}  // namespace
}  // namespace fedwan
