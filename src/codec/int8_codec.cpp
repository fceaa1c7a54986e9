#include "codec/int8_codec.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "codec/block_scaled.hpp"
#include "codec/half.hpp"
#include "common/cpu_features.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fedwan {
namespace kernels {
namespace {

using codec_math::add_rn;
using codec_math::int8_dequantise;
using codec_math::int8_quantise;
using codec_math::mul_rn;
using codec_math::sub_rn;

// ---- scalar kernels -------------------------------------------------------
// Plain loops over the shared arithmetic; they also finish the tails of the
// AVX2 kernels, so every element goes through the same IEEE operations.
// GCC vectorises the decoders but not the encoder: under -ftrapping-math (the
// default) it will not if-convert int8_quantise's clamp ahead of the rounding
// add, so without AVX2 encoding runs about 10x slower (clang vectorises it).

void scalar_encode(const float* in, float* res, size_t n, const Int8Scale& s, uint8_t* out) {
  if (!res) {
    for (size_t i = 0; i < n; ++i) out[i] = uint8_t(int8_quantise(in[i], s));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float v = add_rn(in[i], res[i]);
    const int8_t q = int8_quantise(v, s);
    out[i] = uint8_t(q);
    res[i] = sub_rn(v, int8_dequantise(q, s.scale));
  }
}

void scalar_decode(const uint8_t* in, size_t n, float scale, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = int8_dequantise(int8_t(in[i]), scale);
}

void scalar_decode_accumulate(const uint8_t* in, size_t n, float scale, float weight, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    acc[i] = add_rn(acc[i], mul_rn(weight, int8_dequantise(int8_t(in[i]), scale)));
  }
}

bool scalar_has_minus_128(const uint8_t* in, size_t n) {
  uint8_t found = 0;  // no early exit: the loop stays branch-free and vectorised
  for (size_t i = 0; i < n; ++i) found |= uint8_t(in[i] == 0x80u);
  return found != 0;
}

const Int8Kernels kScalar{"scalar", scalar_encode, scalar_decode, scalar_decode_accumulate,
                          scalar_has_minus_128};

// ---- AVX2 kernels ---------------------------------------------------------
// No "fma" in the target list on purpose: without it the compiler cannot
// contract mul+add, which keeps the results equal to the scalar path.
// Each kernel clears the upper halves of the YMM registers before handing
// its tail to the (SSE-encoded) scalar kernel: GCC 12 leaves the vzeroupper
// out of these tail calls, and the SSE code after dirty upper halves ran
// the encoder with error feedback 3x slower.
#if defined(__x86_64__)
#define FEDWAN_AVX2 __attribute__((target("avx2")))

// int8_quantise on eight lanes (the same clamp, the same 1.5 * 2^23 rounding
// add), returned as floats holding the integers. minps/maxps differ from
// min_f/max_f only on NaN, which never gets here. (t + M) - M is exact
// (Sterbenz) and +0 for a zero result, so the float is float(q) bit for bit.
FEDWAN_AVX2 inline __m256 avx2_round(__m256 v, __m256 inv) {
  const __m256 hi = _mm256_set1_ps(float(codec_math::kInt8Max));
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, inv), -hi), hi);
  return _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
}

// Packs four vectors of integral floats in [-127, 127] into 32 bytes, in
// order: the packs work per 128-bit lane, the permute undoes the interleave.
FEDWAN_AVX2 inline void store_i8x32(uint8_t* p, __m256 r0, __m256 r1, __m256 r2, __m256 r3) {
  const __m256i w01 = _mm256_packs_epi32(_mm256_cvtps_epi32(r0), _mm256_cvtps_epi32(r1));
  const __m256i w23 = _mm256_packs_epi32(_mm256_cvtps_epi32(r2), _mm256_cvtps_epi32(r3));
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), b);
}

FEDWAN_AVX2 void avx2_encode(const float* in, float* res, size_t n, const Int8Scale& s,
                             uint8_t* out) {
  const __m256 inv = _mm256_set1_ps(s.inv);
  size_t i = 0;
  if (res) {
    const __m256 scale = _mm256_set1_ps(s.scale);
    for (; i + 32 <= n; i += 32) {
      __m256 r[4];
      for (size_t k = 0; k < 4; ++k) {
        const __m256 v =
            _mm256_add_ps(_mm256_loadu_ps(in + i + 8 * k), _mm256_loadu_ps(res + i + 8 * k));
        r[k] = avx2_round(v, inv);
        _mm256_storeu_ps(res + i + 8 * k, _mm256_sub_ps(v, _mm256_mul_ps(r[k], scale)));
      }
      store_i8x32(out + i, r[0], r[1], r[2], r[3]);
    }
  } else {
    for (; i + 32 <= n; i += 32) {
      store_i8x32(out + i, avx2_round(_mm256_loadu_ps(in + i), inv),
                  avx2_round(_mm256_loadu_ps(in + i + 8), inv),
                  avx2_round(_mm256_loadu_ps(in + i + 16), inv),
                  avx2_round(_mm256_loadu_ps(in + i + 24), inv));
    }
  }
  _mm256_zeroupper();
  scalar_encode(in + i, res ? res + i : nullptr, n - i, s, out + i);
}

