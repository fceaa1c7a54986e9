// Device discovery for the CUDA side. Safe on machines without a GPU or
// driver: it reports zero devices instead of failing.
#include <cuda_runtime.h>

#include "fedwan/cuda.hpp"

namespace fedwan::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver/device" error
    return 0;
  }
  return n;
}

bool is_device_pointer(const void* p) {
  if (p == nullptr || device_count() == 0) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

}  // namespace fedwan::cuda
