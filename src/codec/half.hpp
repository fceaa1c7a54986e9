// fp32 <-> fp16 / bf16 conversion kernels behind the fp16 and bf16 codecs.
//
// The element arithmetic is codec_math.hpp, shared with the CUDA kernels.
// Two implementations with identical results bit for bit: a portable scalar
// one and, on x86-64 CPUs with AVX2 + F16C, a vectorised one picked at run
// time (the library itself is built for generic x86-64). Both are exposed so
// tests can hold them against each other.
//
// Payload pointers are byte pointers with no alignment requirement; 16-bit
// values in them are little-endian. Float arrays are naturally aligned.
// All kernels are pure functions of their arguments and thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "codec/codec_math.hpp"

namespace fedwan::kernels {

// Round to nearest, ties to even. Overflow gives +-Inf, NaN stays NaN.
uint16_t fp32_to_fp16(float f);
float fp16_to_fp32(uint16_t h);
// Round to nearest, ties to even, but finite values saturate at the largest
// finite bf16 instead of rounding up to Inf (FLT_MAX would otherwise). NaN and
// Inf never reach it: encoders reject non-finite input first.
uint16_t fp32_to_bf16(float f);
float bf16_to_fp32(uint16_t h);

inline constexpr uint32_t kF32AbsMask = codec_math::kF32AbsMask;
inline constexpr uint32_t kF32ExpMask = codec_math::kF32ExpMask;  // abs bits >= this: Inf/NaN
inline constexpr uint16_t kF16ExpMask = 0x7C00u;                  // abs bits >= this: Inf/NaN
inline constexpr uint16_t kBf16ExpMask = 0x7F80u;

// Per-block power-of-two scale of the fp16 codec (codec_math.hpp).
using Fp16Scale = codec_math::Fp16Scale;
// `max_abs_bits` is the bit pattern of the block's largest |value| (finite).
Fp16Scale fp16_scale_for(uint32_t max_abs_bits);

// Throws fedwan::Error naming the codec and the first non-finite element of
// in + residual when `max_abs_bits` (from HalfKernels::max_abs_bits) says
// there is one. Encoders call it before touching the residual.
void require_finite_input(const char* codec, uint32_t max_abs_bits, const float* in,
                          const float* residual, size_t n);

// Runs f(begin, count) over [0, n) in blocks, last block first. Encoders
// make their second pass this way: a chunk with its residual is larger than
// L2, so a forward second pass would find every line evicted by the first,
// while a backward one starts on what the first left in cache. Blocks start
// at multiples of kPassBlock so only the last one has a ragged tail.
inline constexpr size_t kPassBlock = 16384;  // elements
template <class F>
void for_blocks_backward(size_t n, F&& f) {
  for (size_t end = n; end > 0;) {
    const size_t begin = (end - 1) / kPassBlock * kPassBlock;
    f(begin, end - begin);
    end = begin;
  }
}

struct HalfKernels {
  const char* name;  // "scalar" or "avx2"

  // Largest bit pattern of |in[i] + residual[i]| (residual may be null).
  // Non-finite values compare above every finite one, so a result
  // >= kF32ExpMask means the input holds an Inf or NaN.
  uint32_t (*max_abs_bits)(const float* in, const float* residual, size_t n);

  // Writes n LE halves of round(clamp((in + residual) / scale, +-limit));
  // with a residual, leaves in it what the rounding lost. A single pass;
  // an infinite limit skips the clamp, which would be a no-op.
  void (*fp16_encode)(const float* in, float* residual, size_t n, const Fp16Scale& s, uint8_t* out);
  void (*fp16_decode)(const uint8_t* in, size_t n, float scale, float* out);
  // acc[i] = acc[i] + weight * (half[i] * scale): two roundings, no FMA.
  void (*fp16_decode_accumulate)(const uint8_t* in, size_t n, float scale, float weight,
                                 float* acc);
  // out[i] = base[i] + half[i] * scale: fp16_decode_accumulate with weight 1
  // into a copy of base, bit for bit, in one pass (base may be out).
  void (*fp16_decode_add)(const uint8_t* in, size_t n, float scale, const float* base, float* out);

  void (*bf16_encode)(const float* in, float* residual, size_t n, uint8_t* out);
  void (*bf16_decode)(const uint8_t* in, size_t n, float* out);
  void (*bf16_decode_accumulate)(const uint8_t* in, size_t n, float weight, float* acc);
  // out[i] = base[i] + bf16[i], as fp16_decode_add.
  void (*bf16_decode_add)(const uint8_t* in, size_t n, const float* base, float* out);

  // Largest (value & 0x7FFF) over n LE u16: the magnitude bits of fp16 and
  // bf16 alike, so receivers can check for Inf/NaN and overflow in one pass.
  uint16_t (*u16_max_abs)(const uint8_t* in, size_t n);

  // Error feedback with the residual in bf16 (codec/compact_feedback.hpp),
  // in two steps over a block in L1. First out[i] = (a[i] - b[i]) +
  // bf16[i] (a[i] + bf16[i] where b is null), returning the largest bit
  // pattern of |out[i]| as max_abs_bits does; then out's values quantised
  // as fp16_encode quantises them, each one's loss (v - half * scale)
  // written back to `bits` as bf16 as bf16_encode rounds it. The same bits
  // as bf16_decode, fp16_encode with that residual and bf16_encode.
  uint32_t (*add_bf16_residual)(const float* a, const float* b, const uint8_t* bits, size_t n,
                                float* out);
  void (*fp16_encode_bf16_residual)(const float* v, size_t n, const Fp16Scale& s, uint8_t* out,
                                    uint8_t* bits);

  // The root's anchor encoding (aggregator/root_model.cpp), over a block in
  // cache. First the largest bit pattern of |a[i] - b[i]|, as max_abs_bits
  // finds it. Then theta[i] - held[i] quantised as fp16_encode quantises it
  // (out); next = held[i] + half * scale, what a child's decode adds to its
  // anchor; theta[i] - next as bf16_encode rounds it (bits); and, with
  // `advance`, held[i] = next. The same bits as the subtraction,
  // fp16_encode, fp16_decode, the settling and bf16_encode in turn.
  uint32_t (*sub_max_abs_bits)(const float* a, const float* b, size_t n);
  void (*fp16_encode_settle)(const float* theta, float* held, size_t n, const Fp16Scale& s,
                             bool advance, uint8_t* out, uint8_t* bits);
};

const HalfKernels& scalar_half_kernels();
// nullptr when the build or the CPU has no AVX2 + F16C.
const HalfKernels* avx2_half_kernels();
// The fastest available set, chosen once.
const HalfKernels& half_kernels();

}  // namespace fedwan::kernels
