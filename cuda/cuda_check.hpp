// The one checking wrapper for CUDA runtime calls on the CUDA side: a failed
// call throws fedwan::Error (or the subclass given) with the call's text,
// CUDA's own message and file:line, and clears CUDA's sticky error state
// where it can. Header-only; usable from .cu and .cpp files alike.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fedwan/error.hpp"

namespace fedwan::cuda::detail {

template <class E = Error>
[[noreturn]] inline void throw_cuda(cudaError_t status, const char* call, const char* file,
                                    int line) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  throw E(std::string(file) + ":" + std::to_string(line) + ": " + call +
          " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace fedwan::cuda::detail

// FEDWAN_CUDA_CHECK(cudaMalloc(&p, n));  throws fedwan::Error on failure.
#define FEDWAN_CUDA_CHECK(call)                                                             \
  do {                                                                                      \
    const cudaError_t fedwan_cuda_status_ = (call);                                         \
    if (fedwan_cuda_status_ != cudaSuccess)                                                 \
      ::fedwan::cuda::detail::throw_cuda<>(fedwan_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

// Same, throwing the given fedwan exception type.
#define FEDWAN_CUDA_CHECK_AS(type, call)                                                        \
  do {                                                                                          \
    const cudaError_t fedwan_cuda_status_ = (call);                                             \
    if (fedwan_cuda_status_ != cudaSuccess)                                                     \
      ::fedwan::cuda::detail::throw_cuda<type>(fedwan_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)
