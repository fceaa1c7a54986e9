// Identity codec: the payload is the n values as little-endian fp32. It is
// lossless, so with error feedback it folds the residual in and clears it.
#pragma once

#include "fedwan/codec.hpp"

namespace fedwan {

class Fp32Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kFp32; }
  std::string_view name() const override { return "fp32"; }
  size_t encoded_size(size_t n) const override { return 4 * n; }
  void encode(const float* in, size_t n, float* residual, uint8_t* out) const override;
  bool validate(const uint8_t* in, size_t bytes, size_t n) const override;
  void decode(const uint8_t* in, size_t n, float* out) const override;
  void decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const override;
};

}  // namespace fedwan
