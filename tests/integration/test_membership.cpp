// Elastic membership with every node as a thread over loopback TCP and
// mutual TLS, five sites under the root or under one region below it, with
// quorum 1.0 and no deadline, so that any child the federation waited for in
// vain would hang the round until its timeout:
//
//  * site-4 is late_join: the federation starts without it; it is started
//    once the root works on round kJoinRound and counts from the next one.
//  * site-2 leaves gracefully when it reaches round kLeaveRound: no round
//    waits for it (no child lost, no deadline), the quorum follows.
//  * site-3 has a participation window that closes for a while: it pauses
//    (announced), is not waited for, and resumes with a resync.
//
// The root's model is checked against the replay of its audit log over the
// recorded payloads: nothing lost, nothing counted twice.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "harness/audit_replay.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/process.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kSeed = 17;
constexpr size_t kParams = 3000;       // 3 chunks
constexpr uint64_t kRounds = 12;       // the late/leave scenario
constexpr uint64_t kPauseRounds = 16;  // the window scenario
constexpr uint64_t kJoinRound = 5;     // site-4 is started while the root is in this round
constexpr uint64_t kLeaveRound = 8;    // site-2 leaves when it reaches this round

FederationSpec membership_spec(uint64_t rounds) { return every_member_federation(rounds, 20); }

// "HH:MM:SS" of a UTC time.
std::string clock_text(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}

struct Scenario {
  uint64_t rounds = kRounds;
  bool late_site = false;  // site-4 late_join, started in round kJoinRound
  bool leaver = false;     // site-2 leaves at kLeaveRound
  // site-3's window closes `pause_after` from the start, for `pause_for`.
  std::optional<std::pair<std::chrono::seconds, std::chrono::seconds>> pause;
  milliseconds step_time{0};  // each round's training takes this long
};

class MembershipFederation {
 public:
  MembershipFederation(int regions, const Scenario& sc) : sc_(sc) {
    const FederationSpec spec = membership_spec(sc.rounds);
    std::vector<NodeSpec> nodes = make_tree(dir_.path(), regions, 5, spec).nodes();
    start_ = std::time(nullptr);
    for (NodeSpec& n : nodes) {
      if (n.role != Role::kSite) {
        n.endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
        n.bind = n.endpoint;
      }
      if (n.id == "site-4" && sc.late_site) n.late_join = true;
      if (n.id == "site-3" && sc.pause) {
        // One window that wraps past midnight: open from the pause's end
        // round to its start, i.e. closed for [start, end).
        const std::time_t from = start_ + sc.pause->first.count();
        const std::time_t to = from + sc.pause->second.count();
        n.windows = {clock_text(to) + "-" + clock_text(from)};
      }
    }
    topo_ = Topology::build("membership-test", spec, nodes);
    init_ = synthetic::initial_model(kParams, kSeed);
    (void)security_for(topo_, "root");  // credentials now, not on the window's clock
  }

  const Topology& topo() const { return topo_; }
  const std::vector<float>& init() const { return init_; }
  fs::path audit(const std::string& node) const { return dir_.path() / (node + ".audit"); }
  fs::path store() const { return dir_.path() / "updates"; }

