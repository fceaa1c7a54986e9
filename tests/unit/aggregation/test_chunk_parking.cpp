#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "aggregation/aggregation_rule.hpp"
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

// Two children, the first a whole update ahead: with parking, each chunk's
// state waits as the first copy's payload and is rebuilt from it. With
// `hand_back`, each taken mean is copied out, spoiled (NaN) and handed back
// to the accumulator, as an aggregator hands back what it has encoded.
std::vector<std::vector<float>> two_children(RoundAccumulator& acc, const tensor::ChunkPlan& plan,
                                             const Codec& codec, bool hand_back = false) {
  acc.open(2);
  std::vector<std::vector<float>> means(plan.count());
  for (uint32_t s = 0; s < 2; ++s) {
    for (uint32_t c = 0; c < plan.count(); ++c) {
      std::vector<float> v(plan.size(c));
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = 0.37f * float(int((i * 11 + c * 5 + s * 3) % 23) - 11) / float(1 + s + c % 3);
      }
      std::vector<uint8_t> bytes(codec.encoded_size(v.size()));
      codec.encode(v.data(), v.size(), nullptr, bytes.data());
      const auto r = acc.add(2, 10 + s, c, plan.size(c), s == 0 ? 3.0 : 0.7, codec, bytes.data(),
                             bytes.size());
      EXPECT_EQ(r.outcome, AddOutcome::kAccepted);
      if (!r.chunk_complete) continue;
      means[c] = acc.take(c).mean;
      if (hand_back) {
        std::vector<float> used = means[c];
        std::fill(used.begin(), used.end(), std::numeric_limits<float>::quiet_NaN());
        acc.recycle(std::move(used));
        EXPECT_LE(acc.spares(), RoundAccumulator::kSpares);
      }
    }
  }
  return means;
}

// The same round of two children in memory and with every waiting chunk
// on disk: the means must match bit for bit. The parked run's counts.
struct ParkedCounts {
  uint64_t chunks = 0, bytes = 0, clipped = 0;
};
ParkedCounts same_means_parked(const tensor::ChunkPlan& plan, const Codec& codec,
                               const ScreenConfig& screen = ScreenConfig::none(),
                               double clip_first = 0) {
  RoundAccumulator in_memory(plan, {10, 11}, nullptr, screen);
  testing::TempDir dir;
  RoundAccumulator parked(plan, {10, 11}, nullptr, screen);
  if (clip_first > 0) {
    in_memory.clip_copies_of(10, clip_first);
    parked.clip_copies_of(10, clip_first);
  }
  parked.park_beyond(0, dir.path().string(), "test");
  const auto want = two_children(in_memory, plan, codec);
  const auto got = two_children(parked, plan, codec);
  EXPECT_EQ(got.size(), want.size());
  for (size_t c = 0; c < got.size() && c < want.size(); ++c) {
    EXPECT_EQ(got[c].size(), want[c].size());
    EXPECT_TRUE(got[c].size() == want[c].size() &&
                std::memcmp(got[c].data(), want[c].data(), got[c].size() * sizeof(float)) == 0)
        << "chunk " << c;
  }
  EXPECT_EQ(parked.bytes_in_flight(), 0u);
  return {parked.chunks_parked(), parked.bytes_parked(), parked.privacy_clipped()};
}

TEST(ChunkParking, MeansHandedBackAreWrittenOverAndEveryRoundMakesTheSameMeans) {
  // Three rounds in memory and with every waiting chunk on disk, each taken
  // mean handed back spoiled: every next chunk's sum, and states read back,
  // go into those buffers and must not show it.
  const tensor::ChunkPlan plan(50000, 4096);
  const Codec& fp16 = codec_by_name("fp16");
  testing::TempDir dir;
  RoundAccumulator plain(plan, {10, 11});
  RoundAccumulator in_memory(plan, {10, 11});
  RoundAccumulator parked(plan, {10, 11});
  parked.park_beyond(0, dir.path().string(), "test");
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    const auto want = two_children(plain, plan, fp16);
    for (RoundAccumulator* acc : {&in_memory, &parked}) {
      const auto got = two_children(*acc, plan, fp16, /*hand_back=*/true);
      ASSERT_EQ(got.size(), want.size());
      for (size_t c = 0; c < got.size(); ++c) {
        ASSERT_EQ(got[c].size(), want[c].size());
        EXPECT_EQ(std::memcmp(got[c].data(), want[c].data(), got[c].size() * sizeof(float)), 0)
            << "chunk " << c;
      }
      EXPECT_EQ(acc->bytes_in_flight(), 0u);
    }
    // The last chunk is shorter than the rest: its mean is not kept.
    EXPECT_GE(in_memory.spares(), 1u);
  }
  EXPECT_EQ(parked.chunks_parked(), 3 * plan.count());
}

