// The AVX2 + F16C set of the fp32 <-> fp16 / bf16 kernels (half.hpp): the
// same results as the scalar set bit for bit, whose kernels also finish
// the tails here, so every element goes through the same sequence of IEEE
// operations on either path.
#include <algorithm>
#include <cstring>
#include <limits>

#include "codec/half.hpp"
#include "common/cpu_features.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fedwan::kernels {
#if defined(__x86_64__)
namespace {

// No "fma" in the target list on purpose: without it the compiler cannot
// contract mul+add, which keeps the results equal to the scalar path.
#define FEDWAN_AVX2 __attribute__((target("avx2,f16c")))

constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

FEDWAN_AVX2 inline __m256i abs_bits(__m256 v) {
  return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(int(kF32AbsMask)));
}

// The largest bit pattern of |v(i)| over the head of n values a multiple
// of 32 long (its length in *done), where `load` gives v(i .. i + 7): four
// accumulators, so the loop is bound by loads, not by max latency.
template <class Load>
FEDWAN_AVX2 inline uint32_t avx2_max_bits_head(size_t n, size_t* done, Load load) {
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_epi32(m0, abs_bits(load(i)));
    m1 = _mm256_max_epi32(m1, abs_bits(load(i + 8)));
    m2 = _mm256_max_epi32(m2, abs_bits(load(i + 16)));
    m3 = _mm256_max_epi32(m3, abs_bits(load(i + 24)));
  }
  *done = i;
  // Signed max is right: every masked pattern is non-negative as an int32.
  const __m256i m = _mm256_max_epi32(_mm256_max_epi32(m0, m1), _mm256_max_epi32(m2, m3));
  __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xB1));
  return uint32_t(_mm_cvtsi128_si32(h));
}

// What avx2_max_bits_head loads: in + res, in alone, a - b.
struct LoadSum {
  const float *a, *b;
  FEDWAN_AVX2 __m256 operator()(size_t i) const {
    return _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
  }
};
struct LoadOne {
  const float* a;
  FEDWAN_AVX2 __m256 operator()(size_t i) const { return _mm256_loadu_ps(a + i); }
};
struct LoadDifference {
  const float *a, *b;
  FEDWAN_AVX2 __m256 operator()(size_t i) const {
    return _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
  }
};

FEDWAN_AVX2 uint32_t avx2_max_abs_bits(const float* in, const float* res, size_t n) {
  size_t i = 0;
  const uint32_t head =
      res ? avx2_max_bits_head(n, &i, LoadSum{in, res}) : avx2_max_bits_head(n, &i, LoadOne{in});
  return std::max(head, scalar_half_kernels().max_abs_bits(in + i, res ? res + i : nullptr, n - i));
}

// Clamp is false only for an infinite limit, where clamping is a no-op.
template <bool Clamp>
FEDWAN_AVX2 inline __m128i avx2_fp16_quantise(__m256 v, __m256 inv, __m256 lo, __m256 hi) {
  __m256 t = _mm256_mul_ps(v, inv);
  if constexpr (Clamp) t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
  return _mm256_cvtps_ph(t, kRoundNearest);
}

template <bool Clamp>
FEDWAN_AVX2 size_t avx2_fp16_encode_head(const float* in, float* res, size_t n, const Fp16Scale& s,
                                         uint8_t* out) {
  const __m256 inv = _mm256_set1_ps(s.inv), scale = _mm256_set1_ps(s.scale);
  const __m256 hi = _mm256_set1_ps(s.limit), lo = _mm256_set1_ps(-s.limit);
  size_t i = 0;
  if (res) {
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_add_ps(_mm256_loadu_ps(in + i), _mm256_loadu_ps(res + i));
      const __m128i h = avx2_fp16_quantise<Clamp>(v, inv, lo, hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
      const __m256 back = _mm256_mul_ps(_mm256_cvtph_ps(h), scale);
      _mm256_storeu_ps(res + i, _mm256_sub_ps(v, back));
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      const __m128i h0 = avx2_fp16_quantise<Clamp>(_mm256_loadu_ps(in + i), inv, lo, hi);
      const __m128i h1 = avx2_fp16_quantise<Clamp>(_mm256_loadu_ps(in + i + 8), inv, lo, hi);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), _mm256_set_m128i(h1, h0));
    }
  }
  return i;
}

FEDWAN_AVX2 void avx2_fp16_encode(const float* in, float* res, size_t n, const Fp16Scale& s,
                                  uint8_t* out) {
  const size_t i = s.limit == std::numeric_limits<float>::infinity()
                       ? avx2_fp16_encode_head<false>(in, res, n, s, out)
                       : avx2_fp16_encode_head<true>(in, res, n, s, out);
  scalar_half_kernels().fp16_encode(in + i, res ? res + i : nullptr, n - i, s, out + 2 * i);
}

FEDWAN_AVX2 inline __m256 load_fp16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