  void run() {
    NodeSpawner nodes;
    for (const NodeSpec& n : topo_.nodes()) {
      if (n.role == Role::kSite) continue;
      spawn_aggregator(nodes, topo_, n.id, init_, &summaries_[n.id],
                       [this, id = n.id](AggregatorOptions& o) { replayable(o, id); });
    }
    for (const NodeSpec& n : topo_.nodes()) {
      if (n.role != Role::kSite) continue;
      nodes.spawn(n.id, [this, id = n.id, index = n.index](NodeStopper& stopper) {
        if (id == "site-4" && sc_.late_site) {
          // Started while the root works on kJoinRound.
          const auto give_up = Clock::now() + std::chrono::seconds(60);
          while (committed() < kJoinRound && Clock::now() < give_up) {
            std::this_thread::sleep_for(milliseconds(10));
          }
          std::lock_guard<std::mutex> lock(mu_);
          started_at_round_[id] = committed_;
        }
        std::vector<float> params = init_;
        SiteOptions o = site_options(topo_, id, std::chrono::seconds(20));
        o.security.audit_log = audit(id).string();
        SiteCore site(std::move(o), params.data(), params.size());
        const auto bound = stopper.bind([&site] { site.stop(); });
        SyncResult r = site.join();
        double paused = r.paused_seconds;
        bool left = false;
        while (!r.finished) {
          if (id == "site-2" && sc_.leaver && site.round() >= kLeaveRound) {
            left = site.leave();
            break;
          }
          synthetic::local_steps(params.data(), params.size(), index,
                                 topo_.federation().inner_steps, kSeed);
          std::this_thread::sleep_for(sc_.step_time);
          r = site.sync();
          paused += r.paused_seconds;
        }
        std::lock_guard<std::mutex> lock(mu_);
        site_rounds_[id] = site.round();
        site_models_[id] = params;
        paused_[id] = paused;
        if (left) left_.push_back(id);
      });
    }
    nodes.join();
    std::lock_guard<std::mutex> lock(mu_);
    errors_ += nodes.errors();
  }

  uint64_t committed() {
    std::lock_guard<std::mutex> lock(mu_);
    return committed_;
  }
  // Audited, and the root's accepted payloads recorded, for the replay.
  void replayable(AggregatorOptions& o, const std::string& id) {
    o.join_timeout = std::chrono::seconds(20);
    o.security.audit_log = audit(id).string();
    if (o.node_id != topo_.root().id) return;
    o.record_updates_dir = store().string();
    o.on_model = [this](uint64_t round, const std::vector<float>&) {
      std::lock_guard<std::mutex> lock(mu_);
      committed_ = round + 1;
    };
  }
  std::string errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  // Valid once run() returned.
  const AggregatorSummary& summary(const std::string& id) { return summaries_.at(id); }
  std::map<std::string, uint64_t> site_rounds_, started_at_round_;
  std::map<std::string, std::vector<float>> site_models_;
  std::map<std::string, double> paused_;
  std::vector<std::string> left_;

 private:
  Scenario sc_;
  TempDir dir_;
  Topology topo_;
  std::time_t start_ = 0;
  std::vector<float> init_;
  std::mutex mu_;
  uint64_t committed_ = 0;
  std::string errors_;
  std::map<std::string, AggregatorSummary> summaries_;
};

// The sites' parent (root or region-0).
std::string parent_of_sites(int regions) { return regions == 0 ? "root" : "region-0"; }

// Nothing waited for in vain and the root's model is its audit's replay.
ReplayResult expect_clean_run(MembershipFederation& fed, int regions) {
  EXPECT_EQ(fed.errors(), "");
  const std::string parent = parent_of_sites(regions);
  EXPECT_EQ(fed.summary(parent).children_lost, 0u) << "a child was waited for until lost";
  EXPECT_TRUE(audit_events(fed.audit(parent), "deadline").empty());
  EXPECT_TRUE(audit_events(fed.audit(parent), "child_lost").empty());
  const ReplayResult replay =
      replay_root_audit(fed.topo(), fed.init(), fed.audit("root"), fed.store());
  std::string problems;
  for (const std::string& p : replay.problems) problems += p + "\n";
  EXPECT_TRUE(replay.problems.empty()) << problems;
  EXPECT_EQ(replay.rounds_committed, fed.topo().federation().rounds);
  EXPECT_TRUE(bit_equal(replay.global, fed.summary("root").global_model))
      << "the root's model is not what its audit log says it accepted";
  return replay;
}

