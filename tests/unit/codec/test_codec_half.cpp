// The half-precision codecs: fp16's block scales and payload layout, bf16's
// saturation, and the fp16/bf16 conversion kernels, scalar and SIMD.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/fp16_codec.hpp"
#include "codec/half.hpp"
#include "codec_test_util.hpp"
#include "fedwan/codec.hpp"
#include "harness/random_floats.hpp"

namespace fedwan {
namespace {

using testing::random_floats;

TEST(Fp16Codec, TinyMagnitudesKeepRelativePrecision) {
  const Codec& c = codec_by_name("fp16");
  Floats in = random_floats(4099, 3, 1e-9f);
  EXPECT_EQ(kernels::fp32_to_fp16(1e-9f), 0);  // unscaled fp16 would flush them all
  const Floats out = decode(c, encode(c, in), in.size());
  const float bound = std::ldexp(max_abs(in), -11);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_LE(std::fabs(out[i] - in[i]), bound) << i;
    ASSERT_TRUE(out[i] != 0.0f || std::fabs(in[i]) < 1e-11f) << i;
  }
}

TEST(Fp16Codec, ExtremeChunksStayFiniteAndAllZeroWorks) {
  const Codec& c = codec_by_name("fp16");
  const float big = std::numeric_limits<float>::max();
  for (Floats in : {Floats{big, -big, 1.0f, 3e37f}, Floats(9, 0.0f),
                    Floats{std::numeric_limits<float>::denorm_min(), 1e-40f}}) {
    Floats residual(in.size(), 0.0f);
    const Bytes b = encode(c, in, residual.data());
    ASSERT_TRUE(c.validate(b.data(), b.size(), in.size()));
    const Floats out = decode(c, b, in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[i]) && std::isfinite(residual[i])) << i;
      ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(max_abs(in), -11)) << i;
      ASSERT_TRUE(in[i] != 0.0f || out[i] == 0.0f) << i;
    }
  }
}

float get_f32(const Bytes& b, size_t off) {
  const uint32_t u = uint32_t(b[off]) | uint32_t(b[off + 1]) << 8 | uint32_t(b[off + 2]) << 16 |
                     uint32_t(b[off + 3]) << 24;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool is_power_of_two(float f) {
  int e;
  return f > 0.0f && std::frexp(f, &e) == 0.5f;
}

TEST(Fp16Codec, PayloadIsBlockScalesThenHalves) {
  const Codec& c = codec_by_name("fp16");
  constexpr size_t B = Fp16Codec::kBlock;
  EXPECT_EQ(B, 2048u);
  for (size_t n : {size_t(1), B - 1, B, B + 1, 3 * B + 5}) {
    const size_t blocks = (n + B - 1) / B;
    ASSERT_EQ(c.encoded_size(n), 4 * blocks + 2 * n) << n;
    Floats in = random_floats(n, 21 + uint32_t(n));
    for (size_t i = 0; i < n; ++i) in[i] = std::ldexp(in[i], 10 * int(i / B) - 12);
    const Bytes b = encode(c, in);
    ASSERT_TRUE(c.validate(b.data(), b.size(), n));
    const Floats out = decode(c, b, n);
    const Floats block_max = block_max_abs(in);
    for (size_t k = 0; k < blocks; ++k) {
      // Each scale is a power of two that puts its block's largest value in
      // [2^14, 2^15) of the half range.
      const float scale = get_f32(b, 4 * k);
      ASSERT_TRUE(is_power_of_two(scale)) << scale;
      EXPECT_GE(block_max[k] / scale, 0x1p14f) << "block " << k;
      EXPECT_LT(block_max[k] / scale, 0x1p15f) << "block " << k;
    }
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = uint16_t(b[4 * blocks + 2 * i] | b[4 * blocks + 2 * i + 1] << 8);
      ASSERT_EQ(out[i], kernels::fp16_to_fp32(h) * get_f32(b, 4 * (i / B))) << i;
    }
  }
  // The scales cost 0.1%: fp16 stays well under 0.52 of fp32 on the wire.
  const size_t n = size_t(1) << 20;
  EXPECT_LE(double(c.encoded_size(n)) / double(4 * n), 0.501);
}