FEDWAN_AVX2 void avx2_fp16_decode(const uint8_t* in, size_t n, float scale, float* out) {
  const __m256 sc = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(load_fp16x8(in + 2 * i), sc));
  scalar_half_kernels().fp16_decode(in + 2 * i, n - i, scale, out + i);
}

FEDWAN_AVX2 void avx2_fp16_decode_accumulate(const uint8_t* in, size_t n, float scale, float weight,
                                             float* acc) {
  const __m256 sc = _mm256_set1_ps(scale), w = _mm256_set1_ps(weight);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_mul_ps(load_fp16x8(in + 2 * i), sc);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(w, x)));
  }
  scalar_half_kernels().fp16_decode_accumulate(in + 2 * i, n - i, scale, weight, acc + i);
}

FEDWAN_AVX2 void avx2_fp16_decode_add(const uint8_t* in, size_t n, float scale, const float* base,
                                      float* out) {
  const __m256 sc = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_mul_ps(load_fp16x8(in + 2 * i), sc);
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(base + i), x));
  }
  scalar_half_kernels().fp16_decode_add(in + 2 * i, n - i, scale, base + i, out + i);
}

// Same integer rounding as fp32_to_bf16, eight lanes at a time; returns the
// bf16 patterns zero-extended in 32-bit lanes.
FEDWAN_AVX2 inline __m256i avx2_bf16_round(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i a = _mm256_and_si256(x, _mm256_set1_epi32(int(kF32AbsMask)));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7FFF)), lsb);
  r = _mm256_min_epu32(_mm256_srli_epi32(r, 16), _mm256_set1_epi32(0x7F7F));
  const __m256i sign = _mm256_srli_epi32(x, 31);
  return _mm256_or_si256(r, _mm256_slli_epi32(sign, 15));
}

FEDWAN_AVX2 inline void store_u16x8(uint8_t* p, __m256i r) {
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

FEDWAN_AVX2 void avx2_bf16_encode(const float* in, float* res, size_t n, uint8_t* out) {
  size_t i = 0;
  if (res) {
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_add_ps(_mm256_loadu_ps(in + i), _mm256_loadu_ps(res + i));
      const __m256i r = avx2_bf16_round(v);
      store_u16x8(out + 2 * i, r);
      const __m256 back = _mm256_castsi256_ps(_mm256_slli_epi32(r, 16));
      _mm256_storeu_ps(res + i, _mm256_sub_ps(v, back));
    }
  } else {
    for (; i + 8 <= n; i += 8) store_u16x8(out + 2 * i, avx2_bf16_round(_mm256_loadu_ps(in + i)));
  }
  scalar_half_kernels().bf16_encode(in + i, res ? res + i : nullptr, n - i, out + 2 * i);
}

FEDWAN_AVX2 inline __m256 load_bf16x8(const uint8_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

FEDWAN_AVX2 void avx2_bf16_decode(const uint8_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_bf16x8(in + 2 * i));
  scalar_half_kernels().bf16_decode(in + 2 * i, n - i, out + i);
}

FEDWAN_AVX2 void avx2_bf16_decode_accumulate(const uint8_t* in, size_t n, float weight,
                                             float* acc) {
  const __m256 w = _mm256_set1_ps(weight);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = load_bf16x8(in + 2 * i);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(w, x)));
  }
  scalar_half_kernels().bf16_decode_accumulate(in + 2 * i, n - i, weight, acc + i);
}

FEDWAN_AVX2 void avx2_bf16_decode_add(const uint8_t* in, size_t n, const float* base, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(base + i), load_bf16x8(in + 2 * i)));
  }
  scalar_half_kernels().bf16_decode_add(in + 2 * i, n - i, base + i, out + i);
}

FEDWAN_AVX2 uint16_t avx2_u16_max_abs(const uint8_t* in, size_t n) {
  const __m256i mask = _mm256_set1_epi16(0x7FFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i + 32));
    m0 = _mm256_max_epu16(m0, _mm256_and_si256(a, mask));
    m1 = _mm256_max_epu16(m1, _mm256_and_si256(b, mask));
  }
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu16(m0, m1));
  uint16_t m = scalar_half_kernels().u16_max_abs(in + 2 * i, n - i);
  for (uint16_t v : lanes) m = std::max(m, v);
  return m;
}

FEDWAN_AVX2 uint32_t avx2_add_bf16_residual(const float* a, const float* b, const uint8_t* bits,
                                            size_t n, float* out) {
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 d0 = _mm256_loadu_ps(a + i), d1 = _mm256_loadu_ps(a + i + 8);
    if (b) {
      d0 = _mm256_sub_ps(d0, _mm256_loadu_ps(b + i));
      d1 = _mm256_sub_ps(d1, _mm256_loadu_ps(b + i + 8));
    }
    const __m256 v0 = _mm256_add_ps(d0, load_bf16x8(bits + 2 * i));
    const __m256 v1 = _mm256_add_ps(d1, load_bf16x8(bits + 2 * i + 16));
    _mm256_storeu_ps(out + i, v0);
    _mm256_storeu_ps(out + i + 8, v1);
    m0 = _mm256_max_epi32(m0, abs_bits(v0));
    m1 = _mm256_max_epi32(m1, abs_bits(v1));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epi32(m0, m1));
  uint32_t m = scalar_half_kernels().add_bf16_residual(a + i, b ? b + i : nullptr, bits + 2 * i,
                                                       n - i, out + i);
  for (uint32_t v : lanes) m = std::max(m, v);
  return m;
}