// Chunks the sites' parent accepted from `site` in `round`.
int accepted(MembershipFederation& fed, int regions, const std::string& site, uint64_t round) {
  int n = 0;
  for (const AuditEntry& e : settled_updates(fed.audit(parent_of_sites(regions)))) {
    if (e.fields.value("sender", "") == site && e.fields.value("round", uint64_t{0}) == round &&
        e.fields.value("decision", "") == "accepted")
      ++n;
  }
  return n;
}

class Membership : public ::testing::TestWithParam<int> {};  // regions between root and sites

TEST_P(Membership, LateSiteCountsFromTheNextRoundAndALeaverCostsNoWait) {
  const int regions = GetParam();
  Scenario sc;
  sc.late_site = true;
  sc.leaver = true;
  sc.step_time = milliseconds(50);
  MembershipFederation fed(regions, sc);
  fed.run();
  ASSERT_EQ(fed.errors(), "");
  expect_clean_run(fed, regions);
  const uint32_t chunks = 3;
  const uint64_t started = fed.started_at_round_.at("site-4");
  ASSERT_GE(started, kJoinRound);
  // Its parent admitted it in the round its hello came in, to count from
  // the next boundary.
  const std::string parent = parent_of_sites(regions);
  const auto joining = audit_events(fed.audit(parent), "member_joining");
  ASSERT_EQ(joining.size(), 1u);
  EXPECT_EQ(joining[0].fields.value("peer", ""), "site-4");
  const uint64_t from = joining[0].fields.value("counts_from_round", uint64_t{0});
  EXPECT_GE(from, regions == 0 ? started + 1 : started);
  ASSERT_LT(from, kRounds) << "the run was too fast for the late site to take part";
  for (uint64_t r = 0; r < kRounds; ++r) {
    // site-4: nothing before the round after the one it came in, then every round.
    EXPECT_EQ(accepted(fed, regions, "site-4", r), r >= from ? static_cast<int>(chunks) : 0)
        << "site-4, round " << r << " (started in round " << started << ")";
    // site-2: every round before it left, none after.
    EXPECT_EQ(accepted(fed, regions, "site-2", r), r < kLeaveRound ? static_cast<int>(chunks) : 0)
        << "site-2, round " << r;
    EXPECT_EQ(accepted(fed, regions, "site-0", r), static_cast<int>(chunks)) << r;
  }
  EXPECT_EQ(fed.left_, std::vector<std::string>{"site-2"}) << "site-2's leave was not told";
  EXPECT_EQ(fed.site_rounds_.at("site-2"), kLeaveRound);
  EXPECT_EQ(fed.site_rounds_.at("site-4"), kRounds);
  EXPECT_TRUE(bit_equal(fed.site_models_.at("site-4"), fed.site_models_.at("site-0")))
      << "the late site did not end with the federation's model";
  const auto left = audit_events(fed.audit(parent), "member_left");
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].fields.value("peer", ""), "site-2");
  EXPECT_EQ(left[0].fields.value("round", uint64_t{0}), kLeaveRound);
  bool joined = false;
  for (const AuditEntry& e : audit_events(fed.audit(parent), "member_joined")) {
    if (e.fields.value("peer", "") != "site-4") continue;
    joined = true;
    EXPECT_EQ(e.fields.value("round", uint64_t{0}), from);
  }
  EXPECT_TRUE(joined);
  if (regions > 0) {
    // The root's quorum followed the region's reported membership.
    EXPECT_FALSE(audit_events(fed.audit("root"), "membership").empty());
  }
}

