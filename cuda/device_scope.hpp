// Makes a CUDA device current for a scope and restores the caller's device
// on exit, so a call made from any thread (DataParallel's worker, a site's
// training thread) neither needs the device set nor changes it.
#pragma once

#include <cuda_runtime.h>

#include "cuda_check.hpp"

namespace fedwan::cuda {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    FEDWAN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) FEDWAN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace fedwan::cuda
