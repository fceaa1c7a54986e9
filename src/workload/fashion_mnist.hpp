// Fashion-MNIST loader for the demo: reads the four gzipped IDX files that
// Debian's dataset-fashion-mnist package installs. Every header field is
// checked before anything is allocated, so a truncated or foreign file is a
// clear ConfigError, never a crash or a huge allocation.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fedwan::workload {

inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Training-set pixel statistics (after scaling to [0, 1]) used to normalise
// both sets: x' = (x/255 - mean) / std.
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;
inline constexpr int64_t kFashionMnistClasses = 10;

enum class FashionMnistSet { kTrain, kTest };

struct FashionMnistData {
  torch::Tensor images;              // float32 [N, 1, 28, 28], normalised, CPU
  torch::Tensor labels;              // int64 [N], values in [0, 10)
  std::vector<uint8_t> label_bytes;  // the same labels, for torch-free code (partitioning)
};

// Loads `train-*` (60000 samples) or `t10k-*` (10000 samples) from `dir`.
// Throws fedwan::ConfigError if a file is missing, unreadable or malformed.
// Blocking file I/O; thread safe (no shared state).
FashionMnistData load_fashion_mnist(FashionMnistSet which,
                                    const std::string& dir = kDefaultFashionMnistDir);

}  // namespace fedwan::workload
