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

namespace fedwan::cuda::kernels {

enum class CodecKind { kFp32, kFp16, kBf16, kInt8 };

// Elements per block of the kernels for each codec: the codec's own scale
// block for fp16 and int8, and a block for the non-finite check otherwise.
size_t block_elements(CodecKind kind);
inline size_t block_count(CodecKind kind, size_t n) {
  const size_t b = block_elements(kind);
  return n / b + (n % b != 0);
}

struct EncodeArgs {
  const float* in = nullptr;         // n device floats
  const float* minus = nullptr;      // n device floats, or null: encode in - minus
  float* residual = nullptr;         // n device floats, or null
  size_t n = 0;
  uint8_t* out = nullptr;            // device, the codec's encoded_size(n); 256-byte aligned
  uint32_t* block_max = nullptr;     // device, block_count(kind, n) words of scratch
  unsigned long long* first_bad = nullptr;  // device; the caller sets it to ~0 first
};

// Queues both kernels on `stream`. Returns CUDA's launch status.
cudaError_t launch_encode(CodecKind kind, const EncodeArgs& args, cudaStream_t stream);

}  // namespace fedwan::cuda::kernels
