// The root paces its sites' updates (docs/protocol.md, "Pacing"), every
// node a thread over ipc:// sockets with mutual TLS: a root over two sites,
// a 48-chunk fp16 model, the round's mean kept in memory for 12 chunks
// beyond which chunks waiting for their last copy go to disk.
//
//  * site-1 starts each update 1.5 s after site-0. Unpaced, site-0's update
//    runs ahead and most of its chunks wait on disk; paced, it runs at
//    most the window (12 chunks) ahead and none does. The global model is
//    the same bit for bit.
//  * site-1 stops after the first round. site-0, held back by it, is let
//    go once the root judges site-1 lost, and the federation ends with
//    site-0 alone (quorum 0.4).
//  * site-1 is 5 s late in round 1, with a 1 s deadline: site-0, held back
//    until the deadline, sends the rest then, and each of its chunks
//    closes with the quorum as it comes; site-1's update is stale.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 5;
constexpr size_t kChunkElements = 1u << 18;  // 1 MiB of fp32
constexpr size_t kParams = 48 * kChunkElements;
constexpr uint64_t kSteps = 2;

FederationSpec pacing_spec(uint64_t rounds) {
  FederationSpec f;
  f.rounds = rounds;
  f.inner_steps = kSteps;
  f.codec = "fp16";
  f.chunk_bytes = kChunkElements * sizeof(float);
  f.outer.name = "diloco";
  f.round_timeout_s = 60;
  return f;
}

// Three rounds where site-0 (100 of 237) alone closes a round, heartbeats
// every 0.2 s.
FederationSpec laggard_spec(double heartbeat_timeout_s, double deadline_s = 0) {
  FederationSpec f = pacing_spec(3);
  f.quorum = 0.4;
  f.deadline_s = deadline_s;
  f.heartbeat_s = 0.2;
  f.heartbeat_timeout_s = heartbeat_timeout_s;
  return f;
}

struct PacedRun {
  AggregatorSummary root;
  std::vector<uint64_t> rounds_done = {0, 0};
  std::string errors;
};

// site-1's part: it starts its update `late` after its anchor came (in
// every round, or in `late_round` alone), and leaves (its node destroyed)
// after `stop_after` rounds.
struct Laggard {
  std::chrono::milliseconds late{0};
  uint64_t late_round = UINT64_MAX;
  uint64_t stop_after = UINT64_MAX;
};

PacedRun run(const Topology& topo, bool paced, const Laggard& lag) {
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  PacedRun out;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &out.root, [paced](AggregatorOptions& o) {
    o.spill_from_bytes = 1;  // chunks beyond the in-flight budget go to disk
    o.pace_uploads = paced;
  });
  for (int s = 0; s < 2; ++s) {
    const std::string id = "site-" + std::to_string(s);
    nodes.spawn(id, [&, s, id](NodeStopper& stopper) {
      std::vector<float> params = init;
      SiteCore site(site_options(topo, id, std::chrono::seconds(60)), params.data(), params.size());
      const auto bound = stopper.bind([&site] { site.stop(); });
      SyncResult r = site.join();
      while (!r.finished) {
        if (s == 1 && out.rounds_done[1] >= lag.stop_after) return;
        synthetic::local_steps(params.data(), params.size(), topo.node(id).index, kSteps, kSeed);
        if (s == 1 && (lag.late_round == UINT64_MAX || lag.late_round == site.round())) {
          std::this_thread::sleep_for(lag.late);
        }
        r = site.sync();
        out.rounds_done[s] += 1;
      }
    });
  }
  nodes.join();
  out.errors = nodes.errors();
  return out;
}

TEST(Pacing, ASiteRunningAheadWaitsForTheOtherInsteadOfTheRootsDisk) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, pacing_spec(3));
  const Laggard lag{std::chrono::milliseconds(1500)};
  const PacedRun unpaced = run(topo, false, lag);
  ASSERT_EQ(unpaced.errors, "");
  const PacedRun paced = run(topo, true, lag);
  ASSERT_EQ(paced.errors, "");
  // Unpaced, all but the 12 chunks the budget holds of site-0's update
  // waited on disk each round.
  EXPECT_GE(unpaced.root.chunks_parked, 3u * 24);
  EXPECT_EQ(paced.root.chunks_parked, 0u);
  EXPECT_EQ(paced.root.parked_bytes, 0u);
  EXPECT_TRUE(bit_equal(paced.root.global_model, unpaced.root.global_model));
  EXPECT_EQ(paced.root.children_lost, 0u);
}

TEST(Pacing, ASiteThatStopsHoldsTheOtherBackOnlyUntilItIsLost) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, laggard_spec(/*heartbeat_timeout_s=*/2));
  Laggard lag;
  lag.stop_after = 1;
  const PacedRun r = run(topo, true, lag);
  ASSERT_EQ(r.errors, "");
  EXPECT_EQ(r.rounds_done[0], 3u);
  EXPECT_EQ(r.rounds_done[1], 1u);
  // site-1 in round 1; site-0, silent once it confirmed the end while the
  // root waits for site-1 to, is not lost.
  EXPECT_EQ(r.root.children_lost, 1u);
  EXPECT_EQ(r.root.reports.size(), 3u);
}

TEST(Pacing, PastTheDeadlineTheSitesHeldBackCloseTheRoundWithoutTheLaggard) {
  TempDir dir;
  // site-1 is late, not lost.
  const Topology topo =
      make_tree(dir.path(), 0, 2, laggard_spec(/*heartbeat_timeout_s=*/20, /*deadline_s=*/1));
  Laggard lag;
  lag.late = std::chrono::milliseconds(5000);
  lag.late_round = 1;
  const PacedRun r = run(topo, true, lag);
  ASSERT_EQ(r.errors, "");
  EXPECT_EQ(r.rounds_done[0], 3u);
  EXPECT_EQ(r.rounds_done[1], 3u);
  // Round 1 closed on site-0's chunks, those sent after the deadline too:
  // site-1's came after it and counted nothing.
  EXPECT_GE(r.root.stale_updates, 1u);
  ASSERT_EQ(r.root.reports.size(), 3u);
}

}  // namespace
}  // namespace fedwan::testing
