#include "codec_kernels.hpp"

#include "codec/codec_math.hpp"
#include "codec/fp16_codec.hpp"

namespace fedwan::cuda::kernels {
namespace {

namespace cm = ::fedwan::codec_math;

constexpr unsigned kThreads = 256;  // a multiple of the warp size
constexpr unsigned long long kNoBad = ~0ull;
constexpr size_t kCheckBlock = 2048;  // fp32 / bf16: blocks of the non-finite check only

static_assert(Fp16Codec::kBlock % kThreads == 0 && cm::kInt8Block % kThreads == 0 &&
                  kCheckBlock % kThreads == 0,
              "every block is a whole number of thread strides");

template <CodecId K>
constexpr size_t kBlock = K == CodecId::kFp16   ? Fp16Codec::kBlock
                          : K == CodecId::kInt8 ? size_t(cm::kInt8Block)
                                                : kCheckBlock;

__device__ __forceinline__ float value_at(const float* in, const float* minus, const float* res,
                                          size_t i) {
  const float x = minus ? cm::sub_rn(in[i], minus[i]) : in[i];
  return res ? cm::add_rn(x, res[i]) : x;
}

__device__ __forceinline__ uint32_t warp_max_of(uint32_t v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// The block's maximum, valid in thread 0. Every thread of the block must
// call it (it synchronises).
__device__ uint32_t block_max_of(uint32_t v) {
  __shared__ uint32_t warp_max[kThreads / 32];
  v = warp_max_of(v);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_max[lane] : 0u;
    v = warp_max_of(v);
  }
  return v;
}

// One CUDA block per codec block. Threads stride through it, so loads are
// coalesced; each thread meets its elements in increasing order, so the
// first non-finite one it sees is its smallest.
template <CodecId K>
__global__ void __launch_bounds__(kThreads)
    block_max_kernel(const float* in, const float* minus, const float* res, size_t n,
                     uint32_t* block_max, unsigned long long* first_bad) {
  const size_t begin = size_t(blockIdx.x) * kBlock<K>;
  const size_t end = begin + kBlock<K> < n ? begin + kBlock<K> : n;
  uint32_t m = 0;
  unsigned long long bad = kNoBad;
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const uint32_t a = cm::bits_of(value_at(in, minus, res, i)) & cm::kF32AbsMask;
    if (a >= cm::kF32ExpMask && bad == kNoBad) bad = i;
    m = a > m ? a : m;
  }
  if (bad != kNoBad) atomicMin(first_bad, bad);
  m = block_max_of(m);
  if (threadIdx.x == 0) block_max[blockIdx.x] = m;
}

template <CodecId K>
__global__ void __launch_bounds__(kThreads)
    quantise_kernel(const float* in, const float* minus, float* res, size_t n,
                    const uint32_t* block_max, const unsigned long long* first_bad, uint8_t* out) {
  if (*first_bad != kNoBad) return;  // the same for the whole grid: nothing is written
  const size_t b = blockIdx.x;
  const size_t begin = b * kBlock<K>;
  const size_t end = begin + kBlock<K> < n ? begin + kBlock<K> : n;
  const size_t blocks = n / kBlock<K> + (n % kBlock<K> != 0);

  if constexpr (K == CodecId::kFp32) {
    float* values = reinterpret_cast<float*>(out);
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
      values[i] = value_at(in, minus, res, i);
      if (res) res[i] = 0.0f;
    }
  } else if constexpr (K == CodecId::kBf16) {
    uint16_t* values = reinterpret_cast<uint16_t*>(out);
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
      const float v = value_at(in, minus, res, i);
      const uint16_t h = cm::fp32_to_bf16(v);
      values[i] = h;
      if (res) res[i] = cm::sub_rn(v, cm::bf16_to_fp32(h));
    }
  } else if constexpr (K == CodecId::kFp16) {
    const cm::Fp16Scale s = cm::fp16_scale_for(block_max[b]);
    if (threadIdx.x == 0) reinterpret_cast<float*>(out)[b] = s.scale;
    uint16_t* values = reinterpret_cast<uint16_t*>(out + Fp16Codec::kScaleBytes * blocks);
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
      const float v = value_at(in, minus, res, i);
      const uint16_t h = cm::fp16_quantise(v, s);
      values[i] = h;
      if (res) res[i] = cm::sub_rn(v, cm::fp16_dequantise(h, s.scale));
    }
  } else {
    const cm::Int8Scale s = cm::int8_scale_for(block_max[b]);
    if (threadIdx.x == 0) reinterpret_cast<float*>(out)[b] = s.scale;
    int8_t* values = reinterpret_cast<int8_t*>(out + sizeof(float) * blocks);
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
      const float v = value_at(in, minus, res, i);
      const int8_t q = cm::int8_quantise(v, s);
      values[i] = q;
      if (res) res[i] = cm::sub_rn(v, cm::int8_dequantise(q, s.scale));
    }
  }
}

template <CodecId K>
cudaError_t launch(const EncodeArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  const size_t blocks = a.n / kBlock<K> + (a.n % kBlock<K> != 0);
  if (blocks > 0x7FFFFFFFu) return cudaErrorInvalidValue;
  const dim3 grid{static_cast<unsigned>(blocks)};
  block_max_kernel<K>
      <<<grid, kThreads, 0, stream>>>(a.in, a.minus, a.residual, a.n, a.block_max, a.first_bad);
  quantise_kernel<K><<<grid, kThreads, 0, stream>>>(a.in, a.minus, a.residual, a.n, a.block_max,
                                                    a.first_bad, a.out);
  return cudaGetLastError();
}

}  // namespace

bool has_kernels(CodecId codec) {
  switch (codec) {
    case CodecId::kFp32:
    case CodecId::kFp16:
    case CodecId::kBf16:
    case CodecId::kInt8: return true;
  }
  return false;
}

size_t block_elements(CodecId codec) {
  switch (codec) {
    case CodecId::kFp16: return kBlock<CodecId::kFp16>;
    case CodecId::kInt8: return kBlock<CodecId::kInt8>;
    case CodecId::kFp32: return kBlock<CodecId::kFp32>;
    case CodecId::kBf16: return kBlock<CodecId::kBf16>;
  }
  return kCheckBlock;
}

cudaError_t launch_encode(CodecId codec, const EncodeArgs& args, cudaStream_t stream) {
  switch (codec) {
    case CodecId::kFp32: return launch<CodecId::kFp32>(args, stream);
    case CodecId::kFp16: return launch<CodecId::kFp16>(args, stream);
    case CodecId::kBf16: return launch<CodecId::kBf16>(args, stream);
    case CodecId::kInt8: return launch<CodecId::kInt8>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fedwan::cuda::kernels