FEDWAN_AVX2 inline __m256 load_i8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

FEDWAN_AVX2 void avx2_decode(const uint8_t* in, size_t n, float scale, float* out) {
  const __m256 sc = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(load_i8x8(in + i), sc));
  _mm256_zeroupper();
  scalar_decode(in + i, n - i, scale, out + i);
}

FEDWAN_AVX2 void avx2_decode_accumulate(const uint8_t* in, size_t n, float scale, float weight,
                                        float* acc) {
  const __m256 sc = _mm256_set1_ps(scale), w = _mm256_set1_ps(weight);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_mul_ps(load_i8x8(in + i), sc);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(w, x)));
  }
  _mm256_zeroupper();
  scalar_decode_accumulate(in + i, n - i, scale, weight, acc + i);
}

FEDWAN_AVX2 bool avx2_has_minus_128(const uint8_t* in, size_t n) {
  const __m256i minus_128 = _mm256_set1_epi8(char(0x80));
  __m256i found = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    found = _mm256_or_si256(found, _mm256_cmpeq_epi8(b, minus_128));
  }
  const bool head = !_mm256_testz_si256(found, found);
  _mm256_zeroupper();
  return head || scalar_has_minus_128(in + i, n - i);
}

const Int8Kernels kAvx2{"avx2", avx2_encode, avx2_decode, avx2_decode_accumulate,
                        avx2_has_minus_128};
#endif  // __x86_64__

}  // namespace

const Int8Kernels& scalar_int8_kernels() { return kScalar; }

const Int8Kernels* avx2_int8_kernels() {
#if defined(__x86_64__)
  return cpu_has_avx2() ? &kAvx2 : nullptr;
#else
  return nullptr;
#endif
}

const Int8Kernels& int8_kernels() {
  static const Int8Kernels& best = avx2_int8_kernels() ? *avx2_int8_kernels() : kScalar;
  return best;
}

}  // namespace kernels

using kernels::for_each_block;
using kernels::load_scale;

void Int8Codec::encode(const float* in, size_t n, float* residual, uint8_t* out) const {
  const auto& k = kernels::int8_kernels();
  uint8_t* const values = out + kScaleBytes * blocks(n);
  kernels::encode_in_blocks<kBlock>(
      "int8", in, n, residual, out, [&](size_t b, size_t begin, size_t len, uint32_t max_bits) {
        const kernels::Int8Scale s = codec_math::int8_scale_for(max_bits);
        kernels::store_scale(out + kScaleBytes * b, s.scale);
        k.encode(in + begin, residual ? residual + begin : nullptr, len, s, values + begin);
      });
}

bool Int8Codec::validate(const uint8_t* in, size_t bytes, size_t n) const {
  if (n > std::numeric_limits<size_t>::max() / 2) return false;  // encoded_size overflows
  if (bytes != encoded_size(n)) return false;
  for (size_t b = 0; b < blocks(n); ++b) {
    const float scale = load_scale(in + kScaleBytes * b);
    // Zero is allowed: a block that encoded as zeros decodes the same under
    // any scale. |q| <= 127, so if 127 * scale is finite every value is.
    if (!std::isfinite(scale) || std::signbit(scale)) return false;
    if (!std::isfinite(codec_math::mul_rn(float(codec_math::kInt8Max), scale))) return false;
  }
  return !kernels::int8_kernels().has_minus_128(in + kScaleBytes * blocks(n), n);
}

void Int8Codec::decode(const uint8_t* in, size_t n, float* out) const {
  const auto& k = kernels::int8_kernels();
  const uint8_t* const values = in + kScaleBytes * blocks(n);
  for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    k.decode(values + begin, len, load_scale(in + kScaleBytes * b), out + begin);
  });
}

void Int8Codec::decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const {
  const auto& k = kernels::int8_kernels();
  const uint8_t* const values = in + kScaleBytes * blocks(n);
  for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    k.decode_accumulate(values + begin, len, load_scale(in + kScaleBytes * b), weight, acc + begin);
  });
}

}  // namespace fedwan
