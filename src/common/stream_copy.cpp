#include "common/stream_copy.hpp"

#include <cstdint>
#include <cstring>

#include "common/cpu_features.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fedwan {

namespace {

// Below this a copy is a few lines: memcpy, whose stores stay in cache.
constexpr size_t kStreamFrom = 64;

#if defined(__x86_64__)
__attribute__((target("avx2"))) void stream_copy_avx2(float* dst, const float* src, size_t n) {
  // Up to the first 32-byte boundary of dst (floats are 4-byte aligned, so
  // at most 7 of them), then whole 32-byte stores, then the tail.
  size_t head = ((32 - reinterpret_cast<uintptr_t>(dst) % 32) % 32) / sizeof(float);
  if (head > n) head = n;
  std::memcpy(dst, src, head * sizeof(float));
  size_t i = head;
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  std::memcpy(dst + i, src + i, (n - i) * sizeof(float));
  _mm_sfence();  // the streamed stores are ordered before whatever follows
}
#endif

}  // namespace

void stream_copy(float* dst, const float* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamFrom && reinterpret_cast<uintptr_t>(dst) % sizeof(float) == 0 && cpu_has_avx2()) {
    stream_copy_avx2(dst, src, n);
    return;
  }
#endif
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}

}  // namespace fedwan
