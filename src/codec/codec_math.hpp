// The per-element arithmetic of the lossy codecs, written once for the CPU
// codecs (src/codec) and the CUDA kernels (cuda/), so a GPU site's payload is
// the CPU codec's payload bit for bit: same conversions, same scales, same
// rounding, and every multiply and add rounded on its own (no fused
// multiply-add; the host side is built with -ffp-contract=off, the device
// side spells the rounding out with __fmul_rn and friends).
//
// Header-only; every function is a pure function of its arguments.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define FEDWAN_HD __host__ __device__ __forceinline__
#else
#define FEDWAN_HD inline
#endif

namespace fedwan::codec_math {

inline constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kF32ExpMask = 0x7F800000u;  // abs bits >= this: Inf/NaN

FEDWAN_HD uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

FEDWAN_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// One IEEE operation each, round to nearest even, never contracted.
FEDWAN_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FEDWAN_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FEDWAN_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FEDWAN_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// min/max of two finite floats (callers never pass NaN).
FEDWAN_HD float min_f(float a, float b) { return b < a ? b : a; }
FEDWAN_HD float max_f(float a, float b) { return a < b ? b : a; }

// ---- fp16 / bf16 conversions ---------------------------------------------

// Round to nearest, ties to even. Overflow gives +-Inf, NaN stays NaN.
// On the device every value but NaN takes the conversion instruction
// (cvt.rn.f16.f32: the same rounding, subnormal halves included), which
// spares the kernels the integer arithmetic below; NaN keeps its payload
// the way the host spells it.
FEDWAN_HD uint16_t fp32_to_fp16(float f) {
#if defined(__CUDA_ARCH__)
  if ((bits_of(f) & kF32AbsMask) <= kF32ExpMask) return __half_as_ushort(__float2half_rn(f));
#endif
  uint32_t x = bits_of(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= kF32AbsMask;
  if (x >= kF32ExpMask) {  // NaN keeps a quiet bit so it cannot turn into Inf
    return x == kF32ExpMask ? uint16_t(sign | 0x7C00u)
                            : uint16_t(sign | 0x7E00u | ((x >> 13) & 0x3FFu));
  }
  if (x >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 rounds past 65504
  if (x >= 0x38800000u) {
    // Normal half: rebias the exponent (127 -> 15) and round off 13 bits; a
    // carry out of the mantissa correctly bumps the exponent.
    return uint16_t(sign | ((x - 0x38000000u + 0xFFFu + ((x >> 13) & 1u)) >> 13));
  }
  if (x <= 0x33000000u) return sign;  // <= 2^-25: the tie goes to the even zero
  // Subnormal half, counted in units of 2^-24.
  const uint32_t e = x >> 23;
  const uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return uint16_t(sign | q);
}

FEDWAN_HD float fp16_to_fp32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  if ((h & 0x7FFFu) <= 0x7C00u) return __half2float(__ushort_as_half(h));  // exact, not NaN
#endif
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return float_of(sign | kF32ExpMask | (m << 13));
  if (e != 0) return float_of(sign | ((e + 112) << 23) | (m << 13));
  return float_of(sign | bits_of(mul_rn(float(m), 0x1p-24f)));  // exact: m < 2^10
}

// Round to nearest, ties to even, but finite values saturate at the largest
// finite bf16 instead of rounding up to Inf (FLT_MAX would otherwise). NaN and
// Inf never reach it: encoders reject non-finite input first.
FEDWAN_HD uint16_t fp32_to_bf16(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t a = x & kF32AbsMask;
  uint32_t r = (a + 0x7FFFu + ((a >> 16) & 1u)) >> 16;
  if (r > 0x7F7Fu) r = 0x7F7Fu;
  return uint16_t(r | ((x >> 16) & 0x8000u));
}

FEDWAN_HD float bf16_to_fp32(uint16_t h) { return float_of(uint32_t(h) << 16); }

// ---- fp16 with a power-of-two scale per block -----------------------------

// The block's largest magnitude lands in [2^14, 2^15) of the half range, so
// small values keep their precision, and scaling either way is exact.
struct Fp16Scale {
  float scale = 1.0f;  // decoded = half * scale
  float inv = 1.0f;    // 1 / scale, exactly
  // Clamp for scaled values before rounding. +Inf, meaning no clamp (the
  // block's values scale below 2^15, so none is needed), except when the
  // block's magnitude is near FLT_MAX, where rounding up to 2^15 would
  // decode to Inf; then the largest half below 2^15.
  float limit = float_of(kF32ExpMask);
};

// `max_abs_bits` is the bit pattern of the block's largest |value| (finite).
FEDWAN_HD Fp16Scale fp16_scale_for(uint32_t max_abs_bits) {
  Fp16Scale s;
  if (max_abs_bits == 0) return s;        // all zeros: any scale decodes them exactly
  const int e = int(max_abs_bits >> 23);  // biased exponent; 0 when subnormal
  // Clamped to the smallest normal float so 1/scale stays representable;
  // only chunks below ~1e-34 lose precision to that.
  const int se = e - 14 > 1 ? e - 14 : 1;
  s.scale = float_of(uint32_t(se) << 23);
  s.inv = float_of(uint32_t(254 - se) << 23);
  if (e == 254) s.limit = 32752.0f;
  return s;
}

FEDWAN_HD uint16_t fp16_quantise(float v, const Fp16Scale& s) {
  return fp32_to_fp16(min_f(max_f(mul_rn(v, s.inv), -s.limit), s.limit));
}

FEDWAN_HD float fp16_dequantise(uint16_t h, float scale) { return mul_rn(fp16_to_fp32(h), scale); }

// ---- int8 with an fp32 scale per block -------------------------------------

// Block of the int8 codec: 256 elements, so the scales cost 1.6% on top of
// the bytes and one outlier only coarsens its own 256 neighbours.
inline constexpr uint32_t kInt8Block = 256;
inline constexpr int kInt8Max = 127;  // symmetric: -128 is never produced, and rejected
// Blocks whose largest magnitude is below 2^-120 encode as zeros (scale 0):
// 127 / max would overflow fp32. Error feedback keeps what they lose.
inline constexpr uint32_t kInt8TinyBits = 0x03800000u;  // 2^-120

struct Int8Scale {
  float scale = 0.0f;  // decoded = q * scale
  float inv = 0.0f;    // 127 / max: what a value is multiplied by before rounding
};

FEDWAN_HD Int8Scale int8_scale_for(uint32_t max_abs_bits) {
  Int8Scale s;
  if (max_abs_bits < kInt8TinyBits) return s;
  const float m = float_of(max_abs_bits);
  s.scale = div_rn(m, float(kInt8Max));
  // Only for m == FLT_MAX does 127 * scale round up to Inf; one ulp less
  // keeps every decoded value finite (the residual takes the difference).
  if ((bits_of(mul_rn(float(kInt8Max), s.scale)) & kF32AbsMask) >= kF32ExpMask) {
    s.scale = float_of(bits_of(s.scale) - 1);
  }
  s.inv = div_rn(float(kInt8Max), m);
  return s;
}

// round(clamp(v * inv, -127, 127)), ties to even. Adding and subtracting
// 1.5 * 2^23 rounds to an integer in the current (nearest-even) mode for any
// |t| < 2^22, on the CPU and the GPU alike.
FEDWAN_HD int8_t int8_quantise(float v, const Int8Scale& s) {
  const float t = min_f(max_f(mul_rn(v, s.inv), -float(kInt8Max)), float(kInt8Max));
  const float r = sub_rn(add_rn(t, 12582912.0f), 12582912.0f);
  return int8_t(int(r));
}

FEDWAN_HD float int8_dequantise(int8_t q, float scale) { return mul_rn(float(q), scale); }

}  // namespace fedwan::codec_math
