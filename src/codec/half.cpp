#include "codec/half.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "fedwan/error.hpp"

namespace fedwan::kernels {
namespace {

using codec_math::bits_of;
// Byte-wise so the payload is little-endian on any host and may be unaligned.
inline uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline void store_u16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
}

}  // namespace

uint16_t fp32_to_fp16(float f) { return codec_math::fp32_to_fp16(f); }
float fp16_to_fp32(uint16_t h) { return codec_math::fp16_to_fp32(h); }
uint16_t fp32_to_bf16(float f) { return codec_math::fp32_to_bf16(f); }
float bf16_to_fp32(uint16_t h) { return codec_math::bf16_to_fp32(h); }
Fp16Scale fp16_scale_for(uint32_t max_abs_bits) { return codec_math::fp16_scale_for(max_abs_bits); }

void require_finite_input(const char* codec, uint32_t max_abs_bits, const float* in,
                          const float* residual, size_t n) {
  if (max_abs_bits < kF32ExpMask) return;
  size_t i = 0;
  float v = 0.0f;
  for (; i < n; ++i) {
    v = residual ? in[i] + residual[i] : in[i];
    if ((bits_of(v) & kF32AbsMask) >= kF32ExpMask) break;
  }
  throw Error(std::string("codec ") + codec + ": cannot encode a non-finite value (" +
              std::to_string(v) + (residual ? " in input + residual" : " in input") +
              " at element " + std::to_string(i) + " of " + std::to_string(n) +
              "); the model update diverged or was not initialised");
}

// ---- scalar kernels -------------------------------------------------------
// These also finish the tails of the vector kernels, so every element goes
// through the same sequence of IEEE operations on either path.
namespace {

uint32_t scalar_max_abs_bits(const float* in, const float* res, size_t n) {
  uint32_t m = 0;
  if (res) {
    for (size_t i = 0; i < n; ++i) m = std::max(m, bits_of(in[i] + res[i]) & kF32AbsMask);
  } else {
    for (size_t i = 0; i < n; ++i) m = std::max(m, bits_of(in[i]) & kF32AbsMask);
  }
  return m;
}

using codec_math::fp16_quantise;

void scalar_fp16_encode(const float* in, float* res, size_t n, const Fp16Scale& s, uint8_t* out) {
  if (!res) {
    for (size_t i = 0; i < n; ++i) store_u16(out + 2 * i, fp16_quantise(in[i], s));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float v = in[i] + res[i];
    const uint16_t h = fp16_quantise(v, s);
    store_u16(out + 2 * i, h);
    res[i] = v - fp16_to_fp32(h) * s.scale;
  }
}

void scalar_fp16_decode(const uint8_t* in, size_t n, float scale, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(load_u16(in + 2 * i)) * scale;
}

void scalar_fp16_decode_accumulate(const uint8_t* in, size_t n, float scale, float weight,
                                   float* acc) {
  for (size_t i = 0; i < n; ++i) {
    const float x = fp16_to_fp32(load_u16(in + 2 * i)) * scale;
    acc[i] = acc[i] + weight * x;
  }
}

void scalar_fp16_decode_add(const uint8_t* in, size_t n, float scale, const float* base,
                            float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = base[i] + fp16_to_fp32(load_u16(in + 2 * i)) * scale;
}

void scalar_bf16_encode(const float* in, float* res, size_t n, uint8_t* out) {
  if (!res) {
    for (size_t i = 0; i < n; ++i) store_u16(out + 2 * i, fp32_to_bf16(in[i]));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float v = in[i] + res[i];
    const uint16_t h = fp32_to_bf16(v);
    store_u16(out + 2 * i, h);
    res[i] = v - bf16_to_fp32(h);
  }
}

void scalar_bf16_decode(const uint8_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(load_u16(in + 2 * i));
}

void scalar_bf16_decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) {
  for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + weight * bf16_to_fp32(load_u16(in + 2 * i));
}

void scalar_bf16_decode_add(const uint8_t* in, size_t n, const float* base, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = base[i] + bf16_to_fp32(load_u16(in + 2 * i));
}

uint16_t scalar_u16_max_abs(const uint8_t* in, size_t n) {
  uint16_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max<uint16_t>(m, load_u16(in + 2 * i) & 0x7FFFu);
  return m;
}

uint32_t scalar_add_bf16_residual(const float* a, const float* b, const uint8_t* bits, size_t n,
                                  float* out) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = (b ? a[i] - b[i] : a[i]) + bf16_to_fp32(load_u16(bits + 2 * i));
    out[i] = v;
    m = std::max(m, bits_of(v) & kF32AbsMask);
  }
  return m;
}

void scalar_fp16_encode_bf16_residual(const float* v, size_t n, const Fp16Scale& s, uint8_t* out,
                                      uint8_t* bits) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = fp16_quantise(v[i], s);
    store_u16(out + 2 * i, h);
    store_u16(bits + 2 * i, fp32_to_bf16(v[i] - fp16_to_fp32(h) * s.scale));
  }
}

uint32_t scalar_sub_max_abs_bits(const float* a, const float* b, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, bits_of(a[i] - b[i]) & kF32AbsMask);
  return m;
}

void scalar_fp16_encode_settle(const float* theta, float* held, size_t n, const Fp16Scale& s,
                               bool advance, uint8_t* out, uint8_t* bits) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = fp16_quantise(theta[i] - held[i], s);
    store_u16(out + 2 * i, h);
    const float next = held[i] + fp16_to_fp32(h) * s.scale;
    store_u16(bits + 2 * i, fp32_to_bf16(theta[i] - next));
    if (advance) held[i] = next;
  }
}

const HalfKernels kScalar{"scalar",
                          scalar_max_abs_bits,
                          scalar_fp16_encode,
                          scalar_fp16_decode,
                          scalar_fp16_decode_accumulate,
                          scalar_fp16_decode_add,
                          scalar_bf16_encode,
                          scalar_bf16_decode,
                          scalar_bf16_decode_accumulate,
                          scalar_bf16_decode_add,
                          scalar_u16_max_abs,
                          scalar_add_bf16_residual,
                          scalar_fp16_encode_bf16_residual,
                          scalar_sub_max_abs_bits,
                          scalar_fp16_encode_settle};

}  // namespace

const HalfKernels& scalar_half_kernels() { return kScalar; }

// avx2_half_kernels() is in half_avx2.cpp.

const HalfKernels& half_kernels() {
  static const HalfKernels& best = avx2_half_kernels() ? *avx2_half_kernels() : kScalar;
  return best;
}

}  // namespace fedwan::kernels
