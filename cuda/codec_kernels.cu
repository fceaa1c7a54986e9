#include "codec_kernels.hpp"

#include "codec/codec_math.hpp"
#include "codec/fp16_codec.hpp"

namespace fedwan::cuda::kernels {
namespace {

namespace cm = ::fedwan::codec_math;

constexpr unsigned kThreads = 256;  // threads of a CUDA block
constexpr unsigned kPerThread = 8;  // elements each thread holds in registers
constexpr unsigned long long kNoBad = ~0ull;
constexpr size_t kCheckBlock = 2048;  // fp32 / bf16: blocks of the non-finite check only

template <CodecId K>
constexpr size_t kBlock = K == CodecId::kFp16   ? Fp16Codec::kBlock
                          : K == CodecId::kInt8 ? size_t(cm::kInt8Block)
                                                : kCheckBlock;

// Threads that work on one codec block: 256 for blocks of 2048 elements (a
// CUDA block each), 32 for int8's blocks of 256 (a warp each, eight codec
// blocks to a CUDA block), so a block's maximum is always taken over eight
// elements a thread and never by a mostly idle reduction.
template <CodecId K>
constexpr unsigned kGroup = unsigned(kBlock<K> / kPerThread);
template <CodecId K>
constexpr unsigned kGroupsPerCta = kThreads / kGroup<K>;

static_assert(kBlock<CodecId::kFp16> == size_t(kThreads) * kPerThread &&
                  kBlock<CodecId::kFp32> == size_t(kThreads) * kPerThread &&
                  kBlock<CodecId::kInt8> == size_t(32) * kPerThread,
              "a codec block is one CUDA block or one warp, eight elements a thread");

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

// The maximum over the threads of one codec block, in every one of them.
// Every thread of the group must call it (a CUDA block's group synchronises).
template <CodecId K>
__device__ __forceinline__ uint32_t group_max_of(uint32_t v) {
  v = warp_max_of(v);
  if constexpr (kGroup < K >> 32) {
    __shared__ uint32_t warp_max[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
    __syncthreads();
    for (unsigned w = 0; w < kThreads / 32; ++w) v = warp_max[w] > v ? warp_max[w] : v;
  }
  return v;
}

// The elements of one thread: codec block `b`, i = b * kBlock + lane +
// k * kGroup for k < kPerThread. Neighbouring lanes read neighbouring
// floats (coalesced), and each thread meets its elements in increasing
// order, so the first non-finite one it sees is its smallest.
template <CodecId K>
struct Slice {
  size_t block;
  size_t first;  // index of the thread's first element

  __device__ Slice()
      : block(size_t(blockIdx.x) * kGroupsPerCta<K> + threadIdx.x / kGroup<K>),
        first(block * kBlock<K> + threadIdx.x % kGroup<K>) {}
  __device__ size_t at(unsigned k) const { return first + size_t(k) * kGroup<K>; }
  __device__ bool lead() const { return threadIdx.x % kGroup<K> == 0; }
};

// Loads the thread's values (0 past the end), returns the largest |value|'s
// bits and records the first non-finite index in `bad`.
template <CodecId K>
__device__ __forceinline__ uint32_t load(const Slice<K>& s, const float* in, const float* minus,
                                         const float* res, size_t n, float (&v)[kPerThread],
                                         unsigned long long& bad) {
  uint32_t m = 0;
#pragma unroll
  for (unsigned k = 0; k < kPerThread; ++k) {
    const size_t i = s.at(k);
    v[k] = i < n ? value_at(in, minus, res, i) : 0.0f;
    const uint32_t a = cm::bits_of(v[k]) & cm::kF32AbsMask;
    if (a >= cm::kF32ExpMask && bad == kNoBad) bad = i;
    m = a > m ? a : m;
  }
  return m;
}

// Calls put(i, k) for each of the thread's elements in the chunk: element
// i, the thread's k-th value.
template <CodecId K, typename Put>
__device__ __forceinline__ void each(const Slice<K>& s, size_t n, Put put) {
#pragma unroll
  for (unsigned k = 0; k < kPerThread; ++k) {
    const size_t i = s.at(k);
    if (i < n) put(i, k);
  }
}

// Writes the payload of the thread's values (the scale by the group's first
// thread) and, with a residual, what the payload leaves out of each value.
template <CodecId K>
__device__ __forceinline__ void store(const Slice<K>& s, const float (&v)[kPerThread], size_t n,
                                      uint32_t max_bits, float* res, uint8_t* out) {
  const size_t blocks = n / kBlock<K> + (n % kBlock<K> != 0);
  if constexpr (K == CodecId::kFp32) {
    float* values = reinterpret_cast<float*>(out);
    each(s, n, [&](size_t i, unsigned k) {
      values[i] = v[k];
      if (res) res[i] = 0.0f;
    });
  } else if constexpr (K == CodecId::kBf16) {
    uint16_t* values = reinterpret_cast<uint16_t*>(out);
    each(s, n, [&](size_t i, unsigned k) {
      const uint16_t h = cm::fp32_to_bf16(v[k]);
      values[i] = h;
      if (res) res[i] = cm::sub_rn(v[k], cm::bf16_to_fp32(h));
    });
  } else if constexpr (K == CodecId::kFp16) {
    const cm::Fp16Scale sc = cm::fp16_scale_for(max_bits);
    if (s.lead()) reinterpret_cast<float*>(out)[s.block] = sc.scale;
    uint16_t* values = reinterpret_cast<uint16_t*>(out + Fp16Codec::kScaleBytes * blocks);
    each(s, n, [&](size_t i, unsigned k) {
      const uint16_t h = cm::fp16_quantise(v[k], sc);
      values[i] = h;
      if (res) res[i] = cm::sub_rn(v[k], cm::fp16_dequantise(h, sc.scale));
    });
  } else {
    const cm::Int8Scale sc = cm::int8_scale_for(max_bits);
    if (s.lead()) reinterpret_cast<float*>(out)[s.block] = sc.scale;
    int8_t* values = reinterpret_cast<int8_t*>(out + sizeof(float) * blocks);
    each(s, n, [&](size_t i, unsigned k) {
      const int8_t q = cm::int8_quantise(v[k], sc);
      values[i] = q;
      if (res) res[i] = cm::sub_rn(v[k], cm::int8_dequantise(q, sc.scale));
    });
  }
}

template <CodecId K>
constexpr bool kScaled = K == CodecId::kFp16 || K == CodecId::kInt8;

// Without a residual: one pass. Each thread loads its values once, the
// group takes their maximum, and the payload is written from registers. A
// chunk with a non-finite value gets a payload too (nothing else is
// written); the caller sees first_bad and throws it away.
template <CodecId K>
__global__ void __launch_bounds__(kThreads)
    one_pass_kernel(const float* in, const float* minus, size_t n, unsigned long long* first_bad,
                    uint8_t* out) {
  const Slice<K> s;
  if (kGroup<K> == 32 && s.block * kBlock<K> >= n) return;  // a whole warp past the end
  float v[kPerThread];
  unsigned long long bad = kNoBad;
  uint32_t m = load(s, in, minus, nullptr, n, v, bad);
  if (bad != kNoBad) atomicMin(first_bad, bad);
  if constexpr (kScaled<K>) m = group_max_of<K>(m);
  store(s, v, n, m, nullptr, out);
}

// With a residual, pass 1 of 2: every block's maximum and the first
// non-finite index, so that pass 2 can leave the residual untouched when the
// chunk cannot be encoded.
template <CodecId K>
__global__ void __launch_bounds__(kThreads)
    block_max_kernel(const float* in, const float* minus, const float* res, size_t n,
                     uint32_t* block_max, unsigned long long* first_bad) {
  const Slice<K> s;
  if (kGroup<K> == 32 && s.block * kBlock<K> >= n) return;
  float v[kPerThread];
  unsigned long long bad = kNoBad;
  uint32_t m = load(s, in, minus, res, n, v, bad);
  if (bad != kNoBad) atomicMin(first_bad, bad);
  if constexpr (kScaled<K>) {
    m = group_max_of<K>(m);
    if (s.lead()) block_max[s.block] = m;
  }
}

// With a residual, pass 2 of 2: nothing when pass 1 found a non-finite
// value (the same for the whole grid), else the payload and the residual.
template <CodecId K>
__global__ void __launch_bounds__(kThreads)
    quantise_kernel(const float* in, const float* minus, float* res, size_t n,
                    const uint32_t* block_max, const unsigned long long* first_bad, uint8_t* out) {
  if (*first_bad != kNoBad) return;
  const Slice<K> s;
  if (s.block * kBlock<K> >= n) return;  // whole groups only: no synchronisation here
  float v[kPerThread];
  unsigned long long bad = kNoBad;
  load(s, in, minus, res, n, v, bad);
  store(s, v, n, kScaled<K> ? block_max[s.block] : 0u, res, out);
}

template <CodecId K>
cudaError_t launch(const EncodeArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  const size_t blocks = a.n / kBlock<K> + (a.n % kBlock<K> != 0);
  const size_t ctas = blocks / kGroupsPerCta<K> + (blocks % kGroupsPerCta<K> != 0);
  if (ctas > 0x7FFFFFFFu) return cudaErrorInvalidValue;
  const dim3 grid{static_cast<unsigned>(ctas)};
  if (a.residual == nullptr) {
    one_pass_kernel<K><<<grid, kThreads, 0, stream>>>(a.in, a.minus, a.n, a.first_bad, a.out);
  } else {
    block_max_kernel<K>
        <<<grid, kThreads, 0, stream>>>(a.in, a.minus, a.residual, a.n, a.block_max, a.first_bad);
    quantise_kernel<K><<<grid, kThreads, 0, stream>>>(a.in, a.minus, a.residual, a.n, a.block_max,
                                                      a.first_bad, a.out);
  }
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
