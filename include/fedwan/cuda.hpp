// CUDA availability (library fedwan::cuda, built when a CUDA toolkit is found).
#pragma once

namespace fedwan::cuda {

// Number of usable CUDA devices; 0 without a GPU or driver. Thread safe.
int device_count();

}  // namespace fedwan::cuda
