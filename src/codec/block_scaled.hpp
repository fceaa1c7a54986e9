// What the block-scaled codecs (fp16, int8) share: the payload's 4-byte
// little-endian scale slots, the walk over a chunk's blocks, and the encode
// that checks every value before it writes any residual.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "codec/codec_math.hpp"
#include "codec/half.hpp"

namespace fedwan::kernels {

inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline void store_u32(uint8_t* p, uint32_t u) {
  for (int b = 0; b < 4; ++b) p[b] = uint8_t(u >> (8 * b));
}
inline float load_scale(const uint8_t* p) { return codec_math::float_of(load_u32(p)); }
inline void store_scale(uint8_t* p, float f) { store_u32(p, codec_math::bits_of(f)); }

// Calls f(block, begin, count) for every kBlock-element block of [0, n).
template <size_t kBlock, class F>
void for_each_block(size_t n, F&& f) {
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += kBlock) {
    f(b, begin, std::min(kBlock, n - begin));
  }
}

// Encodes n values in blocks of kBlock: quantise(block, begin, count,
// max_abs_bits) writes a block's scale slot (4 bytes at scales + 4 * block)
// and its values, given the largest |in + residual| of the block. Throws,
// naming `codec`, on a non-finite value before any residual is written.
template <size_t kBlock, class Quantise>
void encode_in_blocks(const char* codec, const float* in, size_t n, float* residual,
                      uint8_t* scales, Quantise&& quantise) {
  static_assert(kPassBlock % kBlock == 0, "backward passes must cut at block boundaries");
  const HalfKernels& k = half_kernels();
  if (!residual) {
    // Nothing to leave untouched on failure: one pass, each block quantised
    // right after its maximum is found, while it is still in L1.
    for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
      const uint32_t max_bits = k.max_abs_bits(in + begin, nullptr, len);
      require_finite_input(codec, max_bits, in, nullptr, n);
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
  for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    const uint32_t max_bits = k.max_abs_bits(in + begin, residual + begin, len);
    store_u32(scales + 4 * b, max_bits);
    chunk_max = std::max(chunk_max, max_bits);
  });
  require_finite_input(codec, chunk_max, in, residual, n);
  for_blocks_backward(n, [&](size_t pass_begin, size_t pass_len) {
    for (size_t begin = pass_begin; begin < pass_begin + pass_len; begin += kBlock) {
      const size_t len = std::min(kBlock, pass_begin + pass_len - begin);
      quantise(begin / kBlock, begin, len, load_u32(scales + 4 * (begin / kBlock)));
    }
  });
}

}  // namespace fedwan::kernels