TEST(Fp16Codec, EachBlockKeepsItsOwnRelativePrecision) {
  const Codec& c = codec_by_name("fp16");
  constexpr size_t B = Fp16Codec::kBlock;
  const size_t n = 2 * B + 100;  // the last block is short
  const Floats tiny = random_floats(n, 31, 1e-6f), huge = random_floats(n, 32, 1e3f),
               mid = random_floats(n, 33, 1e-2f);
  Floats in(n);
  for (size_t i = 0; i < n; ++i) in[i] = i < B ? tiny[i] : i < 2 * B ? huge[i] : mid[i];
  // Under one scale for the whole chunk the tiny block would fall among the
  // half subnormals, whose step (2^-24 scaled) is far coarser than 11
  // significant bits of 1e-6.
  const float chunk_scale = std::ldexp(1.0f, std::ilogb(max_abs(in)) - 14);
  EXPECT_GT(std::ldexp(chunk_scale, -24), 8 * std::ldexp(1e-6f, -11));
  for (bool ef : {false, true}) {
    Floats residual(n, 0.0f);
    const Bytes b = encode(c, in, ef ? residual.data() : nullptr);
    ASSERT_TRUE(c.validate(b.data(), b.size(), n));
    EXPECT_LT(get_f32(b, 0), get_f32(b, 8));
    EXPECT_LT(get_f32(b, 8), get_f32(b, 4));
    const Floats out = decode(c, b, n);
    const Floats block_max = block_max_abs(in);
    for (size_t i = 0; i < n; ++i) {
      const float top = block_max[i / B];
      ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(top, -11)) << i;
      // Values in the normal half range of their block round to 11
      // significant bits, whatever the other blocks hold.
      if (std::fabs(in[i]) >= std::ldexp(top, -14)) {
        ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(std::fabs(in[i]), -11)) << i;
      }
      if (ef) ASSERT_EQ(residual[i], in[i] - out[i]) << i;
    }
  }
}

TEST(Fp16Codec, AllZeroBlocksAmongOthers) {
  const Codec& c = codec_by_name("fp16");
  constexpr size_t B = Fp16Codec::kBlock;
  const size_t n = 3 * B + 7;
  Floats in = random_floats(n, 41, 0.1f);
  for (size_t i = B; i < 2 * B; ++i) in[i] = i % 3 == 0 ? -0.0f : 0.0f;
  for (size_t i = 3 * B; i < n; ++i) in[i] = 0.0f;  // the short last block too
  Floats residual(n, 0.0f);
  const Bytes b = encode(c, in, residual.data());
  ASSERT_TRUE(c.validate(b.data(), b.size(), n));
  const Floats out = decode(c, b, n);
  for (size_t i = B; i < 2 * B; ++i) ASSERT_TRUE(out[i] == 0.0f && residual[i] == 0.0f) << i;
  for (size_t i = 3 * B; i < n; ++i) ASSERT_TRUE(out[i] == 0.0f && residual[i] == 0.0f) << i;
  const Floats block_max = block_max_abs(in);
  for (size_t i = 0; i < B; ++i)
    ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(block_max[0], -11));
  const Floats zeros(n, 0.0f);
  const Bytes z = encode(c, zeros);
  ASSERT_TRUE(c.validate(z.data(), z.size(), n));
  EXPECT_TRUE(same_bits(decode(c, z, n), zeros));
}

TEST(Bf16Codec, SaturatesInsteadOfOverflowing) {
  const Codec& c = codec_by_name("bf16");
  const Floats in{std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()};
  const Bytes b = encode(c, in);
  ASSERT_TRUE(c.validate(b.data(), b.size(), 2));
  const Floats out = decode(c, b, 2);
  EXPECT_TRUE(std::isfinite(out[0]) && std::isfinite(out[1]));
  EXPECT_LE(std::fabs(out[0] - in[0]), std::ldexp(in[0], -8));
}

// ---- conversion kernels ----------------------------------------------------

