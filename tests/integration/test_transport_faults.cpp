// Network faults on a whole federation run as threads over the in-process
// transport (mem://, mutual TLS on), injected by the transport decorator
// (harness/faulty_transport.hpp): lost anchor and delta chunks, a region cut
// off and healed, slow and duplicating links. Each fault is one rule on the
// frames its header names, so the test says exactly what was lost, and the
// counters prove it was. Whatever the fault, the federation must finish with
// the in-process reference's result bit for bit: recovery resends or
// resyncs, and counts nothing twice.
//
// The chaos suite (test_chaos.cpp) keeps the real-process scenarios behind a
// real-socket proxy, and test_capture.cpp what an observer of the wire sees.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness/faulty_transport.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/reference_federation.hpp"

namespace fedwan::testing {
namespace {

using namespace std::chrono_literals;
using wire::MsgType;

constexpr uint64_t kSeed = 13;
constexpr uint64_t kRounds = 5;

// Short heartbeats: lost frames are noticed within about a second.
FederationSpec spec(const std::string& codec) {
  FederationSpec f;
  f.rounds = kRounds;
  f.inner_steps = 3;
  f.codec = codec;
  f.chunk_bytes = 4096;  // 5 chunks
  f.outer.name = "diloco";
  // Longer than the partition below; also how long the root waits at the end
  // for the traffic reports of a region that missed rounds.
  f.round_timeout_s = 8;
  f.heartbeat_s = 0.2;
  f.heartbeat_timeout_s = 1;
  return f;
}

// Frames of `round`, chunk `chunk`.
FaultRule::Predicate chunk_of(uint64_t round, uint32_t chunk) {
  return [=](const uint8_t* d, size_t n) {
    const std::optional<wire::FrameHeader> h = frame_header(d, n);
    return h && h->round == round && h->chunk_index == chunk;
  };
}

// A site or region resynced by its parent starts over from the anchor in
// full with its error-feedback residual cleared (site_core.cpp, on_anchor),
// which a lossy codec's reference does not do: the tests whose fault ends in
// a resync and that compare with the reference run fp32, whose residual is
// always zero; the others fp16.
class TransportFaults : public ::testing::Test {
 protected:
  void use_codec(const std::string& codec) {
    topo_ = make_tree(dir_.path(), 2, 2, spec(codec), /*in_process=*/true);
  }

  // Runs the federation: every round, every site ending with the same model.
  FederationRun run() {
    FederationRun run = run_threads(topo_, init_, kSeed, 8, setup_);
    EXPECT_TRUE(run.errors.empty()) << run.error_text();
    EXPECT_EQ(run.root.reports.size(), kRounds);
    EXPECT_FALSE(bit_equal(run.root.global_model, init_));
    for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, run.site_models[0]));
    return run;
  }

  // The same, and the result is the reference's bit for bit.
  FederationRun run_and_compare() {
    FederationRun run = this->run();
    const ReferenceResult ref =
        run_reference(topo_, init_, [this](uint32_t site, uint64_t, std::vector<float>& p) {
          synthetic::local_steps(p.data(), p.size(), site, topo_.federation().inner_steps, kSeed);
        });
    EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
    for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, ref.held));
    return run;
  }

  // Drops chunk 3 of site-3's update in `round` once; it must be sent again.
  void lose_a_delta_chunk(uint64_t round);

  uint64_t region_rejoins(const FederationRun& run) {
    uint64_t n = 0;
    for (const AggregatorSummary& r : run.regions) n += r.rejoins;
    return n;
  }

  const std::string& endpoint(const std::string& id) { return topo_.node(id).endpoint; }

  TempDir dir_;
  Topology topo_ = make_tree(dir_.path(), 2, 2, spec("fp16"), /*in_process=*/true);
  std::vector<float> init_ = synthetic::initial_model(5000, kSeed);
  SiteSetup setup_;
  ScopedTransportFaults faults_;
};

