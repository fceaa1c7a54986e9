// Symmetric int8 with one fp32 scale per block of kBlock elements, and
// error feedback. Payload: blocks(n) fp32 scales (LE), then n int8 values
// (two's complement, -128 never used); element i decodes to
// q[i] * scale[i / kBlock], and only the last block may be short. A block's
// scale is its largest magnitude / 127, so the error of an element is at most
// half its own block's step, whatever the other blocks hold. A quarter of the
// fp32 bytes (plus 1.6% of scales); the arithmetic is codec_math.hpp's, shared
// with the CUDA kernels, so a GPU site's payload is this one bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/codec_math.hpp"
#include "fedwan/codec.hpp"

namespace fedwan {

class Int8Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kInt8; }
  std::string_view name() const override { return "int8"; }
  size_t encoded_size(size_t n) const override { return kScaleBytes * blocks(n) + n; }
  void encode(const float* in, size_t n, float* residual, uint8_t* out) const override;
  // Also rejects a negative scale, a -128 byte, and a scale whose 127 times
  // overflows fp32.
  bool validate(const uint8_t* in, size_t bytes, size_t n) const override;
  void decode(const uint8_t* in, size_t n, float* out) const override;
  void decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const override;

  static constexpr size_t kBlock = codec_math::kInt8Block;
  static constexpr size_t kScaleBytes = 4;
  static constexpr size_t blocks(size_t n) { return n / kBlock + (n % kBlock != 0); }
};

namespace kernels {

using Int8Scale = codec_math::Int8Scale;

// The per-element loops of the int8 codec, over one block (or any run of
// elements sharing a scale). Two sets with identical results bit for bit: a
// portable scalar one and, on x86-64 CPUs with AVX2, a vectorised one picked
// at run time; both are exposed so tests can hold them against each other.
// Payload pointers need no alignment. Pure functions, thread safe.
struct Int8Kernels {
  const char* name;  // "scalar" or "avx2"

  // out[i] = int8_quantise(in[i] + residual[i], s); with a residual, leaves
  // in it what the rounding lost (residual may be null). Input must be
  // finite: callers check first.
  void (*encode)(const float* in, float* residual, size_t n, const Int8Scale& s, uint8_t* out);
  void (*decode)(const uint8_t* in, size_t n, float scale, float* out);
  // acc[i] = acc[i] + weight * (q[i] * scale): every product rounded, no FMA.
  void (*decode_accumulate)(const uint8_t* in, size_t n, float scale, float weight, float* acc);
  // True when any of the n bytes is 0x80 (-128, which no encoder writes).
  bool (*has_minus_128)(const uint8_t* in, size_t n);
};

const Int8Kernels& scalar_int8_kernels();
// nullptr when the build or the CPU has no AVX2.
const Int8Kernels* avx2_int8_kernels();
// The fastest available set, chosen once.
const Int8Kernels& int8_kernels();

}  // namespace kernels
}  // namespace fedwan
