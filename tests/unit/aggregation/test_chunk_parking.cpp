#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "aggregation/chunk_parking.hpp"
#include "aggregation/round_accumulator.hpp"
#include "fedwan/codec.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::aggregation {
namespace {

// Three children send every chunk of a round, the first all of its chunks
// before the others begin: with parking every chunk waits on disk.
std::vector<std::vector<float>> run_round(RoundAccumulator& acc, const tensor::ChunkPlan& plan) {
  const Codec& fp16 = codec_by_name("fp16");
  acc.open(5);
  std::vector<std::vector<float>> means(plan.count());
  const uint32_t senders[] = {3, 4, 8};
  for (uint32_t s = 0; s < 3; ++s) {
    for (uint32_t c = 0; c < plan.count(); ++c) {
      std::vector<float> v(plan.size(c));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * float((i * 7 + c * 13 + s * 29) % 101);
      std::vector<uint8_t> bytes(fp16.encoded_size(v.size()));
      fp16.encode(v.data(), v.size(), nullptr, bytes.data());
      const auto r =
          acc.add(5, senders[s], c, plan.size(c), 1.0 + s, fp16, bytes.data(), bytes.size());
      EXPECT_EQ(r.outcome, AddOutcome::kAccepted);
      if (r.chunk_complete) means[c] = acc.take(c).mean;
    }
  }
  return means;
}

TEST(ChunkParking, ChunksWaitingOnDiskMakeTheSameMeanBitForBit) {
  const tensor::ChunkPlan plan(50000, 4096);
  RoundAccumulator in_memory(plan, {3, 4, 8});
  const auto want = run_round(in_memory, plan);
  EXPECT_EQ(in_memory.chunks_parked(), 0u);

  testing::TempDir dir;
  RoundAccumulator parked(plan, {3, 4, 8});
  parked.park_beyond(0, dir.path().string(), "test");
  const auto got = run_round(parked, plan);
  // Every chunk waits after its first and second copies, except none.
  EXPECT_EQ(parked.chunks_parked(), 2u * plan.count());
  ASSERT_EQ(got.size(), want.size());
  for (size_t c = 0; c < got.size(); ++c) {
    ASSERT_EQ(got[c].size(), want[c].size());
    EXPECT_EQ(std::memcmp(got[c].data(), want[c].data(), got[c].size() * sizeof(float)), 0) << c;
  }
  EXPECT_EQ(parked.bytes_in_flight(), 0u);
}

TEST(ChunkParking, CopiesHeldForTheScreenWaitOnDiskTooAndAreJudgedAlike) {
  // The default screen holds every copy of a round with no norm history
  // until its chunk closes.
  const tensor::ChunkPlan plan(50000, 4096);
  RoundAccumulator in_memory(plan, {3, 4, 8}, nullptr, ScreenConfig{});
  const auto want = run_round(in_memory, plan);
  testing::TempDir dir;
  RoundAccumulator parked(plan, {3, 4, 8}, nullptr, ScreenConfig{});
  parked.park_beyond(0, dir.path().string(), "test");
  const auto got = run_round(parked, plan);
  EXPECT_EQ(parked.chunks_parked(), 2u * plan.count());  // the first two copies of each chunk
  for (size_t c = 0; c < got.size(); ++c) {
    ASSERT_EQ(got[c].size(), want[c].size());
    EXPECT_EQ(std::memcmp(got[c].data(), want[c].data(), got[c].size() * sizeof(float)), 0) << c;
  }
}

TEST(ChunkParking, ABudgetKeepsThatMuchInMemory) {
  const tensor::ChunkPlan plan(50000, 4096);
  testing::TempDir dir;
  RoundAccumulator acc(plan, {3, 4});
  const size_t budget = 3 * 4096 * sizeof(float);  // three chunks
  acc.park_beyond(budget, dir.path().string(), "test");
  const Codec& fp32 = codec_by_name("fp32");
  acc.open(0);
  for (uint32_t c = 0; c < plan.count(); ++c) {
    std::vector<float> v(plan.size(c), 1.0f);
    std::vector<uint8_t> bytes(fp32.encoded_size(v.size()));
    fp32.encode(v.data(), v.size(), nullptr, bytes.data());
    acc.add(0, 3, c, plan.size(c), 1.0, fp32, bytes.data(), bytes.size());
    EXPECT_LE(acc.bytes_in_flight(), budget);
  }
  EXPECT_EQ(acc.chunks_in_flight(), plan.count());
  EXPECT_EQ(acc.chunks_parked(), plan.count() - 3);
}

TEST(ChunkParking, AFileItCannotMakeLeavesStatesInMemory) {
  testing::TempDir dir;
  std::ofstream(dir.path() / "file") << "x";
  ChunkParking p;
  p.enable(0, dir.path() / "file" / "sub", "test");
  std::vector<float> state(100, 2.5f);
  ChunkParking::Ticket t;
  EXPECT_FALSE(p.park(&state, &t));
  EXPECT_EQ(state.size(), 100u);
  EXPECT_EQ(t.file, nullptr);
}

TEST(ChunkParking, AStateComesBackAfterTheRoundsFileIsReplaced) {
  testing::TempDir dir;
  ChunkParking p;
  p.enable(0, dir.path(), "test");
  std::vector<float> state = {1.5f, -2.0f, 3.25f};
  ChunkParking::Ticket t;
  ASSERT_TRUE(p.park(&state, &t));
  EXPECT_TRUE(state.empty());
  p.rotate();
  ChunkParking::unpark(&state, &t);
  EXPECT_EQ(state, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(t.file, nullptr);
}

}  // namespace
}  // namespace fedwan::aggregation
