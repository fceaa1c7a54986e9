// Launchers for the codec kernels (codec_kernels.cu). Each thread holds
// eight elements in registers; a codec block is one CUDA block (fp16's and
// the check blocks of fp32 and bf16, 2048 elements) or one warp (int8's 256).
//   * Without a residual, one kernel reads the chunk once: the values, the
//     block's largest |value| and the index of the first non-finite value
//     (atomicMin), then the payload (scales, then the values) from
//     registers. A chunk with a non-finite value gets a payload that the
//     caller throws away on seeing first_bad.
//   * With a residual, two kernels on the caller's stream: block maxima and
//     the first non-finite index, then (only when every value was finite)
//     the payload and the new residual, so a failed encoding leaves the
//     residual untouched, as the CPU codecs do.
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

// Times the kernels read the input (and the subtrahend): 1 without a
// residual, 2 with one.
inline int input_reads(bool residual) { return residual ? 2 : 1; }

// Queues the kernels on `stream`. Returns CUDA's launch status,
// cudaErrorInvalidValue for a codec without kernels.
cudaError_t launch_encode(CodecId codec, const EncodeArgs& args, cudaStream_t stream);

}  // namespace fedwan::cuda::kernels
