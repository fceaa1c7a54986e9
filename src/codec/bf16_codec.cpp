#include "codec/bf16_codec.hpp"

#include <algorithm>
#include <limits>

#include "codec/half.hpp"
#include "common/stream_copy.hpp"

namespace fedwan {

void Bf16Codec::encode(const float* in, size_t n, float* residual, uint8_t* out) const {
  const auto& k = kernels::half_kernels();
  // A checking pass first, so the residual is untouched when we throw.
  kernels::require_finite_input("bf16", k.max_abs_bits(in, residual, n), in, residual, n);
  kernels::for_blocks_backward(n, [&](size_t b, size_t len) {
    k.bf16_encode(in + b, residual ? residual + b : nullptr, len, out + 2 * b);
  });
}

bool Bf16Codec::validate(const uint8_t* in, size_t bytes, size_t n) const {
  if (n > std::numeric_limits<size_t>::max() / 2 || bytes != encoded_size(n)) return false;
  return kernels::half_kernels().u16_max_abs(in, n) < kernels::kBf16ExpMask;
}

void Bf16Codec::decode(const uint8_t* in, size_t n, float* out) const {
  kernels::half_kernels().bf16_decode(in, n, out);
}

void Bf16Codec::decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const {
  kernels::half_kernels().bf16_decode_accumulate(in, n, weight, acc);
}

void Bf16Codec::decode_add(const uint8_t* in, size_t n, const float* base, float* out) const {
  kernels::half_kernels().bf16_decode_add(in, n, base, out);
}

void Bf16Codec::decode_add_copy(const uint8_t* in, size_t n, float* acc, float* copy) const {
  // In blocks that stay in L1 while they are copied.
  constexpr size_t kBlock = 2048;
  const auto& k = kernels::half_kernels();
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t len = std::min(kBlock, n - begin);
    k.bf16_decode_add(in + 2 * begin, len, acc + begin, acc + begin);
    stream_copy(copy + begin, acc + begin, len);
  }
}

}  // namespace fedwan
