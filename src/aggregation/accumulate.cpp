// Weighted accumulation of decoded chunks into an aggregator's fp32 sum.
// Every path computes acc + (weight * x) with two roundings and no FMA, the
// same operations as the codecs' decode_accumulate, so the two agree bit for
// bit and aggregates are reproducible across machines.
#include <cstddef>

#include "aggregation/aggregation_rule.hpp"
#include "common/cpu_features.hpp"
#include "fedwan/codec.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fedwan {
namespace {

void accumulate_scalar(float* acc, const float* x, size_t n, float weight) {
  for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + weight * x[i];
}

// 0 + w * x, as accumulate_scalar onto zeros: the addition stays (it turns
// a product of -0 into +0, as the sum onto zeros does).
void first_scalar(float* out, const float* x, size_t n, float weight) {
  const float zero = 0.0f;
  for (size_t i = 0; i < n; ++i) out[i] = zero + weight * x[i];
}

#if defined(__x86_64__)
// "avx2" only, not "fma": the compiler then has no fused instruction to
// contract the mul and add into.
__attribute__((target("avx2"))) void accumulate_avx2(float* acc, const float* x, size_t n,
                                                     float weight) {
  const __m256 w = _mm256_set1_ps(weight);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 p0 = _mm256_mul_ps(w, _mm256_loadu_ps(x + i));
    const __m256 p1 = _mm256_mul_ps(w, _mm256_loadu_ps(x + i + 8));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), p0));
    _mm256_storeu_ps(acc + i + 8, _mm256_add_ps(_mm256_loadu_ps(acc + i + 8), p1));
  }
  accumulate_scalar(acc + i, x + i, n - i, weight);
}

__attribute__((target("avx2"))) void first_avx2(float* out, const float* x, size_t n,
                                                float weight) {
  const __m256 w = _mm256_set1_ps(weight);
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 p0 = _mm256_mul_ps(w, _mm256_loadu_ps(x + i));
    const __m256 p1 = _mm256_mul_ps(w, _mm256_loadu_ps(x + i + 8));
    _mm256_storeu_ps(out + i, _mm256_add_ps(zero, p0));
    _mm256_storeu_ps(out + i + 8, _mm256_add_ps(zero, p1));
  }
  first_scalar(out + i, x + i, n - i, weight);
}
#endif

using AccumulateFn = void (*)(float*, const float*, size_t, float);

AccumulateFn pick_accumulate() {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return accumulate_avx2;
#endif
  return accumulate_scalar;
}

AccumulateFn pick_first() {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return first_avx2;
#endif
  return first_scalar;
}

}  // namespace

void aggregation::first_weighted(float* out, const float* x, size_t n, float weight) {
  static const AccumulateFn fn = pick_first();
  fn(out, x, n, weight);
}

void accumulate_weighted(float* acc, const float* x, size_t n, float weight) {
  static const AccumulateFn fn = pick_accumulate();
  fn(acc, x, n, weight);
}

}  // namespace fedwan