// site-0 starts with an empty checkpoint directory, so before it joins it
// asks region-0 for the replica region-0 may keep of it. The first handshake
// message region-0 sends it is lost: nothing fails and nothing more comes.
// The site must give that session up once it has not come up within a
// heartbeat timeout and start a new one. It used to wait for an answer
// until its join timeout, and the whole federation with it (the chaos
// suite's lossy link found this under load).
TEST_F(TransportFaults, AHandshakeLostWhileFetchingAReplicaStartsANewSession) {
  const auto rule = faults_->add(FaultRule::drop()
                                     .of_type(MsgType::kHandshake)
                                     .on(endpoint("region-0"), "site-0")
                                     .down()
                                     .first(1));
  TempDir checkpoints;
  SiteSetup setup;
  setup.options = [&](SiteOptions& o, size_t, std::vector<float>&) {
    if (o.node_id == "site-0") o.checkpoint_dir = (checkpoints.path() / "site-0").string();
  };
  const FederationRun run = run_threads(topo_, init_, kSeed, 8, setup);
  EXPECT_TRUE(run.errors.empty()) << run.error_text();
  EXPECT_EQ(faults_->hits(rule), 1u);
  EXPECT_EQ(run.root.reports.size(), kRounds);
  for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, run.site_models[0]));
}

// Drops every hello from `site` to its parent after its first, up to `n`.
FaultRule hellos_after_the_first(const std::string& parent_endpoint, const std::string& site,
                                 uint64_t n) {
  auto seen = std::make_shared<std::atomic<int>>(0);
  FaultRule r = FaultRule::drop();
  r.on(parent_endpoint, site).up().of_type(MsgType::kHello).where([seen](const uint8_t*, size_t) {
    return seen->fetch_add(1) >= 1;
  });
  r.first(n);
  return r;
}

// region-1's children joined, but its parent's welcome takes longer than a
// heartbeat timeout to come (the first two are lost), and the hellos its
// children say again meanwhile are lost too: until their own welcome they
// send nothing else. region-1 used to judge them by that silence, lose both
// before its first round, take them back as newcomers counting from round 1,
// and fail ("round 0 can never close"): under load the same happened
// whenever a sibling region joined the root more than a heartbeat timeout
// later (the stress run found it).
TEST_F(TransportFaults, ARegionWelcomedLateKeepsTheChildrenWaitingForIt) {
  const auto welcomes = faults_->add(FaultRule::drop()
                                         .on(endpoint("root"), "region-1")
                                         .down()
                                         .of_type(MsgType::kWelcome)
                                         .first(2));
  const auto site2 = faults_->add(hellos_after_the_first(endpoint("region-1"), "site-2", 3));
  const auto site3 = faults_->add(hellos_after_the_first(endpoint("region-1"), "site-3", 3));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(welcomes), 2u);
  EXPECT_GE(faults_->hits(site2) + faults_->hits(site3), 1u);
  for (const AggregatorSummary& r : run.regions) EXPECT_EQ(r.children_lost, 0u);
}

// A site misses one chunk of an anchor: it notices from its parent's
// heartbeats, rejoins and is resynced with the anchor in full.
TEST_F(TransportFaults, ALostAnchorChunkResyncsTheSite) {
  use_codec("fp32");
  const auto rule = faults_->add(FaultRule::drop()
                                     .of_type(MsgType::kAnchor)
                                     .on(endpoint("region-0"), "site-0")
                                     .where(chunk_of(2, 1))
                                     .first(1));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(rule), 1u);
  EXPECT_GE(region_rejoins(run), 1u) << "site-0 should have rejoined to be resynced";
}

// A delta chunk lost on the way up: the parent's heartbeats say the round
// still lacks that chunk of the site's update and receives nothing more, and
// the site sends that chunk again, and only it.
void TransportFaults::lose_a_delta_chunk(uint64_t round) {
  const auto rule = faults_->add(FaultRule::drop()
                                     .of_type(MsgType::kDelta)
                                     .on(endpoint("region-1"), "site-3")
                                     .where(chunk_of(round, 3))
                                     .first(1));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(rule), 1u);
  EXPECT_EQ(region_rejoins(run), 0u) << "a resend needs no rejoin";
  // One fp16 chunk of 1024 values, sealed: 2 KiB and a header, not five.
  EXPECT_GE(run.site_bytes_resent[3], 2048u);
  EXPECT_LT(run.site_bytes_resent[3], 2 * 2048u);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(run.site_bytes_resent[s], 0u) << "site " << s;
}

TEST_F(TransportFaults, ALostDeltaChunkIsSentAgain) { lose_a_delta_chunk(1); }