TEST(ChunkParking, AChunkWithOneCopyWaitsAsThatCopysPayloadAndMakesTheSameMean) {
  const tensor::ChunkPlan plan(50000, 4096);
  for (const char* name : {"fp16", "bf16", "int8", "fp32"}) {
    SCOPED_TRACE(name);
    const Codec& codec = codec_by_name(name);
    const ParkedCounts n = same_means_parked(plan, codec);
    EXPECT_EQ(n.chunks, plan.count());
    uint64_t payloads = 0;
    for (uint32_t c = 0; c < plan.count(); ++c) payloads += codec.encoded_size(plan.size(c));
    // fp32's payload is no smaller than the state: the state waits.
    EXPECT_EQ(n.bytes, std::string(name) == "fp32" ? plan.total() * sizeof(float) : payloads);
  }
}

TEST(ChunkParking, ACopyClippedForPrivacyWaitsAsItsValuesNotItsPayload) {
  const tensor::ChunkPlan plan(50000, 4096);
  // Combined at once (no screen), or held for want of norm history.
  for (const ScreenConfig& screen : {ScreenConfig::none(), ScreenConfig{}}) {
    SCOPED_TRACE(screen.norm == ScreenConfig::Norm::kOff ? "combined" : "held");
    const ParkedCounts n = same_means_parked(plan, codec_by_name("fp16"), screen, 1.0);
    EXPECT_EQ(n.chunks, plan.count());
    // Every chunk's first copy was clipped (its values are not the
    // payload's decoding): their fp32 values waited.
    EXPECT_EQ(n.clipped, plan.count());
    EXPECT_EQ(n.bytes, plan.total() * sizeof(float));
  }
}

// fp16 under the same id, but not the registered instance: a payload in it
// could not be decoded again by looking its codec up.
class UnregisteredFp16 : public Codec {
 public:
  CodecId id() const override { return fp16_.id(); }
  std::string_view name() const override { return "fp16"; }
  size_t encoded_size(size_t n) const override { return fp16_.encoded_size(n); }
  void encode(const float* in, size_t n, float* residual, uint8_t* out) const override {
    fp16_.encode(in, n, residual, out);
  }
  bool validate(const uint8_t* in, size_t bytes, size_t n) const override {
    return fp16_.validate(in, bytes, n);
  }
  void decode(const uint8_t* in, size_t n, float* out) const override { fp16_.decode(in, n, out); }
  void decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const override {
    fp16_.decode_accumulate(in, n, weight, acc);
  }

 private:
  const Codec& fp16_ = codec_by_name("fp16");
};

TEST(ChunkParking, ACodecThatCannotBeLookedUpLeavesTheStateToWait) {
  const tensor::ChunkPlan plan(50000, 4096);
  const ParkedCounts n = same_means_parked(plan, UnregisteredFp16());
  EXPECT_EQ(n.chunks, plan.count());
  EXPECT_EQ(n.bytes, plan.total() * sizeof(float));
}

TEST(ChunkParking, ARefusedCopyLeavesAChunkThatWaitsAsAPayloadOnDisk) {
  // One child's copies all wait on disk; another's are all refused (beyond
  // max_abs): memory must not fill with rebuilt states for them.
  const tensor::ChunkPlan plan(50000, 4096);
  const Codec& fp16 = codec_by_name("fp16");
  ScreenConfig screen = ScreenConfig::none();
  screen.max_abs = 100;
  testing::TempDir dir;
  RoundAccumulator acc(plan, {10, 11, 12}, nullptr, screen);
  acc.park_beyond(0, dir.path().string(), "test");
  acc.open(0);
  auto send = [&](uint32_t sender, float value) {
    for (uint32_t c = 0; c < plan.count(); ++c) {
      std::vector<float> v(plan.size(c), value);
      std::vector<uint8_t> bytes(fp16.encoded_size(v.size()));
      fp16.encode(v.data(), v.size(), nullptr, bytes.data());
      const auto r = acc.add(0, sender, c, plan.size(c), 1.0, fp16, bytes.data(), bytes.size());
      EXPECT_EQ(r.outcome, value > 100 ? AddOutcome::kRefused : AddOutcome::kAccepted);
      if (r.chunk_complete) {
        const ChunkSum sum = acc.take(c);
        ASSERT_EQ(sum.mean.size(), plan.size(c));
        EXPECT_EQ(sum.mean[0], 2.0f);  // (1.5 + 2.5) / 2: the refused copy is not in it
      }
    }
  };
  send(10, 1.5f);
  EXPECT_EQ(acc.bytes_in_flight(), 0u);
  send(11, 1000.0f);
  EXPECT_EQ(acc.bytes_in_flight(), 0u);
  send(12, 2.5f);
  EXPECT_TRUE(acc.round_complete());
  EXPECT_EQ(acc.bytes_in_flight(), 0u);
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
  // Each as its fp16 payload, not its values.
  uint64_t payloads = 0;
  for (uint32_t c = 0; c < plan.count(); ++c) {
    payloads += codec_by_name("fp16").encoded_size(plan.size(c));
  }
  EXPECT_EQ(parked.bytes_parked(), 2 * payloads);
  for (size_t c = 0; c < got.size(); ++c) {
    ASSERT_EQ(got[c].size(), want[c].size());
    EXPECT_EQ(std::memcmp(got[c].data(), want[c].data(), got[c].size() * sizeof(float)), 0) << c;
  }
}