template <bool Clamp>
FEDWAN_AVX2 size_t avx2_fp16_encode_bf16_head(const float* v, size_t n, const Fp16Scale& s,
                                              uint8_t* out, uint8_t* bits) {
  const __m256 inv = _mm256_set1_ps(s.inv), scale = _mm256_set1_ps(s.scale);
  const __m256 hi = _mm256_set1_ps(s.limit), lo = _mm256_set1_ps(-s.limit);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    const __m128i h = avx2_fp16_quantise<Clamp>(x, inv, lo, hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
    const __m256 back = _mm256_mul_ps(_mm256_cvtph_ps(h), scale);
    store_u16x8(bits + 2 * i, avx2_bf16_round(_mm256_sub_ps(x, back)));
  }
  return i;
}

FEDWAN_AVX2 void avx2_fp16_encode_bf16_residual(const float* v, size_t n, const Fp16Scale& s,
                                                uint8_t* out, uint8_t* bits) {
  const size_t i = s.limit == std::numeric_limits<float>::infinity()
                       ? avx2_fp16_encode_bf16_head<false>(v, n, s, out, bits)
                       : avx2_fp16_encode_bf16_head<true>(v, n, s, out, bits);
  scalar_half_kernels().fp16_encode_bf16_residual(v + i, n - i, s, out + 2 * i, bits + 2 * i);
}

FEDWAN_AVX2 uint32_t avx2_sub_max_abs_bits(const float* a, const float* b, size_t n) {
  size_t i = 0;
  const uint32_t head = avx2_max_bits_head(n, &i, LoadDifference{a, b});
  return std::max(head, scalar_half_kernels().sub_max_abs_bits(a + i, b + i, n - i));
}

template <bool Clamp, bool Advance>
FEDWAN_AVX2 size_t avx2_fp16_encode_settle_head(const float* theta, float* held, size_t n,
                                                const Fp16Scale& s, uint8_t* out, uint8_t* bits) {
  const __m256 inv = _mm256_set1_ps(s.inv), scale = _mm256_set1_ps(s.scale);
  const __m256 hi = _mm256_set1_ps(s.limit), lo = _mm256_set1_ps(-s.limit);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 t = _mm256_loadu_ps(theta + i), base = _mm256_loadu_ps(held + i);
    const __m128i h = avx2_fp16_quantise<Clamp>(_mm256_sub_ps(t, base), inv, lo, hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
    const __m256 next = _mm256_add_ps(base, _mm256_mul_ps(_mm256_cvtph_ps(h), scale));
    store_u16x8(bits + 2 * i, avx2_bf16_round(_mm256_sub_ps(t, next)));
    if constexpr (Advance) _mm256_storeu_ps(held + i, next);
  }
  return i;
}

FEDWAN_AVX2 void avx2_fp16_encode_settle(const float* theta, float* held, size_t n,
                                         const Fp16Scale& s, bool advance, uint8_t* out,
                                         uint8_t* bits) {
  const bool clamp = s.limit != std::numeric_limits<float>::infinity();
  const size_t i =
      clamp ? (advance ? avx2_fp16_encode_settle_head<true, true>(theta, held, n, s, out, bits)
                       : avx2_fp16_encode_settle_head<true, false>(theta, held, n, s, out, bits))
            : (advance ? avx2_fp16_encode_settle_head<false, true>(theta, held, n, s, out, bits)
                       : avx2_fp16_encode_settle_head<false, false>(theta, held, n, s, out, bits));
  scalar_half_kernels().fp16_encode_settle(theta + i, held + i, n - i, s, advance, out + 2 * i,
                                           bits + 2 * i);
}

const HalfKernels kAvx2{"avx2",
                        avx2_max_abs_bits,
                        avx2_fp16_encode,
                        avx2_fp16_decode,
                        avx2_fp16_decode_accumulate,
                        avx2_fp16_decode_add,
                        avx2_bf16_encode,
                        avx2_bf16_decode,
                        avx2_bf16_decode_accumulate,
                        avx2_bf16_decode_add,
                        avx2_u16_max_abs,
                        avx2_add_bf16_residual,
                        avx2_fp16_encode_bf16_residual,
                        avx2_sub_max_abs_bits,
                        avx2_fp16_encode_settle};

}  // namespace
#endif  // __x86_64__

const HalfKernels* avx2_half_kernels() {
#if defined(__x86_64__)
  return cpu_has_avx2_f16c() ? &kAvx2 : nullptr;
#else
  return nullptr;
#endif
}

}  // namespace fedwan::kernels