// The same with the update's frames kept on disk and the anchor in a
// mapped file (SiteOptions::page_out_from_bytes), as a large model's are:
// the chunk sent again is read back from the file, and only it goes.
TEST_F(TransportFaults, ALostDeltaChunkIsSentAgainFromDisk) {
  setup_.options = [](SiteOptions& o, size_t, std::vector<float>&) { o.page_out_from_bytes = 0; };
  lose_a_delta_chunk(2);
}

// A region's aggregate chunk lost on the way to the root: the region sends
// that chunk again (from the copies it keeps until the next anchor).
TEST_F(TransportFaults, ALostAggregateChunkIsSentAgainAlone) {
  const auto rule = faults_->add(FaultRule::drop()
                                     .of_type(MsgType::kDelta)
                                     .on(endpoint("root"), "region-1")
                                     .where(chunk_of(2, 1))
                                     .first(1));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(rule), 1u);
  uint64_t resent = 0;
  for (const AggregatorSummary& r : run.regions) resent += r.resent_chunks;
  EXPECT_EQ(resent, 1u) << "region-1 sends the lost chunk, and nothing else goes again";
  EXPECT_EQ(region_rejoins(run) + run.root.rejoins, 0u) << "a resend needs no rejoin";
}

// A slow link that still delivers loses nothing: site-0's update of round 1
// arrives a chunk every 400 ms, the whole of it 2 s after it went out (twice
// the heartbeat timeout). The parent's heartbeats show its count growing, so
// nothing is sent again (it used to be, in full, a heartbeat timeout after
// the site handed its update over).
TEST_F(TransportFaults, ASlowLinkThatStillDeliversIsNotSentAgain) {
  std::vector<FaultInjector::RuleId> rules;
  for (uint32_t c = 0; c < 5; ++c) {
    rules.push_back(faults_->add(FaultRule::delay_by(Millis(400 * (c + 1)))
                                     .of_type(MsgType::kDelta)
                                     .on(endpoint("region-0"), "site-0")
                                     .where(chunk_of(1, c))
                                     .first(1)));
  }
  const FederationRun run = run_and_compare();
  for (FaultInjector::RuleId r : rules) EXPECT_EQ(faults_->hits(r), 1u);
  for (size_t s = 0; s < run.site_bytes_resent.size(); ++s) {
    EXPECT_EQ(run.site_bytes_resent[s], 0u) << "site " << s;
  }
  for (const AggregatorSummary& r : run.regions) EXPECT_EQ(r.resent_chunks, 0u);
}

// region-0 is cut off from the root and from its sites for three heartbeat
// timeouts, from the moment the first chunk of round 2's anchor reaches it.
// The root declares it lost and the open round goes on without it (so the
// result is not the reference's: a round closed without region-0's weight);
// after the heal region-0 rejoins, is resynced with its sites, and the
// federation finishes every round with every site holding one model.
TEST_F(TransportFaults, ARegionPartitionedThenHealedRejoins) {
  const auto anchor_2 = faults_->add(FaultRule::observe()
                                         .of_type(MsgType::kAnchor)
                                         .on(endpoint("root"), "region-0")
                                         .where(chunk_of(2, 0))
                                         .first(1));
  std::atomic<bool> done{false};
  std::thread cutter([&] {
    while (faults_->hits(anchor_2) == 0 && !done) std::this_thread::sleep_for(1ms);
    if (done) return;
    faults_->partition(endpoint("root"), "region-0");
    faults_->partition(endpoint("region-0"));
    std::this_thread::sleep_for(3 * 1s);
    faults_->heal_all();
  });
  const FederationRun run = this->run();
  done = true;
  cutter.join();
  ASSERT_EQ(faults_->hits(anchor_2), 1u);
  EXPECT_GT(faults_->stats().partitioned, 0u);
  EXPECT_GE(run.root.children_lost, 1u) << "the root should have declared region-0 lost";
  EXPECT_GE(run.root.rejoins, 1u);
}

