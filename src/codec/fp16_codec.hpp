// IEEE half precision with one power-of-two scale per chunk. Payload: fp32
// scale (LE), then n halves (LE u16); value = half * scale. The scale puts the
// chunk's largest magnitude near the top of the half range, so a chunk of tiny
// deltas keeps 11 significant bits instead of flushing to zero.
#pragma once

#include "fedwan/codec.hpp"

namespace fedwan {

class Fp16Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kFp16; }
  std::string_view name() const override { return "fp16"; }
  size_t encoded_size(size_t n) const override { return kScaleBytes + 2 * n; }
  void encode(const float* in, size_t n, float* residual, uint8_t* out) const override;
  // Also rejects a negative scale, and a payload whose largest value times
  // the scale overflows fp32.
  bool validate(const uint8_t* in, size_t bytes, size_t n) const override;
  void decode(const uint8_t* in, size_t n, float* out) const override;
  void decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const override;

  static constexpr size_t kScaleBytes = 4;
};

}  // namespace fedwan
