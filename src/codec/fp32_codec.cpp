#include "codec/fp32_codec.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "codec/half.hpp"

namespace fedwan {
namespace {

constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// The payload may be unaligned, hence memcpy; on little-endian hosts these
// compile to plain (vectorisable) loads and stores.
inline uint32_t load_u32(const uint8_t* p) {
  if (kLittleEndian) {
    uint32_t u;
    std::memcpy(&u, p, sizeof u);
    return u;
  }
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

inline float load_f32(const uint8_t* p) {
  const uint32_t u = load_u32(p);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline void store_f32(uint8_t* p, float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (kLittleEndian) {
    std::memcpy(p, &u, sizeof u);
    return;
  }
  for (int b = 0; b < 4; ++b) p[b] = uint8_t(u >> (8 * b));
}

}  // namespace

void Fp32Codec::encode(const float* in, size_t n, float* residual, uint8_t* out) const {
  const auto& k = kernels::half_kernels();
  kernels::require_finite_input("fp32", k.max_abs_bits(in, residual, n), in, residual, n);
  if (n == 0) return;
  if (!residual) {
    if (kLittleEndian) {
      std::memcpy(out, in, 4 * n);
    } else {
      for (size_t i = 0; i < n; ++i) store_f32(out + 4 * i, in[i]);
    }
    return;
  }
  kernels::for_blocks_backward(n, [&](size_t b, size_t len) {
    for (size_t i = b; i < b + len; ++i) store_f32(out + 4 * i, in[i] + residual[i]);
    std::fill(residual + b, residual + b + len, 0.0f);
  });
}

bool Fp32Codec::validate(const uint8_t* in, size_t bytes, size_t n) const {
  if (n > std::numeric_limits<size_t>::max() / 4 || bytes != encoded_size(n)) return false;
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, load_u32(in + 4 * i) & kernels::kF32AbsMask);
  return m < kernels::kF32ExpMask;
}

void Fp32Codec::decode(const uint8_t* in, size_t n, float* out) const {
  if (n == 0) return;
  if (kLittleEndian) {
    std::memcpy(out, in, 4 * n);
    return;
  }
  for (size_t i = 0; i < n; ++i) out[i] = load_f32(in + 4 * i);
}

void Fp32Codec::decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const {
  for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + weight * load_f32(in + 4 * i);
}

}  // namespace fedwan