// site-1 is cut off from region-0 for good in round 1: region-0 loses it,
// and with quorum 1 the round needs its weight. The round waits for it to
// rejoin, up to the round timeout, and says so: the region's "still waiting
// for" names the lost member and why, never nobody (it named no one while
// every child it still expected had delivered).
TEST_F(TransportFaults, ARoundBlockedOnALostMembersWeightNamesIt) {
  FederationSpec f = spec("fp32");
  f.round_timeout_s = 4;
  topo_ = make_tree(dir_.path(), 2, 2, f, /*in_process=*/true);
  const auto anchor_1 = faults_->add(FaultRule::observe()
                                         .of_type(MsgType::kAnchor)
                                         .on(endpoint("region-0"), "site-1")
                                         .where(chunk_of(1, 0))
                                         .first(1));
  std::atomic<bool> done{false};
  std::thread cutter([&] {
    while (faults_->hits(anchor_1) == 0 && !done) std::this_thread::sleep_for(1ms);
    if (!done) faults_->partition(endpoint("region-0"), "site-1");
  });
  const FederationRun run = run_threads(topo_, init_, kSeed);
  done = true;
  cutter.join();
  ASSERT_EQ(faults_->hits(anchor_1), 1u);
  bool named = false;
  for (const std::string& e : run.errors) {
    if (e.find("aggregator 'region-0'") == std::string::npos) continue;
    EXPECT_NE(e.find("still waiting for: site-1 (lost; its weight is needed for quorum 1)"),
              std::string::npos)
        << e;
    named = true;
  }
  EXPECT_TRUE(named) << run.error_text();
}

// Links striped over 3 connections: one anchor frame from region-0 to
// site-1 is lost on one of them, so site-1's link stops being one ordered
// link (the chaos suite saw this after a region restart, from a connection
// taken over). site-1 must reconnect and rejoin. With heartbeats every 10 ms
// one is always due right after the link failed: a heartbeat sent on the
// broken link must not throw out of the site's loop (it killed the site, and
// its region then waited for it for ever). Which connection carries which
// frame depends on the heartbeats sent in between (frames go round the
// connections in turn), so the first round-2 anchor frame is lost on
// whichever connection it takes: a rule on one fixed connection may see none
// (it did, once in a stress run, with two heartbeats between anchor frames).
TEST_F(TransportFaults, AFrameLostOnAStripedLinkMakesTheSiteReconnectNotDie) {
  FederationSpec f = spec("fp32");
  f.streams = 3;
  f.heartbeat_s = 0.01;
  topo_ = make_tree(dir_.path(), 2, 2, f, /*in_process=*/true);
  auto taken = std::make_shared<std::atomic<bool>>(false);
  std::vector<FaultInjector::RuleId> lost;
  for (const char* connection : {"site-1", "site-1~1", "site-1~2"}) {
    lost.push_back(faults_->add(FaultRule::drop()
                                    .of_type(MsgType::kAnchor)
                                    .on(endpoint("region-0"), connection)
                                    .down()
                                    .where([taken](const uint8_t* d, size_t n) {
                                      const auto h = frame_header(d, n);
                                      return h && h->round == 2 && !taken->exchange(true);
                                    })
                                    .first(1)));
  }
  run_and_compare();
  uint64_t hits = 0;
  for (FaultInjector::RuleId id : lost) hits += faults_->hits(id);
  EXPECT_EQ(hits, 1u);
}

// The last chunk (4 of 5) of the final anchor (round kRounds), once, on its
// way from `parent_endpoint` to `child`.
FaultRule final_anchors_last_chunk(const std::string& parent_endpoint, const std::string& child) {
  return FaultRule::drop()
      .of_type(MsgType::kAnchor)
      .on(parent_endpoint, child)
      .down()
      .where(chunk_of(kRounds, 4))
      .first(1);
}

// The same chunk 300 ms late, passed by what its parent sends next (the
// kDone): the order of a striped link whose one connection recovers a loss.
FaultRule final_anchors_last_chunk_late(const std::string& parent_endpoint,
                                        const std::string& child) {
  FaultRule r = final_anchors_last_chunk(parent_endpoint, child);
  r.action = FaultRule::Action::kDelay;
  r.delay = 300ms;
  r.keep_order = false;
  return r;
}

// The end of the federation over a lossy link. The last chunk of the final
// anchor (round 5) is lost on its way to site-0, and the parent's kDone
// comes right behind it: the site used to take the kDone as "the federation
// ended instead" and finish with a model mixing the final anchor's first
// chunks with the round before's last one, and confirm it (a silent wrong
// answer). It must rejoin and be handed the final model in full.
TEST_F(TransportFaults, TheFinalAnchorsLastChunkLostToASiteIsHandedOverInFull) {
  use_codec("fp32");
  const auto lost = faults_->add(final_anchors_last_chunk(endpoint("region-0"), "site-0"));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(lost), 1u);
  EXPECT_GE(region_rejoins(run), 1u) << "site-0 should have rejoined for the final model";
}

