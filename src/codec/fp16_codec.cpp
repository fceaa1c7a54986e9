#include "codec/fp16_codec.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "codec/half.hpp"

namespace fedwan {
namespace {

float load_scale(const uint8_t* p) {
  const uint32_t u =
      uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

void store_scale(uint8_t* p, float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  for (int b = 0; b < 4; ++b) p[b] = uint8_t(u >> (8 * b));
}

}  // namespace

void Fp16Codec::encode(const float* in, size_t n, float* residual, uint8_t* out) const {
  const auto& k = kernels::half_kernels();
  // Two passes: the scale depends on the whole chunk. The first also finds
  // non-finite input, so the residual is untouched when we throw.
  const uint32_t max_bits = k.max_abs_bits(in, residual, n);
  kernels::require_finite_input("fp16", max_bits, in, residual, n);
  const kernels::Fp16Scale s = kernels::fp16_scale_for(max_bits);
  store_scale(out, s.scale);
  uint8_t* const halves = out + kScaleBytes;
  kernels::for_blocks_backward(n, [&](size_t b, size_t len) {
    k.fp16_encode(in + b, residual ? residual + b : nullptr, len, s, halves + 2 * b);
  });
}

bool Fp16Codec::validate(const uint8_t* in, size_t bytes, size_t n) const {
  if (n > (std::numeric_limits<size_t>::max() - kScaleBytes) / 2) return false;
  if (bytes != encoded_size(n)) return false;
  const float scale = load_scale(in);
  // Zero is allowed: an all-zero chunk decodes the same under any scale.
  if (!std::isfinite(scale) || std::signbit(scale)) return false;
  const uint16_t max_abs = kernels::half_kernels().u16_max_abs(in + kScaleBytes, n);
  if (max_abs >= kernels::kF16ExpMask) return false;
  // Rounding is monotonic, so if the largest value decodes finite, all do.
  return std::isfinite(kernels::fp16_to_fp32(max_abs) * scale);
}

void Fp16Codec::decode(const uint8_t* in, size_t n, float* out) const {
  kernels::half_kernels().fp16_decode(in + kScaleBytes, n, load_scale(in), out);
}

void Fp16Codec::decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const {
  kernels::half_kernels().fp16_decode_accumulate(in + kScaleBytes, n, load_scale(in), weight,
                                                 acc);
}

}  // namespace fedwan
