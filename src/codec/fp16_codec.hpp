// IEEE half precision with one power-of-two scale per block of kBlock
// elements. Payload: blocks(n) fp32 scales (LE), then n halves (LE u16);
// element i decodes to half[i] * scale[i / kBlock], and only the last block
// may be short. Each scale puts its block's largest magnitude near the top of
// the half range, so a block of tiny deltas keeps 11 significant bits instead
// of flushing to zero, whatever the magnitude of the other blocks.
#pragma once

#include "fedwan/codec.hpp"

namespace fedwan {

class Fp16Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kFp16; }
  std::string_view name() const override { return "fp16"; }
  size_t encoded_size(size_t n) const override { return kScaleBytes * blocks(n) + 2 * n; }
  void encode(const float* in, size_t n, float* residual, uint8_t* out) const override;
  // Also rejects a negative scale, and a block whose largest value times its
  // scale overflows fp32.
  bool validate(const uint8_t* in, size_t bytes, size_t n) const override;
  void decode(const uint8_t* in, size_t n, float* out) const override;
  void decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const override;
  void decode_add(const uint8_t* in, size_t n, const float* base, float* out) const override;
  void decode_add_copy(const uint8_t* in, size_t n, float* acc, float* copy) const override;

  // 2048 elements: the scales cost 0.1% on top of the halves.
  static constexpr size_t kBlock = 2048;
  static constexpr size_t kScaleBytes = 4;
  static constexpr size_t blocks(size_t n) { return n / kBlock + (n % kBlock != 0); }
};

}  // namespace fedwan
