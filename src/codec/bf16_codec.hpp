// bfloat16: the upper 16 bits of each fp32, rounded to nearest even. Same
// range as fp32, 8 significant bits, no scale. Payload: n LE u16.
#pragma once

#include "fedwan/codec.hpp"

namespace fedwan {

class Bf16Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kBf16; }
  std::string_view name() const override { return "bf16"; }
  size_t encoded_size(size_t n) const override { return 2 * n; }
  void encode(const float* in, size_t n, float* residual, uint8_t* out) const override;
  bool validate(const uint8_t* in, size_t bytes, size_t n) const override;
  void decode(const uint8_t* in, size_t n, float* out) const override;
  void decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const override;
  void decode_add(const uint8_t* in, size_t n, const float* base, float* out) const override;
  void decode_add_copy(const uint8_t* in, size_t n, float* acc, float* copy) const override;
};

}  // namespace fedwan
