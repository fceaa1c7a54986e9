#include "tensor/chunk_plan.hpp"

#include <string>

#include "fedwan/error.hpp"

namespace fedwan::tensor {

ChunkPlan::ChunkPlan(uint64_t total_elements, uint32_t chunk_elements)
    : total_(total_elements), chunk_(chunk_elements) {
  if (total_ == 0) throw ConfigError("chunk plan: the model has no elements");
  if (chunk_ == 0) throw ConfigError("chunk plan: chunk size must be at least one element");
  const uint64_t count = (total_ + chunk_ - 1) / chunk_;
  if (count > UINT32_MAX) {
    throw ConfigError("chunk plan: " + std::to_string(count) +
                      " chunks exceed the wire limit; "
                      "raise chunk_bytes");
  }
  count_ = static_cast<uint32_t>(count);
}

ChunkPlan ChunkPlan::from_bytes(uint64_t total_elements, uint64_t chunk_bytes) {
  return ChunkPlan(total_elements, static_cast<uint32_t>(chunk_bytes / sizeof(float)));
}

uint32_t ChunkPlan::size(uint32_t i) const {
  const uint64_t begin = offset(i);
  const uint64_t end = begin + chunk_ < total_ ? begin + chunk_ : total_;
  return begin < end ? static_cast<uint32_t>(end - begin) : 0;
}

}  // namespace fedwan::tensor
