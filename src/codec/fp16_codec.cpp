#include "codec/fp16_codec.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "codec/block_scaled.hpp"
#include "codec/half.hpp"
#include "common/stream_copy.hpp"

namespace fedwan {

using kernels::for_each_block;
using kernels::load_scale;

void Fp16Codec::encode(const float* in, size_t n, float* residual, uint8_t* out) const {
  const auto& k = kernels::half_kernels();
  uint8_t* const halves = out + kScaleBytes * blocks(n);
  kernels::encode_in_blocks<kBlock>(
      "fp16", in, n, residual, out, [&](size_t b, size_t begin, size_t len, uint32_t max_bits) {
        const kernels::Fp16Scale s = kernels::fp16_scale_for(max_bits);
        kernels::store_scale(out + kScaleBytes * b, s.scale);
        k.fp16_encode(in + begin, residual ? residual + begin : nullptr, len, s,
                      halves + 2 * begin);
      });
}

bool Fp16Codec::validate(const uint8_t* in, size_t bytes, size_t n) const {
  if (n > std::numeric_limits<size_t>::max() / 4) return false;  // encoded_size overflows
  if (bytes != encoded_size(n)) return false;
  const auto& k = kernels::half_kernels();
  const uint8_t* const halves = in + kScaleBytes * blocks(n);
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += kBlock) {
    const float scale = load_scale(in + kScaleBytes * b);
    // Zero is allowed: an all-zero block decodes the same under any scale.
    if (!std::isfinite(scale) || std::signbit(scale)) return false;
    const uint16_t max_abs = k.u16_max_abs(halves + 2 * begin, std::min(kBlock, n - begin));
    if (max_abs >= kernels::kF16ExpMask) return false;
    // Rounding is monotonic, so if the largest value decodes finite, all do.
    if (!std::isfinite(kernels::fp16_to_fp32(max_abs) * scale)) return false;
  }
  return true;
}

void Fp16Codec::decode(const uint8_t* in, size_t n, float* out) const {
  const auto& k = kernels::half_kernels();
  const uint8_t* const halves = in + kScaleBytes * blocks(n);
  for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    k.fp16_decode(halves + 2 * begin, len, load_scale(in + kScaleBytes * b), out + begin);
  });
}

void Fp16Codec::decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const {
  const auto& k = kernels::half_kernels();
  const uint8_t* const halves = in + kScaleBytes * blocks(n);
  for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    k.fp16_decode_accumulate(halves + 2 * begin, len, load_scale(in + kScaleBytes * b), weight,
                             acc + begin);
  });
}

void Fp16Codec::decode_add(const uint8_t* in, size_t n, const float* base, float* out) const {
  const auto& k = kernels::half_kernels();
  const uint8_t* const halves = in + kScaleBytes * blocks(n);
  for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    k.fp16_decode_add(halves + 2 * begin, len, load_scale(in + kScaleBytes * b), base + begin,
                      out + begin);
  });
}

void Fp16Codec::decode_add_copy(const uint8_t* in, size_t n, float* acc, float* copy) const {
  const auto& k = kernels::half_kernels();
  const uint8_t* const halves = in + kScaleBytes * blocks(n);
  for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    k.fp16_decode_add(halves + 2 * begin, len, load_scale(in + kScaleBytes * b), acc + begin,
                      acc + begin);
    stream_copy(copy + begin, acc + begin, len);  // the block still in L1
  });
}

}  // namespace fedwan
