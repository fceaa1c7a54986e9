// A copy of floats that nobody reads again soon: a model's parameters
// written back as each chunk of a round's anchor comes in, next read by the
// next training step, long after the caches turned over. On CPUs with AVX2
// it stores past the caches (non-temporal stores), so the copy neither
// reads every destination line from memory before writing it nor evicts
// what the caller works on next; elsewhere it is memcpy. The same bits
// either way. For small copies (a block of a chunk while it is in L1):
// memcpy stores past the caches by itself beyond a few MiB, and does it
// faster than this (BM_Site_Anchor* in benchmarks/micro/bench_round_steps.cpp
// measures the block case).
#pragma once

#include <cstddef>

namespace fedwan {

// dst[i] = src[i] for i < n; the two must not overlap. The stores are
// visible to other threads as memcpy's are once it returns (it fences).
void stream_copy(float* dst, const float* src, size_t n);

}  // namespace fedwan