// The same chunk lost, and every kDone to site-0 with it: region-0's
// heartbeats used to say round 4 while it drained (a region opens no round
// after the last), so the site never saw its parent ahead, never rejoined,
// and timed out once region-0 had given up on its confirmation. A draining
// parent's heartbeats carry the final round, so the site's stalled anchor
// is noticed and it rejoins.
TEST_F(TransportFaults, TheFinalAnchorsLastChunkAndEveryEndLostToASite) {
  use_codec("fp32");
  const auto lost = faults_->add(final_anchors_last_chunk(endpoint("region-0"), "site-0"));
  const auto ends = faults_->add(
      FaultRule::drop().of_type(MsgType::kDone).on(endpoint("region-0"), "site-0").down());
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(lost), 1u);
  EXPECT_GE(faults_->hits(ends), 1u);
  EXPECT_GE(region_rejoins(run), 1u) << "site-0 should have rejoined for the final model";
}

// The last chunk of the final anchor lost on its way to region-0, which then
// gets the root's kDone: it used to pass the end on to its sites, both of
// which finished on an anchor one chunk short. It must rejoin the root for
// the final model in full and hand it down before it passes the end on.
TEST_F(TransportFaults, TheFinalAnchorsLastChunkLostToARegionIsHandedOverInFull) {
  use_codec("fp32");
  const auto lost = faults_->add(final_anchors_last_chunk(endpoint("root"), "region-0"));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(lost), 1u);
  EXPECT_GE(run.root.rejoins, 1u) << "region-0 should have rejoined for the final model";
}

// The last chunk of the final anchor reaches region-0 after the root's
// kDone (on a striped link the end can overtake it while one connection
// recovers a loss): region-0 waits for it, then passes the end on. It used
// to rejoin at once and be sent the whole model again.
TEST_F(TransportFaults, TheEndOvertakingTheFinalAnchorsLastChunkIsWaitedFor) {
  use_codec("fp32");
  const auto late = faults_->add(final_anchors_last_chunk_late(endpoint("root"), "region-0"));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(late), 1u);
  EXPECT_EQ(run.root.rejoins, 0u) << "region-0 gets the chunk: no rejoin";
}

// The same between region-0 and site-0: the site waits for the chunk and
// finishes on the final model, with no rejoin.
TEST_F(TransportFaults, TheEndOvertakingTheFinalAnchorsLastChunkToASiteIsWaitedFor) {
  use_codec("fp32");
  const auto late = faults_->add(final_anchors_last_chunk_late(endpoint("region-0"), "site-0"));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(late), 1u);
  EXPECT_EQ(region_rejoins(run), 0u) << "site-0 gets the chunk: no rejoin";
}

// The root's first kDones to region-0 are lost, after the whole final
// anchor went through: the root says the end again while it waits for
// region-0's confirmation, and region-0, which holds the final model, needs
// no rejoin (it used to rejoin and be sent the whole model again).
TEST_F(TransportFaults, TheEndLostToARegionIsSaidAgain) {
  const auto ends = faults_->add(
      FaultRule::drop().of_type(MsgType::kDone).on(endpoint("root"), "region-0").down().first(3));
  const FederationRun run = run_and_compare();
  EXPECT_EQ(faults_->hits(ends), 3u);
  EXPECT_EQ(run.root.rejoins, 0u) << "region-0 holds the final model: no rejoin";
}

// Every frame between region-1 and the root, both ways, 30 ms late, and
// every delta duplicated: only time changes, and duplicates count once.
TEST_F(TransportFaults, SlowAndDuplicatingLinksChangeNothingButTime) {
  faults_->add(FaultRule::delay_by(30ms).on(endpoint("root"), "region-1"));
  const auto dup = faults_->add(FaultRule::duplicate().of_type(MsgType::kDelta));
  const FederationRun run = run_and_compare();
  const FaultStats st = faults_->stats();
  EXPECT_GT(st.delayed, 0u);
  EXPECT_EQ(st.duplicated, faults_->hits(dup));
  EXPECT_GE(st.duplicated, kRounds * 4 * 5) << "every site's and region's delta chunks";
}