TEST_P(Membership, SiteOutsideItsWindowPausesAndResumes) {
  const int regions = GetParam();
  Scenario sc;
  sc.rounds = kPauseRounds;
  sc.pause = std::make_pair(std::chrono::seconds(3), std::chrono::seconds(2));
  sc.step_time = milliseconds(400);  // 16 rounds take well over the 5 s the window needs
  MembershipFederation fed(regions, sc);
  fed.run();
  ASSERT_EQ(fed.errors(), "");
  const ReplayResult replay = expect_clean_run(fed, regions);
  (void)replay;
  const std::string parent = parent_of_sites(regions);
  const auto paused = audit_events(fed.audit(parent), "member_paused");
  ASSERT_EQ(paused.size(), 1u) << "site-3 should have paused once";
  EXPECT_EQ(paused[0].fields.value("peer", ""), "site-3");
  const uint64_t pause_round = paused[0].fields.value("round", uint64_t{0});
  // Back from the pause, welcomed at a later boundary.
  uint64_t back_round = 0;
  for (const AuditEntry& e : audit_events(fed.audit(parent), "member_joined")) {
    if (e.fields.value("peer", "") == "site-3" && e.fields.value("from", "") == "paused")
      back_round = e.fields.value("round", uint64_t{0});
  }
  ASSERT_GT(back_round, pause_round) << "site-3 did not come back";
  EXPECT_GE(fed.paused_.at("site-3"), 1.0);
  for (uint64_t r = pause_round; r < back_round; ++r) {
    EXPECT_EQ(accepted(fed, regions, "site-3", r), 0) << "site-3 counted while paused, round " << r;
  }
  EXPECT_GT(accepted(fed, regions, "site-3", back_round), 0) << "site-3 did not contribute again";
  EXPECT_EQ(fed.site_rounds_.at("site-3"), kPauseRounds);
  EXPECT_TRUE(bit_equal(fed.site_models_.at("site-3"), fed.site_models_.at("site-0")));
}

// Every site of region-1 leaves at round 2: the region has no member left
// and the root counts it with weight 0, but the region opens its next
// rounds all the same. It must wait for their anchors (relaying them to
// nobody) and finish with the federation, not fail its round ("can never
// close": nobody left to deliver) and take the federation down with it.
TEST(MembershipEmptyRegion, ARegionWhoseSitesAllLeftGoesOnWithoutThem) {
  TempDir dir;
  constexpr uint64_t kRoundsHere = 5;
  constexpr uint64_t kLeaveAt = 2;
  const Topology topo = make_tree(dir.path(), 2, 2, every_member_federation(kRoundsHere, 20));
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  std::map<std::string, AggregatorSummary> summaries;
  for (const NodeSpec& n : topo.nodes()) summaries[n.id];
  std::mutex mu;
  std::map<std::string, uint64_t> rounds;
  NodeSpawner nodes;
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role != Role::kSite) spawn_aggregator(nodes, topo, n.id, init, &summaries[n.id]);
  }
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role != Role::kSite) continue;
    nodes.spawn(n.id, [&, id = n.id, index = n.index](NodeStopper& stopper) {
      std::vector<float> params = init;
      SiteCore site(site_options(topo, id, std::chrono::seconds(20)), params.data(), params.size());
      const auto bound = stopper.bind([&site] { site.stop(); });
      SyncResult r = site.join();
      const bool leaver = id == "site-2" || id == "site-3";
      while (!r.finished) {
        if (leaver && site.round() >= kLeaveAt) {
          EXPECT_TRUE(site.leave()) << id << "'s leave was not told";
          break;
        }
        synthetic::local_steps(params.data(), params.size(), index, topo.federation().inner_steps,
                               kSeed);
        r = site.sync();
      }
      std::lock_guard<std::mutex> lock(mu);
      rounds[id] = site.round();
    });
  }
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");
  EXPECT_EQ(summaries.at("root").reports.size(), kRoundsHere);
  EXPECT_EQ(rounds.at("site-0"), kRoundsHere);
  EXPECT_EQ(rounds.at("site-1"), kRoundsHere);
  EXPECT_EQ(rounds.at("site-2"), kLeaveAt);
  EXPECT_EQ(rounds.at("site-3"), kLeaveAt);
  EXPECT_EQ(summaries.at("region-1").children_lost, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tree, Membership, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param == 0 ? std::string("SitesUnderRoot")
                                               : std::string("SitesUnderRegion");
                         });

}  // namespace
}  // namespace fedwan::testing
