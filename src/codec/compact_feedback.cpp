#include "codec/compact_feedback.hpp"

#include <algorithm>
#include <cstring>

#include "codec/block_scaled.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/half.hpp"

namespace fedwan::codec {

namespace {

// The fp16 codec in one pass, a block at a time: each block's values (a -
// b, or a where b is null) plus its residual are made in a buffer in L1,
// measured, encoded and the residual written back while they are there.
// Every block's residual bits are saved into `saved` before they are
// overwritten, so a non-finite value in a later block puts the residual
// back as it was: false, with only the payload written (the whole-chunk
// path then names the value and throws). Saving 2 bytes a value costs less
// than a read-only pass over the values and the residual that would find
// every maximum first. The same operations per element as Codec::encode
// with the residual decoded, so the same bits.
bool encode_fp16_one_pass(const float* a, const float* b, size_t n, uint16_t* residual,
                          uint8_t* saved, uint8_t* out) {
  constexpr size_t kBlock = Fp16Codec::kBlock;
  const kernels::HalfKernels& k = kernels::half_kernels();
  auto* bits = reinterpret_cast<uint8_t*>(residual);
  uint8_t* const halves = out + Fp16Codec::kScaleBytes * Fp16Codec::blocks(n);
  alignas(64) float v[kBlock];
  for (size_t blk = 0, begin = 0; begin < n; ++blk, begin += kBlock) {
    const size_t len = std::min(kBlock, n - begin);
    const uint32_t max_bits =
        k.add_bf16_residual(a + begin, b ? b + begin : nullptr, bits + 2 * begin, len, v);
    if (max_bits >= kernels::kF32ExpMask) {
      std::memcpy(bits, saved, 2 * begin);
      return false;
    }
    std::memcpy(saved + 2 * begin, bits + 2 * begin, 2 * len);
    const kernels::Fp16Scale s = kernels::fp16_scale_for(max_bits);
    kernels::store_scale(out + Fp16Codec::kScaleBytes * blk, s.scale);
    k.fp16_encode_bf16_residual(v, len, s, halves + 2 * begin, bits + 2 * begin);
  }
  return true;
}

// `scratch` as room for n residual values' bits.
uint8_t* saved_bits(std::vector<float>& scratch, size_t n) {
  const size_t floats = (n * sizeof(uint16_t) + sizeof(float) - 1) / sizeof(float);
  if (scratch.size() < floats) scratch.resize(floats);
  return reinterpret_cast<uint8_t*>(scratch.data());
}

}  // namespace

void encode_with_bf16_residual(const Codec& codec, const float* values, size_t n,
                               uint16_t* residual, std::vector<float>& scratch, uint8_t* out) {
  if (codec.id() == CodecId::kFp16 &&
      encode_fp16_one_pass(values, nullptr, n, residual, saved_bits(scratch, n), out)) {
    return;
  }
  if (scratch.size() < n) scratch.resize(n);
  const kernels::HalfKernels& k = kernels::half_kernels();
  auto* bits = reinterpret_cast<uint8_t*>(residual);
  k.bf16_decode(bits, n, scratch.data());
  codec.encode(values, n, scratch.data(), out);
  k.bf16_encode(scratch.data(), nullptr, n, bits);
}

void encode_difference_with_bf16_residual(const Codec& codec, const float* minuend,
                                          const float* subtrahend, size_t n, uint16_t* residual,
                                          std::vector<float>& scratch, std::vector<float>& diff,
                                          uint8_t* out) {
  if (codec.id() == CodecId::kFp16 &&
      encode_fp16_one_pass(minuend, subtrahend, n, residual, saved_bits(scratch, n), out)) {
    return;
  }
  if (diff.size() < n) diff.resize(n);
  for (size_t i = 0; i < n; ++i) diff[i] = minuend[i] - subtrahend[i];
  encode_with_bf16_residual(codec, diff.data(), n, residual, scratch, out);
}

}  // namespace fedwan::codec
