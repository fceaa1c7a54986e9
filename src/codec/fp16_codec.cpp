#include "codec/fp16_codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "codec/half.hpp"

namespace fedwan {
namespace {

static_assert(kernels::kPassBlock % Fp16Codec::kBlock == 0,
              "backward passes must cut the chunk at block boundaries");

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void store_u32(uint8_t* p, uint32_t u) {
  for (int b = 0; b < 4; ++b) p[b] = uint8_t(u >> (8 * b));
}

float load_scale(const uint8_t* p) {
  const uint32_t u = load_u32(p);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

void store_scale(uint8_t* p, float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  store_u32(p, u);
}

// Calls f(block, begin, count) for every block of an n-element chunk.
template <class F>
void for_each_block(size_t n, F&& f) {
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += Fp16Codec::kBlock) {
    f(b, begin, std::min(Fp16Codec::kBlock, n - begin));
  }
}

}  // namespace

void Fp16Codec::encode(const float* in, size_t n, float* residual, uint8_t* out) const {
  const auto& k = kernels::half_kernels();
  uint8_t* const halves = out + kScaleBytes * blocks(n);
  const auto quantise = [&](size_t b, size_t begin, size_t len, uint32_t max_bits) {
    const kernels::Fp16Scale s = kernels::fp16_scale_for(max_bits);
    store_scale(out + kScaleBytes * b, s.scale);
    k.fp16_encode(in + begin, residual ? residual + begin : nullptr, len, s,
                  halves + 2 * begin);
  };

  if (!residual) {
    // Nothing to leave untouched on failure: one pass, each block quantised
    // right after its maximum is found, while it is still in L1.
    for_each_block(n, [&](size_t b, size_t begin, size_t len) {
      const uint32_t max_bits = k.max_abs_bits(in + begin, nullptr, len);
      kernels::require_finite_input("fp16", max_bits, in, nullptr, n);
      quantise(b, begin, len, max_bits);
    });
    return;
  }

  // The residual must be untouched when we throw, and a non-finite value may
  // sit in the last block, so every block's maximum is found before any
  // residual is written: a read-only pass that parks the maxima in the scale
  // slots, then the quantising pass. (Saving the residual instead, to restore
  // it on failure, writes as many bytes as this pass reads and measured
  // slower.) The second pass goes backward, starting on what the first left
  // in cache.
  uint32_t chunk_max = 0;
  for_each_block(n, [&](size_t b, size_t begin, size_t len) {
    const uint32_t max_bits = k.max_abs_bits(in + begin, residual + begin, len);
    store_u32(out + kScaleBytes * b, max_bits);
    chunk_max = std::max(chunk_max, max_bits);
  });
  kernels::require_finite_input("fp16", chunk_max, in, residual, n);
  kernels::for_blocks_backward(n, [&](size_t pass_begin, size_t pass_len) {
    for (size_t begin = pass_begin; begin < pass_begin + pass_len; begin += kBlock) {
      const size_t b = begin / kBlock;
      const size_t len = std::min(kBlock, pass_begin + pass_len - begin);
      quantise(b, begin, len, load_u32(out + kScaleBytes * b));
    }
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
  for_each_block(n, [&](size_t b, size_t begin, size_t len) {
    k.fp16_decode(halves + 2 * begin, len, load_scale(in + kScaleBytes * b), out + begin);
  });
}

void Fp16Codec::decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const {
  const auto& k = kernels::half_kernels();
  const uint8_t* const halves = in + kScaleBytes * blocks(n);
  for_each_block(n, [&](size_t b, size_t begin, size_t len) {
    k.fp16_decode_accumulate(halves + 2 * begin, len, load_scale(in + kScaleBytes * b), weight,
                             acc + begin);
  });
}

}  // namespace fedwan