// A root over sites adds each chunk of the next anchor to its anchor as it
// goes down, so mid-round its anchor is mixed. site-0 loses its link just
// as the first of those chunks comes (everything the root sends it is lost
// for 1.2 s) while site-1's last chunk of round 2 is lost until site-0 is
// welcomed back (site-1 sends it again then), so the root is still in
// round 2 with four chunks added when site-0 rejoins. Without a
// digest of the round's anchor taken before it moved (no checkpoints), the
// root cannot vouch for the anchor site-0 offers: it sends the mixed anchor
// in full and, for the chunks it holds already, updates that change
// nothing (fp32 -0.0, told apart from the round's fp16 frames by their
// codec), and site-0 ends with every other site's model bit for bit (its
// residual is cleared by the resync, so not the reference's); with
// checkpoints, it knows that digest and tells site-0 "no change" and sends
// the round's frames again, and the result is the reference's bit for bit.
class MidRoundRejoin : public TransportFaults, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    topo_ = make_tree(dir_.path(), 0, 2, spec("fp16"), /*in_process=*/true);
    if (GetParam()) {
      setup_.aggregator = [dir = dir_.path()](AggregatorOptions& o) {
        o.checkpoint_dir = (dir / ("ckpt-" + o.node_id)).string();
      };
    }
  }
};

TEST_P(MidRoundRejoin, ASiteWelcomedWhileTheAnchorIsMixedEndsWithTheReference) {
  const bool checkpoints = GetParam();
  // Everything the root sends site-0 for 1.2 s from the first chunk of
  // round 3's anchor on (the predicate runs under the injector's lock).
  auto since = std::make_shared<std::optional<std::chrono::steady_clock::time_point>>();
  const auto cut =
      faults_->add(FaultRule::drop()
                       .on(endpoint("root"), "site-0")
                       .down()
                       .where([since](const uint8_t* d, size_t n) {
                         const auto now = std::chrono::steady_clock::now();
                         const std::optional<wire::FrameHeader> h = frame_header(d, n);
                         if (!*since && h && h->type == MsgType::kAnchor && h->round == 3 &&
                             (h->flags & wire::kFlagFullAnchor) == 0) {
                           *since = now;
                         }
                         return *since && now - **since < 1200ms;
                       }));
  // site-0's welcome once the cut began; until it, every copy of site-1's
  // last chunk of round 2 is lost.
  auto welcomed = std::make_shared<bool>(false);
  faults_->add(FaultRule::observe()
                   .of_type(MsgType::kWelcome)
                   .on(endpoint("root"), "site-0")
                   .down()
                   .where([since, welcomed](const uint8_t*, size_t) {
                     if (*since) *welcomed = true;
                     return true;
                   }));
  const auto late =
      faults_->add(FaultRule::drop()
                       .of_type(MsgType::kDelta)
                       .on(endpoint("root"), "site-1")
                       .up()
                       .where(chunk_of(2, 4))
                       .where([welcomed](const uint8_t*, size_t) { return !*welcomed; }));
  // What reaches site-0 of round 3's anchor as updates that change nothing.
  const auto unchanged =
      faults_->add(FaultRule::observe()
                       .of_type(MsgType::kAnchor)
                       .on(endpoint("root"), "site-0")
                       .down()
                       .where([](const uint8_t* d, size_t n) {
                         const std::optional<wire::FrameHeader> h = frame_header(d, n);
                         return h && h->round == 3 && (h->flags & wire::kFlagFullAnchor) == 0 &&
                                h->codec == static_cast<uint8_t>(CodecId::kFp32);
                       }));
  const FederationRun run = checkpoints ? run_and_compare() : this->run();
  EXPECT_GT(faults_->hits(cut), 0u);
  EXPECT_GE(faults_->hits(late), 1u);
  EXPECT_GE(run.root.rejoins, 1u) << "site-0 should have rejoined mid-round";
  if (checkpoints) {
    EXPECT_EQ(faults_->hits(unchanged), 0u) << "the round's anchor was vouched for";
  } else {
    // Chunks 0-3 of the next anchor were in the anchor sent in full.
    EXPECT_EQ(faults_->hits(unchanged), 4u);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, MidRoundRejoin, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("WithCheckpoints")
                                          : std::string("WithoutCheckpoints");
                         });

}  // namespace
}  // namespace fedwan::testing
