#include "codec/compact_feedback.hpp"

#include <algorithm>

#include "codec/block_scaled.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/half.hpp"

namespace fedwan::codec {

namespace {

// The fp16 codec a block at a time: each block's residual is decoded into a
// buffer that stays in L1, used and written back while it is there, rather
// than the whole chunk's residual decoded into `scratch` first and encoded
// back after. The same kernels in the same order per element as
// Codec::encode between the two, so the same bits. False, with nothing
// written but the payload, when a value is not finite: the whole-chunk path
// then names it and throws.
bool encode_fp16_blockwise(const float* in, size_t n, uint16_t* residual, uint8_t* out) {
  constexpr size_t kBlock = Fp16Codec::kBlock;
  const kernels::HalfKernels& k = kernels::half_kernels();
  auto* bits = reinterpret_cast<uint8_t*>(residual);
  uint8_t* const halves = out + Fp16Codec::kScaleBytes * Fp16Codec::blocks(n);
  alignas(64) float r[kBlock];
  uint32_t chunk_max = 0;
  // Every block's largest |in + residual| first, parked in its scale slot:
  // nothing of the residual is written before all are known finite.
  kernels::for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    k.bf16_decode(bits + 2 * begin, len, r);
    const uint32_t max_bits = k.max_abs_bits(in + begin, r, len);
    kernels::store_u32(out + Fp16Codec::kScaleBytes * b, max_bits);
    chunk_max = std::max(chunk_max, max_bits);
  });
  if (chunk_max >= kernels::kF32ExpMask) return false;
  kernels::for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    const kernels::Fp16Scale s =
        kernels::fp16_scale_for(kernels::load_u32(out + Fp16Codec::kScaleBytes * b));
    kernels::store_scale(out + Fp16Codec::kScaleBytes * b, s.scale);
    k.bf16_decode(bits + 2 * begin, len, r);
    k.fp16_encode(in + begin, r, len, s, halves + 2 * begin);
    k.bf16_encode(r, nullptr, len, bits + 2 * begin);
  });
  return true;
}

}  // namespace

void encode_with_bf16_residual(const Codec& codec, const float* values, size_t n,
                               uint16_t* residual, std::vector<float>& scratch, uint8_t* out) {
  if (codec.id() == CodecId::kFp16 && encode_fp16_blockwise(values, n, residual, out)) return;
  if (scratch.size() < n) scratch.resize(n);
  const kernels::HalfKernels& k = kernels::half_kernels();
  auto* bits = reinterpret_cast<uint8_t*>(residual);
  k.bf16_decode(bits, n, scratch.data());
  codec.encode(values, n, scratch.data(), out);
  k.bf16_encode(scratch.data(), nullptr, n, bits);
}

}  // namespace fedwan::codec
