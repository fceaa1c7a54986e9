#include "codec/compact_feedback.hpp"

#include "codec/half.hpp"

namespace fedwan::codec {

void encode_with_bf16_residual(const Codec& codec, const float* values, size_t n,
                               uint16_t* residual, std::vector<float>& scratch, uint8_t* out) {
  if (scratch.size() < n) scratch.resize(n);
  const kernels::HalfKernels& k = kernels::half_kernels();
  auto* bits = reinterpret_cast<uint8_t*>(residual);
  k.bf16_decode(bits, n, scratch.data());
  codec.encode(values, n, scratch.data(), out);
  k.bf16_encode(scratch.data(), nullptr, n, bits);
}

}  // namespace fedwan::codec
