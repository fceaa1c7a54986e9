// How a flat model of `total` fp32 elements is cut into chunks. Pure; every
// node derives the same plan from the model size and the topology's
// chunk_bytes, so chunk i means the same elements everywhere.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fedwan/export.hpp"

namespace fedwan::tensor {

// Exported for libfedwan (torch/site.cpp plans its chunks); not public API.
class FEDWAN_API ChunkPlan {
 public:
  ChunkPlan() = default;
  // Throws ConfigError when chunk_elements is 0 or total is 0.
  ChunkPlan(uint64_t total_elements, uint32_t chunk_elements);
  static ChunkPlan from_bytes(uint64_t total_elements, uint64_t chunk_bytes);

  uint64_t total() const { return total_; }
  uint32_t chunk_elements() const { return chunk_; }
  uint32_t count() const { return count_; }
  uint64_t offset(uint32_t i) const { return uint64_t{i} * chunk_; }
  uint32_t size(uint32_t i) const;  // elements in chunk i (the last may be short)

 private:
  uint64_t total_ = 0;
  uint32_t chunk_ = 0;
  uint32_t count_ = 0;
};

}  // namespace fedwan::tensor