TEST(Fp16Kernels, ScalarConversionsRoundToNearestEven) {
  EXPECT_EQ(kernels::fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(kernels::fp32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(kernels::fp32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(kernels::fp32_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(kernels::fp32_to_fp16(65520.0f), 0x7C00);             // tie with 2^16 goes to even: Inf
  EXPECT_EQ(kernels::fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);      // tie -> even
  EXPECT_EQ(kernels::fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie -> even
  EXPECT_EQ(kernels::fp32_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(kernels::fp32_to_fp16(0x1p-25f), 0x0000);             // tie -> even zero
  EXPECT_EQ(kernels::fp32_to_fp16(3 * 0x1p-25f), 0x0002);         // tie -> even
  EXPECT_EQ(kernels::fp32_to_fp16(0x1p-14f - 0x1p-25f), 0x0400);  // rounds up to normal
  EXPECT_EQ(kernels::fp32_to_fp16(-0.0f), 0x8000);
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every non-NaN half survives a round trip
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;
    ASSERT_EQ(kernels::fp32_to_fp16(kernels::fp16_to_fp32(uint16_t(h))), h) << h;
  }
  EXPECT_EQ(kernels::fp32_to_bf16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(kernels::fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(kernels::fp32_to_bf16(-std::numeric_limits<float>::max()), 0xFF7F);
  EXPECT_EQ(kernels::bf16_to_fp32(0x3F80), 1.0f);
}

// Inputs that stress rounding: ties, half subnormals, the top of the half
// range, fp32 subnormals, signed zeros, plus random values over many binades.
Floats edge_values(size_t n) {
  const Floats special{0.0f,
                       -0.0f,
                       1.0f + 0x1p-11f,
                       1.0f + 3 * 0x1p-11f,
                       0x1p-24f,
                       0x1p-25f,
                       3 * 0x1p-25f,
                       0x1p-14f - 0x1p-25f,
                       65504.0f,
                       65519.0f,
                       65520.0f,
                       -65520.0f,
                       1e-40f,
                       -1e-45f,
                       1.0f + 0x1p-8f,
                       1.0f + 3 * 0x1p-8f,
                       std::numeric_limits<float>::max(),
                       12345.678f};
  Floats v = random_floats(n, 42);
  std::mt19937 rng(43);
  for (size_t i = 0; i < n; ++i) {
    if (i % 3 == 0) v[i] = special[(i / 3) % special.size()];
    if (i % 3 == 1) v[i] = std::ldexp(v[i], int(rng() % 60) - 40);
  }
  return v;
}

TEST(Fp16Kernels, SimdMatchesScalarBitForBit) {
  const kernels::HalfKernels* simd = kernels::avx2_half_kernels();
  if (!simd) GTEST_SKIP() << "no AVX2 + F16C on this machine or build";
  const kernels::HalfKernels& ref = kernels::scalar_half_kernels();
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(31), size_t(33),
                   size_t(1000003)}) {
    const Floats in = edge_values(n);
    const Floats res0 = random_floats(n, 44, 1e-3f);
    EXPECT_EQ(simd->max_abs_bits(in.data(), nullptr, n), ref.max_abs_bits(in.data(), nullptr, n));
    EXPECT_EQ(simd->max_abs_bits(in.data(), res0.data(), n),
              ref.max_abs_bits(in.data(), res0.data(), n));
    const float inf = std::numeric_limits<float>::infinity();
    // Finite limits take the clamping path, infinite ones the other.
    for (kernels::Fp16Scale s :
         {kernels::Fp16Scale{}, kernels::Fp16Scale{1.0f, 1.0f, 65504.0f},
          kernels::Fp16Scale{0x1p-10f, 0x1p10f, 65504.0f},
          kernels::Fp16Scale{0x1p-10f, 0x1p10f, inf}, kernels::fp16_scale_for(0x3F800000u),
          kernels::fp16_scale_for(0x7F7FFFFFu), kernels::fp16_scale_for(0x00000010u)}) {
      for (bool ef : {false, true}) {
        Bytes a(2 * n), b(2 * n);
        Floats ra = res0, rb = res0;
        simd->fp16_encode(in.data(), ef ? ra.data() : nullptr, n, s, a.data());
        ref.fp16_encode(in.data(), ef ? rb.data() : nullptr, n, s, b.data());
        ASSERT_EQ(a, b) << "n=" << n << " scale=" << s.scale << " ef=" << ef;
        ASSERT_TRUE(same_bits(ra, rb)) << "n=" << n;
      }
    }
    for (bool ef : {false, true}) {
      Bytes a(2 * n), b(2 * n);
      Floats ra = res0, rb = res0;
      Floats finite = in;
      for (auto& x : finite) x = std::isfinite(x) ? x : 1.0f;
      simd->bf16_encode(finite.data(), ef ? ra.data() : nullptr, n, a.data());
      ref.bf16_encode(finite.data(), ef ? rb.data() : nullptr, n, b.data());
      ASSERT_EQ(a, b) << "bf16 n=" << n;
      ASSERT_TRUE(same_bits(ra, rb)) << "bf16 n=" << n;
    }
    // Decoding: random non-NaN 16-bit patterns.
    std::mt19937 rng{static_cast<uint32_t>(n)};
    Bytes payload(2 * n);
    for (size_t i = 0; i < n; ++i) {
      uint16_t h = uint16_t(rng());
      if ((h & 0x7C00) == 0x7C00) h &= 0x83FF;
      put_u16(payload, 2 * i, h);
    }
    EXPECT_EQ(simd->u16_max_abs(payload.data(), n), ref.u16_max_abs(payload.data(), n));
    Floats da(n), db(n), acc_a = random_floats(n, 45), acc_b = acc_a;
    simd->fp16_decode(payload.data(), n, 0x1p-7f, da.data());
    ref.fp16_decode(payload.data(), n, 0x1p-7f, db.data());
    ASSERT_TRUE(same_bits(da, db));
    simd->fp16_decode_accumulate(payload.data(), n, 0x1p-7f, 0.7f, acc_a.data());
    ref.fp16_decode_accumulate(payload.data(), n, 0x1p-7f, 0.7f, acc_b.data());
    ASSERT_TRUE(same_bits(acc_a, acc_b));
    simd->bf16_decode(payload.data(), n, da.data());
    ref.bf16_decode(payload.data(), n, db.data());
    ASSERT_TRUE(same_bits(da, db));
    simd->bf16_decode_accumulate(payload.data(), n, 1.3f, acc_a.data());
    ref.bf16_decode_accumulate(payload.data(), n, 1.3f, acc_b.data());
    ASSERT_TRUE(same_bits(acc_a, acc_b));
    // decode_add: both sets alike, and equal to a copy plus weight 1.
    Floats sum_a(n), sum_b(n), one = acc_a;
    simd->fp16_decode_add(payload.data(), n, 0x1p-7f, acc_a.data(), sum_a.data());
    ref.fp16_decode_add(payload.data(), n, 0x1p-7f, acc_a.data(), sum_b.data());
    ASSERT_TRUE(same_bits(sum_a, sum_b));
    ref.fp16_decode_accumulate(payload.data(), n, 0x1p-7f, 1.0f, one.data());
    ASSERT_TRUE(same_bits(sum_a, one));
    one = acc_a;
    simd->bf16_decode_add(payload.data(), n, acc_a.data(), sum_a.data());
    ref.bf16_decode_add(payload.data(), n, acc_a.data(), sum_b.data());
    ASSERT_TRUE(same_bits(sum_a, sum_b));
    ref.bf16_decode_accumulate(payload.data(), n, 1.0f, one.data());
    ASSERT_TRUE(same_bits(sum_a, one));
  }
  Bytes every;  // every half but NaN (which never passes validate())
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) continue;
    every.insert(every.end(), {uint8_t(h), uint8_t(h >> 8)});
  }
  Floats a(every.size() / 2), b(a.size());
  simd->fp16_decode(every.data(), a.size(), 1.0f, a.data());
  ref.fp16_decode(every.data(), b.size(), 1.0f, b.data());
  EXPECT_TRUE(same_bits(a, b));
}

// The two kernels of error feedback with a bf16 residual give what the
// three they stand for give (bf16_decode, fp16_encode with that residual,
// bf16_encode), bit for bit, on either kernel set, for a difference and for
// plain values, clamped and not; the maximum sees a non-finite value.
TEST(Fp16Kernels, Bf16FeedbackKernelsAreTheThreeTheyReplace) {
  std::vector<const kernels::HalfKernels*> sets{&kernels::scalar_half_kernels()};
  if (kernels::avx2_half_kernels()) sets.push_back(kernels::avx2_half_kernels());
  const float inf = std::numeric_limits<float>::infinity();
  for (const kernels::HalfKernels* k : sets) {
    for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(2048)}) {
      Floats a = edge_values(n), b = random_floats(n, 51, 1e-2f);
      for (auto& x : a) x = std::isfinite(x) ? x : 0.5f;
      Bytes bits0(2 * n);
      const Floats r0 = random_floats(n, 52, 1e-4f);
      k->bf16_encode(r0.data(), nullptr, n, bits0.data());
      for (const bool diff : {false, true}) {
        Floats in(n);
        for (size_t i = 0; i < n; ++i) in[i] = diff ? a[i] - b[i] : a[i];
        Floats r(n), v(n);
        k->bf16_decode(bits0.data(), n, r.data());
        const uint32_t want = k->max_abs_bits(in.data(), r.data(), n);
        ASSERT_EQ(
            k->add_bf16_residual(a.data(), diff ? b.data() : nullptr, bits0.data(), n, v.data()),
            want)
            << k->name << " n=" << n;
        for (kernels::Fp16Scale s :
             {kernels::fp16_scale_for(want), kernels::Fp16Scale{0x1p-10f, 0x1p10f, 65504.0f},
              kernels::Fp16Scale{0x1p-10f, 0x1p10f, inf}}) {
          Bytes out_a(2 * n), out_b(2 * n), bits_a = bits0, bits_b = bits0;
          Floats rr = r;
          k->fp16_encode(in.data(), rr.data(), n, s, out_a.data());
          k->bf16_encode(rr.data(), nullptr, n, bits_a.data());
          k->fp16_encode_bf16_residual(v.data(), n, s, out_b.data(), bits_b.data());
          ASSERT_EQ(out_a, out_b) << k->name << " n=" << n << " scale=" << s.scale;
          ASSERT_EQ(bits_a, bits_b) << k->name << " n=" << n << " scale=" << s.scale;
        }
      }
      if (n > 0) {
        a[n / 2] = -inf;
        Floats v(n);
        EXPECT_GE(k->add_bf16_residual(a.data(), b.data(), bits0.data(), n, v.data()),
                  kernels::kF32ExpMask)
            << k->name << " n=" << n;
      }
    }
  }
}

// The root's anchor kernels give what the steps they stand for give (the
// difference, fp16_encode, fp16_decode, held + step, theta - next and
// bf16_encode), bit for bit, on either kernel set, clamped and not, the
// anchor moved or not; the maximum sees a non-finite difference.
TEST(Fp16Kernels, RootSettleKernelsAreTheStepsTheyReplace) {
  std::vector<const kernels::HalfKernels*> sets{&kernels::scalar_half_kernels()};
  if (kernels::avx2_half_kernels()) sets.push_back(kernels::avx2_half_kernels());
  const float inf = std::numeric_limits<float>::infinity();
  for (const kernels::HalfKernels* k : sets) {
    for (size_t n :
         {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(33), size_t(2048)}) {
      Floats theta = edge_values(n), held = random_floats(n, 61, 1e-1f);
      for (auto& x : theta) x = std::isfinite(x) ? x : 0.25f;
      // Some steps nothing, some under fp16's range, some of either sign.
      for (size_t i = 0; i < n; i += 5) theta[i] = held[i];
      for (size_t i = 1; i < n; i += 11) theta[i] = held[i] + 1e-30f;
      Floats d(n);
      for (size_t i = 0; i < n; ++i) d[i] = theta[i] - held[i];
      const uint32_t top = k->max_abs_bits(d.data(), nullptr, n);
      ASSERT_EQ(k->sub_max_abs_bits(theta.data(), held.data(), n), top) << k->name << " n=" << n;
      for (kernels::Fp16Scale s :
           {kernels::fp16_scale_for(top), kernels::Fp16Scale{0x1p-10f, 0x1p10f, 65504.0f},
            kernels::Fp16Scale{0x1p-10f, 0x1p10f, inf}}) {
        Bytes out_a(2 * n), bits_a(2 * n);
        Floats step(n), next = held, rest = theta;
        k->fp16_encode(d.data(), nullptr, n, s, out_a.data());
        k->fp16_decode(out_a.data(), n, s.scale, step.data());
        for (size_t i = 0; i < n; ++i) {
          next[i] = held[i] + step[i];
          rest[i] = theta[i] - next[i];
        }
        k->bf16_encode(rest.data(), nullptr, n, bits_a.data());
        for (const bool advance : {false, true}) {
          Bytes out_b(2 * n, 0x5a), bits_b(2 * n, 0xa5);
          Floats h = held;
          k->fp16_encode_settle(theta.data(), h.data(), n, s, advance, out_b.data(), bits_b.data());
          ASSERT_EQ(out_a, out_b) << k->name << " n=" << n << " scale=" << s.scale;
          ASSERT_EQ(bits_a, bits_b) << k->name << " n=" << n << " scale=" << s.scale;
          ASSERT_TRUE(same_bits(h, advance ? next : held)) << k->name << " n=" << n;
        }
      }
      if (n > 0) {
        theta[n - 1] = -inf;
        EXPECT_GE(k->sub_max_abs_bits(theta.data(), held.data(), n), kernels::kF32ExpMask)
            << k->name << " n=" << n;
        theta[n - 1] = 3e38f;
        held[n - 1] = -3e38f;  // finite both, their difference not
        EXPECT_GE(k->sub_max_abs_bits(theta.data(), held.data(), n), kernels::kF32ExpMask)
            << k->name << " n=" << n;
      }
    }
  }
}

}  // namespace
}  // namespace fedwan
