// What an open round waits for (aggregator/round_wait.hpp), without sockets:
// the children that owe chunks; once none does, the absent members whose
// weight the quorum needs (named, with why); and a round that no member
// that could still come can close. The "still waiting for" list is never
// empty while the round waits.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "aggregation/round_accumulator.hpp"
#include "aggregator/round_wait.hpp"
#include "fedwan/codec.hpp"

namespace fedwan::aggregator {
namespace {

using State = RoundWait::State;

class RoundWaitTest : public ::testing::Test {
 protected:
  // Sites a (weight 1) and b (weight 3) under one aggregator, 2 chunks.
  static constexpr uint32_t kA = 4, kB = 5;
  const Codec& fp32 = codec_by_name("fp32");
  tensor::ChunkPlan plan{8, 4};
  aggregation::RoundAccumulator acc{plan, {kA, kB}};

  void deliver(uint32_t child, uint32_t chunk) {
    std::vector<float> v(plan.size(chunk), 1.0f);
    std::vector<uint8_t> bytes(fp32.encoded_size(v.size()));
    fp32.encode(v.data(), v.size(), nullptr, bytes.data());
    ASSERT_EQ(acc.add(0, child, chunk, plan.size(chunk), child == kA ? 1.0 : 3.0, fp32,
                      bytes.data(), bytes.size())
                  .outcome,
              aggregation::AddOutcome::kAccepted);
  }
  RoundWait judge(const std::vector<AbsentMember>& absent, double quorum = 1.0) {
    return judge_round_wait(acc, absent, quorum,
                            [](uint32_t idx) { return idx == kA ? "site-a" : "site-b"; });
  }
  static AbsentMember lost_b() { return {kB, "site-b", 3.0, "lost"}; }
};

TEST_F(RoundWaitTest, NamesTheChildrenThatStillOweChunks) {
  acc.open(0, 4.0 * (1 - 1e-9));
  deliver(kA, 0);
  deliver(kA, 1);
  deliver(kB, 0);
  const RoundWait w = judge({});
  EXPECT_EQ(w.state, State::kDeliveries);
  EXPECT_EQ(w.waiting_for, std::vector<std::string>{"site-b"});
  EXPECT_EQ(acc.owing_children(), std::vector<uint32_t>{kB});
}

TEST_F(RoundWaitTest, ALostMemberWhoseWeightTheQuorumNeedsIsNamedNotNobody) {
  // Quorum 1: both sites' weight. b is lost before it delivered: a has
  // delivered everything, nobody expected owes anything, and yet no chunk
  // can close.
  acc.open(0, 4.0 * (1 - 1e-9));
  acc.set_expected(kB, false);
  deliver(kA, 0);
  deliver(kA, 1);
  EXPECT_TRUE(acc.owing_children().empty());
  EXPECT_TRUE(acc.ready_chunks().empty());
  EXPECT_EQ(acc.short_chunks(), (std::vector<uint32_t>{0, 1}));
  const RoundWait w = judge({lost_b()});
  EXPECT_EQ(w.state, State::kAbsentMembers);
  EXPECT_EQ(w.waiting_for,
            std::vector<std::string>{"site-b (lost; its weight is needed for quorum 1)"});
}

TEST_F(RoundWaitTest, AnAbsentMemberThatAlreadyDeliveredTheShortChunksIsNotNeeded) {
  // Both delivered chunk 0 (closed); b delivered chunk 1 too. Both are
  // lost: chunk 1 lacks only a's weight, so only a is named.
  acc.open(0, 4.0 * (1 - 1e-9));
  deliver(kB, 0);
  deliver(kA, 0);
  deliver(kB, 1);
  acc.set_expected(kA, false);
  acc.set_expected(kB, false);
  (void)acc.take(0);
  const RoundWait w = judge({{kA, "site-a", 1.0, "lost"}, lost_b()});
  EXPECT_EQ(w.state, State::kAbsentMembers);
  EXPECT_EQ(w.waiting_for,
            std::vector<std::string>{"site-a (lost; its weight is needed for quorum 1)"});
}

TEST_F(RoundWaitTest, WithQuorumMetNothingIsWaitedFor) {
  // Quorum 0.5 (2 of 4): b alone has it; a lost and not waited for.
  acc.open(0, 2.0 * (1 - 1e-9));
  acc.set_expected(kA, false);
  deliver(kB, 0);
  deliver(kB, 1);
  EXPECT_EQ(acc.ready_chunks(), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(judge({{kA, "site-a", 1.0, "lost"}}, 0.5).state, State::kNothing);
}

TEST_F(RoundWaitTest, ARoundNoMemberThatCouldStillComeCanCloseNeverCloses) {
  // Quorum 1, b left (not a member, so not absent) but the minimum still
  // counts it (say its region reported it): nobody can bring its weight.
  acc.open(0, 4.0 * (1 - 1e-9));
  acc.set_expected(kB, false);
  deliver(kA, 0);
  deliver(kA, 1);
  const RoundWait w = judge({});
  EXPECT_EQ(w.state, State::kNever);
  EXPECT_TRUE(w.waiting_for.empty());
  EXPECT_NE(w.reason.find("no member that could still deliver it is left"), std::string::npos)
      << w.reason;
  // An absent member too light to make up the difference changes nothing.
  const RoundWait light = judge({{kB, "site-b", 0.5, "lost"}});
  EXPECT_EQ(light.state, State::kNever);
  EXPECT_NE(light.reason.find("would bring it only to 1.5"), std::string::npos) << light.reason;
}

TEST_F(RoundWaitTest, AChunkNobodyDeliveredIsShortEvenWithoutAMinimum) {
  // Every member left (minimum 0): chunk 1 has no arrival and nobody left
  // to deliver it.
  acc.open(0, 0);
  acc.set_expected(kA, false);
  acc.set_expected(kB, false);
  deliver(kA, 0);
  EXPECT_EQ(acc.short_chunks(), std::vector<uint32_t>{1});
  EXPECT_EQ(judge({}).state, State::kNever);
}

// The root's standby and a round's last anchor chunk: a live standby is
// waited for; so is one whose link opened less than a heartbeat timeout ago
// and that has not answered yet, unless it was already found missing (a
// root that starts before its standby, or beside one slow to start on a
// loaded machine, commits no round the standby does not hold).
TEST(StandbyWait, ALiveStandbyIsWaitedFor) {
  using namespace std::chrono_literals;
  const auto t0 = StandbyLink::Clock::now();
  StandbyLink s{true, true, false, t0, t0 - 10s};
  EXPECT_TRUE(standby_live(s, t0 + 1s, 2s));
  EXPECT_TRUE(standby_awaited(s, t0 + 1s, 2s));
  EXPECT_FALSE(standby_live(s, t0 + 3s, 2s)) << "silent for longer than the timeout";
  EXPECT_FALSE(standby_awaited(s, t0 + 3s, 2s));
}

TEST(StandbyWait, AStandbyNotHeardYetIsWaitedForOneTimeoutFromTheLink) {
  using namespace std::chrono_literals;
  const auto t0 = StandbyLink::Clock::now();
  StandbyLink s{true, false, false, {}, t0};
  EXPECT_FALSE(standby_live(s, t0 + 1s, 2s));
  EXPECT_TRUE(standby_awaited(s, t0 + 1s, 2s));
  EXPECT_FALSE(standby_awaited(s, t0 + 3s, 2s));
  s.warned = true;  // found missing before: rounds no longer wait for it
  EXPECT_FALSE(standby_awaited(s, t0 + 1s, 2s));
  s = StandbyLink{false, false, false, {}, t0};  // no standby
  EXPECT_FALSE(standby_awaited(s, t0, 2s));
}

}  // namespace
}  // namespace fedwan::aggregator
