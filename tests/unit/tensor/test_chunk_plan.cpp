#include <gtest/gtest.h>

#include "fedwan/error.hpp"
#include "tensor/chunk_plan.hpp"

namespace fedwan {
namespace {

TEST(ChunkPlan, CoversEveryElementOnceWithAShortLastChunk) {
  const tensor::ChunkPlan plan(1000, 300);
  ASSERT_EQ(plan.count(), 4u);
  uint64_t covered = 0;
  for (uint32_t i = 0; i < plan.count(); ++i) {
    EXPECT_EQ(plan.offset(i), covered);
    covered += plan.size(i);
  }
  EXPECT_EQ(covered, 1000u);
  EXPECT_EQ(plan.size(3), 100u);
  EXPECT_EQ(plan.size(4), 0u);  // past the end
}

TEST(ChunkPlan, ExactMultipleHasNoEmptyChunk) {
  const tensor::ChunkPlan plan =
      tensor::ChunkPlan::from_bytes(1 << 20, 1 << 20);  // 1M floats, 1 MiB chunks
  EXPECT_EQ(plan.chunk_elements(), 262144u);
  EXPECT_EQ(plan.count(), 4u);
  EXPECT_EQ(plan.size(3), 262144u);
}

TEST(ChunkPlan, RejectsEmptyModelAndEmptyChunks) {
  EXPECT_THROW(tensor::ChunkPlan(0, 10), ConfigError);
  EXPECT_THROW(tensor::ChunkPlan(10, 0), ConfigError);
}

}  // namespace
}  // namespace fedwan