// The weighted mean, counting the combiners begun and the copies added.
struct Calls {
  int begun = 0, added = 0;
};
class CountingCombiner final : public ChunkCombiner {
 public:
  CountingCombiner(std::unique_ptr<ChunkCombiner> inner, Calls* calls)
      : inner_(std::move(inner)), calls_(calls) {
    calls_->begun += 1;
  }
  void add(uint32_t slot, const float* values, double weight) override {
    calls_->added += 1;
    inner_->add(slot, values, weight);
  }
  Combined finish() override { return inner_->finish(); }
  size_t bytes_held() const override { return inner_->bytes_held(); }
  std::vector<float>* parkable() override { return inner_->parkable(); }

 private:
  std::unique_ptr<ChunkCombiner> inner_;
  Calls* calls_;
};
class CountingRule final : public AggregationRule {
 public:
  explicit CountingRule(Calls* calls) : calls_(calls) {}
  std::string name() const override { return "counting"; }
  RuleMemory memory() const override { return mean_->memory(); }
  std::unique_ptr<ChunkCombiner> begin_chunk(uint32_t n, size_t fan_in) const override {
    return std::make_unique<CountingCombiner>(mean_->begin_chunk(n, fan_in), calls_);
  }

 private:
  std::shared_ptr<const AggregationRule> mean_ = make_rule(kWeightedMean);
  Calls* calls_;
};

TEST(ChunkParking, AFirstCopyThatWouldWaitOnDiskIsNotCombinedUntilItsChunkIsTaken) {
  const tensor::ChunkPlan plan(50000, 4096);
  const Codec& fp16 = codec_by_name("fp16");
  Calls in_memory_calls, parked_calls;
  RoundAccumulator in_memory(plan, {10, 11}, std::make_shared<CountingRule>(&in_memory_calls));
  const auto want = two_children(in_memory, plan, fp16);
  testing::TempDir dir;
  RoundAccumulator parked(plan, {10, 11}, std::make_shared<CountingRule>(&parked_calls));
  parked.park_beyond(0, dir.path().string(), "test");
  const auto got = two_children(parked, plan, fp16);
  const int n = static_cast<int>(plan.count());
  EXPECT_EQ(in_memory_calls.begun, n);
  EXPECT_EQ(in_memory_calls.added, 2 * n);
  // Every chunk waited as its first copy's payload. Only the first chunk's
  // combiner was begun for its first copy and dropped (the rule's
  // combiners are not known to park before one is made); every other
  // chunk's first copy was combined once, when its second came.
  EXPECT_EQ(parked.chunks_parked(), plan.count());
  EXPECT_EQ(parked_calls.begun, n + 1);
  EXPECT_EQ(parked_calls.added, 2 * n + 1);
  ASSERT_EQ(got.size(), want.size());
  for (size_t c = 0; c < got.size(); ++c) {
    ASSERT_EQ(got[c].size(), want[c].size());
    EXPECT_EQ(std::memcmp(got[c].data(), want[c].data(), got[c].size() * sizeof(float)), 0) << c;
  }
  EXPECT_EQ(parked.bytes_in_flight(), 0u);
}

TEST(ChunkParking, AFirstCopyWithinTheBudgetOrThatClosesItsChunkIsCombinedAtOnce) {
  const tensor::ChunkPlan plan(50000, 4096);
  const Codec& fp16 = codec_by_name("fp16");
  testing::TempDir dir;
  {  // room for every chunk: nothing waits on disk
    Calls calls;
    RoundAccumulator acc(plan, {10, 11}, std::make_shared<CountingRule>(&calls));
    acc.park_beyond(plan.total() * sizeof(float), dir.path().string(), "test");
    two_children(acc, plan, fp16);
    EXPECT_EQ(acc.chunks_parked(), 0u);
    EXPECT_EQ(calls.begun, static_cast<int>(plan.count()));
  }
  {  // one child: each copy closes its chunk
    Calls calls;
    RoundAccumulator acc(plan, {10}, std::make_shared<CountingRule>(&calls));
    acc.park_beyond(0, dir.path().string(), "test");
    acc.open(1);
    for (uint32_t c = 0; c < plan.count(); ++c) {
      std::vector<float> v(plan.size(c), 0.5f);
      std::vector<uint8_t> bytes(fp16.encoded_size(v.size()));
      fp16.encode(v.data(), v.size(), nullptr, bytes.data());
      const auto r = acc.add(1, 10, c, plan.size(c), 1.0, fp16, bytes.data(), bytes.size());
      ASSERT_TRUE(r.chunk_complete);
      EXPECT_EQ(acc.take(c).mean[0], 0.5f);
    }
    EXPECT_EQ(acc.chunks_parked(), 0u);
    EXPECT_EQ(calls.begun, static_cast<int>(plan.count()));
    EXPECT_EQ(calls.added, static_cast<int>(plan.count()));
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
