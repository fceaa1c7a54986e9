// Launchers for the codec kernels (codec_kernels.cu). Each encoding is two
// kernels on the caller's stream:
//   1. block maxima: the largest |in + residual| of every codec block, and
//      the index of the first non-finite value, if any (atomicMin);
//   2. quantise: when no value was non-finite, the payload (scales, then the
//      values) and the new residual; otherwise nothing at all, so a failed
//      encoding leaves the residual untouched, as the CPU codecs do.
// With `minus`, the value encoded is (in - minus), rounded once before the
// residual is added, exactly as the host computes a delta and then encodes it.
// Payload bytes equal the CPU codec's bit for bit: both sides use
// src/codec/codec_math.hpp, and this file is compiled with --fmad=false.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "fedwan/codec.hpp"

namespace fedwan::cuda::kernels {

// Whether these kernels encode `codec` (fp32, fp16, bf16 and int8 so far).
bool has_kernels(CodecId codec);

// Elements per block of the kernels for each codec: the codec's own scale
// block for fp16 and int8, and a block for the non-finite check otherwise.
// Precondition: has_kernels(codec).
size_t block_elements(CodecId codec);
inline size_t block_count(CodecId codec, size_t n) {
  const size_t b = block_elements(codec);
  return n / b + (n % b != 0);
}

struct EncodeArgs {
  const float* in = nullptr;     // n device floats
  const float* minus = nullptr;  // n device floats, or null: encode in - minus
  float* residual = nullptr;     // n device floats, or null
  size_t n = 0;
  uint8_t* out = nullptr;                   // device, the codec's encoded_size(n); 256-byte aligned
  uint32_t* block_max = nullptr;            // device, block_count(codec, n) words of scratch
  unsigned long long* first_bad = nullptr;  // device; the caller sets it to ~0 first
};

// Queues both kernels on `stream`. Returns CUDA's launch status,
// cudaErrorInvalidValue for a codec without kernels.
cudaError_t launch_encode(CodecId codec, const EncodeArgs& args, cudaStream_t stream);

}  // namespace fedwan::cuda::kernels
