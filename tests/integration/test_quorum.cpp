// Round deadlines and quorum with every node as a thread over loopback TCP
// and mutual TLS: three sites (weights 100, 137, 174) under the root, or
// under one region below it. site-0, the lightest, is late in one round.
//
//  * With quorum 0.6 the round closes at its deadline with the two others
//    (311 of 411), site-0's late update is audited "stale" and counts
//    nothing, and site-0 carries on from the next anchor to the end; also
//    when it is still training well after its round closed.
//  * The same with overlapped rounds (federation.overlap_steps).
//  * With quorum 1.0 the deadline passes and the round waits for site-0.
//  * Heartbeats: an update on its way is not sent again, and a heartbeat
//    due while a site uploads does not break its link.
//
// What the root's model is made of is checked by replaying its audit log
// over the payloads it recorded (harness/audit_replay.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fedwan/aggregator.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "harness/audit_replay.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/process.hpp"
#include "tensor/chunk_plan.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kSeed = 11;
constexpr size_t kParams = 3000;  // 3 chunks of 1024, 1024, 952
constexpr uint64_t kRounds = 4;
constexpr uint64_t kSlowRound = 1;
const std::string kSlowSite = "site-0";  // weight 100: the other two make 311 of 411

FederationSpec quorum_spec(double quorum, double deadline_s) {
  FederationSpec f;
  f.rounds = kRounds;
  f.inner_steps = 3;
  f.codec = "fp16";
  f.chunk_bytes = 4096;
  f.outer.name = "diloco";
  // A failing run (a site that died) ends in round timeouts: keep them short.
  f.round_timeout_s = 8;
  f.quorum = quorum;
  f.deadline_s = deadline_s;
  f.heartbeat_s = 0.2;
  f.heartbeat_timeout_s = 5;  // longer than site-0 is late: it is never declared lost
  return f;
}

std::vector<std::string> strings(const nlohmann::json& array) {
  std::vector<std::string> out;
  if (!array.is_array()) return {"<not an array: " + array.dump() + ">"};
  for (const auto& s : array) out.push_back(s.is_string() ? s.get<std::string>() : s.dump());
  return out;
}

// A federation over loopback TCP run as threads. A hook runs in a site's
// thread after its local training of a round, just before sync(): that is
// where a site is made late. It returns true when the site's parameters
// were replaced meanwhile (service() resynced it): the site trains again.
class QuorumFederation {
 public:
  using BeforeSync = std::function<bool(const std::string& site, uint64_t round, SiteCore&)>;

  QuorumFederation(int regions, const FederationSpec& fed, size_t params = kParams)
      : params_(params) {
    std::vector<NodeSpec> nodes = make_tree(dir_.path(), regions, 3, fed).nodes();
    for (NodeSpec& n : nodes) {
      if (n.role == Role::kSite) continue;
      n.endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
      n.bind = n.endpoint;
    }
    topo_ = Topology::build("quorum-test", fed, nodes);
    init_ = synthetic::initial_model(params_, kSeed);
    sites_parent_ = regions == 0 ? "root" : "region-0";
  }

  const Topology& topo() const { return topo_; }
  const std::vector<float>& init() const { return init_; }
  // The node site-0 delivers to: where its deadline and staleness show.
  const std::string& sites_parent() const { return sites_parent_; }
  fs::path audit(const std::string& node) const { return dir_.path() / (node + ".audit"); }
  fs::path store() const { return dir_.path() / "updates"; }
  uint32_t chunks() const {
    return tensor::ChunkPlan::from_bytes(params_, topo_.federation().chunk_bytes).count();
  }

  // Whether the root has committed `round` (its global model moved past it).
  bool committed(uint64_t round) {
    std::lock_guard<std::mutex> lock(mu_);
    return committed_ > round;
  }

  void run(const BeforeSync& before_sync) {
    NodeSpawner nodes;
    for (const NodeSpec& n : topo_.nodes()) {
      if (n.role == Role::kSite) continue;
      const bool is_root = n.role == Role::kRoot;
      spawn_aggregator(nodes, topo_, n.id, init_, is_root ? &root_ : &region_,
                       [this, id = n.id, is_root](AggregatorOptions& o) {
                         o.join_timeout = std::chrono::seconds(20);
                         o.security.audit_log = audit(id).string();
                         if (!is_root) return;
                         o.record_updates_dir = store().string();
                         o.on_model = [this](uint64_t round, const std::vector<float>&) {
                           std::lock_guard<std::mutex> lock(mu_);
                           committed_ = round + 1;
                         };
                       });
    }
    for (const NodeSpec& n : topo_.nodes()) {
      if (n.role != Role::kSite) continue;
      nodes.spawn(n.id, [this, &before_sync, id = n.id, index = n.index](NodeStopper& stopper) {
        std::vector<float> params = init_;
        SiteOptions o;
        o.topology = topo_;
        o.node_id = id;
        o.join_timeout = std::chrono::seconds(20);
        o.round_timeout = std::chrono::seconds(8);
        o.security = security_for(topo_, id);
        SiteCore site(std::move(o), params.data(), params.size());
        const auto bound = stopper.bind([&site] { site.stop(); });
        SyncResult r = site.join();
        const uint64_t steps = topo_.federation().inner_steps;
        const uint64_t tau = topo_.federation().overlap_steps;
        uint64_t done = 0;  // overlapped: steps of the round taken before the merge
        while (!r.finished) {
          do {
            synthetic::local_steps(params.data(), params.size(), index, steps - done, kSeed);
            done = 0;
          } while (before_sync(id, site.round(), site) && !site.finished());
          if (site.finished()) break;
          if (tau == 0) {
            r = site.sync();
            continue;
          }
          site.begin_sync();
          done = site.round() + 1 < site.rounds() ? tau : 0;
          synthetic::local_steps(params.data(), params.size(), index, done, kSeed);
          r = site.finish_sync();
          if (r.resynced) done = 0;
        }
        std::lock_guard<std::mutex> lock(mu_);
        site_models_[id] = params;
        site_rounds_[id] = site.round();
      });
    }
    nodes.join();
    std::lock_guard<std::mutex> lock(mu_);
    errors_ += nodes.errors();
  }

  std::string errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  // Valid once run() returned.
  const AggregatorSummary& root() const { return root_; }
  const AggregatorSummary& sites_parent_summary() const {
    return sites_parent_ == "root" ? root_ : region_;
  }
  const std::map<std::string, std::vector<float>>& site_models() const { return site_models_; }
  const std::map<std::string, uint64_t>& site_rounds() const { return site_rounds_; }

 private:
  TempDir dir_;
  size_t params_;
  Topology topo_;
  std::vector<float> init_;
  std::string sites_parent_;
  std::mutex mu_;
  uint64_t committed_ = 0;  // rounds the root committed
  std::string errors_;
  AggregatorSummary root_, region_;
  std::map<std::string, std::vector<float>> site_models_;
  std::map<std::string, uint64_t> site_rounds_;
};

std::vector<AuditEntry> events(const std::vector<AuditEntry>& log, const std::string& event) {
  std::vector<AuditEntry> out;
  for (const AuditEntry& e : log) {
    if (e.event == event) out.push_back(e);
  }
  return out;
}

uint64_t round_of(const AuditEntry& e) { return e.fields.value("round", uint64_t{999999}); }

std::vector<std::string> missing_of(const AuditEntry& e) {
  return e.fields.contains("missing") ? strings(e.fields.at("missing"))
                                      : std::vector<std::string>{"<no \"missing\" field>"};
}

// The root's audit log replays to its final model, bit for bit, with nothing
// wrong in the log or the store.
void expect_replay_matches(QuorumFederation& fed) {
  const ReplayResult replay =
      replay_root_audit(fed.topo(), fed.init(), fed.audit("root"), fed.store());
  std::string problems;
  for (const std::string& p : replay.problems) problems += p + "\n";
  EXPECT_TRUE(replay.problems.empty()) << problems;
  EXPECT_EQ(replay.rounds_committed, fed.topo().federation().rounds);
  EXPECT_TRUE(bit_equal(replay.global, fed.root().global_model))
      << "the root's model is not what its audit log says it accepted";
}

// Every site ended at the last round with the same model, and moved.
void expect_sites_finished_together(QuorumFederation& fed) {
  ASSERT_EQ(fed.site_models().size(), 3u);
  const std::vector<float>& reference = fed.site_models().at("site-1");
  for (const auto& [id, model] : fed.site_models()) {
    EXPECT_EQ(fed.site_rounds().at(id), fed.topo().federation().rounds) << id;
    EXPECT_TRUE(bit_equal(model, reference)) << id << " ended with another model than site-1";
  }
  EXPECT_FALSE(bit_equal(reference, fed.init()));
}

// Round kSlowRound closed at its deadline without site-0; its late update
// came and was refused as stale, and site-0 went on from the anchor that
// closed without it: no rejoin, no resync, the same final model as the rest.
void expect_closed_without_the_slow_site(QuorumFederation& fed, double deadline) {
  const uint32_t chunks = fed.chunks();
  const std::string parent = fed.sites_parent();
  const std::vector<AuditEntry> log = read_audit(fed.audit(parent));

  // The round closed at its deadline, with the other two sites ...
  const std::vector<AuditEntry> deadlines = events(log, "deadline");
  ASSERT_EQ(deadlines.size(), 1u) << "expected one deadline, for round " << kSlowRound;
  EXPECT_EQ(round_of(deadlines[0]), kSlowRound);
  EXPECT_EQ(missing_of(deadlines[0]), std::vector<std::string>{kSlowSite});
  EXPECT_EQ(deadlines[0].fields.value("chunks_closed", 0u), chunks);
  const std::vector<AuditEntry> closed = events(log, "round_closed");
  ASSERT_EQ(closed.size(), kRounds);
  for (const AuditEntry& e : closed) {
    // ... and every other round with all three: site-0 kept going.
    const std::vector<std::string> expect_missing = round_of(e) == kSlowRound
                                                        ? std::vector<std::string>{kSlowSite}
                                                        : std::vector<std::string>{};
    EXPECT_EQ(missing_of(e), expect_missing) << "round " << round_of(e);
  }
  // Not before the deadline (a region closes at 0.8 of it).
  ASSERT_GT(fed.root().reports.size(), kSlowRound);
  EXPECT_EQ(fed.root().reports[kSlowRound].round, kSlowRound);
  const double share = parent == "root" ? 1.0 : 0.8;
  EXPECT_GE(fed.root().reports[kSlowRound].seconds, share * deadline - 0.01);

  // site-0's update of that round came, late, and was refused as stale.
  size_t late = 0;
  for (const AuditEntry& e : events(log, "update")) {
    if (e.fields.value("sender", "") != kSlowSite || round_of(e) != kSlowRound) continue;
    ++late;
    EXPECT_EQ(e.fields.value("decision", ""), "stale") << e.fields.dump();
  }
  EXPECT_EQ(late, chunks) << "every chunk of " << kSlowSite << "'s late update is audited";
  EXPECT_GE(fed.sites_parent_summary().stale_updates, chunks);
  EXPECT_EQ(fed.sites_parent_summary().children_lost, 0u);
  EXPECT_EQ(fed.sites_parent_summary().rejoins, 0u) << kSlowSite << " had to rejoin";
  EXPECT_TRUE(events(log, "rejoin").empty());

  // The root counted exactly the other two sites in that round.
  const ReplayResult replay =
      replay_root_audit(fed.topo(), fed.init(), fed.audit("root"), fed.store());
  for (uint64_t r = 0; r < kRounds; ++r) {
    if (parent == "root") {
      for (const std::string site : {"site-0", "site-1", "site-2"}) {
        const int expect = site == kSlowSite && r == kSlowRound ? 0 : static_cast<int>(chunks);
        const auto it = replay.accepted_by_round_sender.find({r, site});
        EXPECT_EQ(it == replay.accepted_by_round_sender.end() ? 0 : it->second, expect)
            << "round " << r << ", " << site;
      }
    } else {
      const auto it = replay.accepted_by_round_sender.find({r, "region-0"});
      EXPECT_EQ(it == replay.accepted_by_round_sender.end() ? 0 : it->second,
                static_cast<int>(chunks))
          << "round " << r;
    }
  }
  if (parent != "root") {
    // The region's aggregate of that round carries the weight of two sites.
    for (const AuditEntry& e : settled_updates(fed.audit("root"))) {
      if (e.fields.value("decision", "") != "accepted") continue;
      const double expect = round_of(e) == kSlowRound ? 137.0 + 174.0 : 100.0 + 137.0 + 174.0;
      EXPECT_DOUBLE_EQ(e.fields.value("weight", 0.0), expect) << e.fields.dump();
    }
  }
  expect_replay_matches(fed);
  // site-0 took the anchor that closed without it, and finished with the rest.
  expect_sites_finished_together(fed);
}

class Quorum : public ::testing::TestWithParam<int> {};  // regions between root and sites

// Runs `fed` with site-0 training past the deadline of round kSlowRound: it
// keeps its link alive meanwhile (as fedwan::Site does between inner steps)
// and sends its update only `linger` after the root committed the round
// without it, so it is late by construction however slow the machine is.
// Checks that it was neither resynced nor left waiting forever.
void run_with_a_late_site(QuorumFederation& fed, milliseconds linger) {
  bool slow_resynced = false, slow_timed_out = false;
  fed.run([&](const std::string& site, uint64_t round, SiteCore& core) {
    if (site != kSlowSite || round != kSlowRound) return false;
    const auto give_up = Clock::now() + std::chrono::seconds(15);
    std::optional<Clock::time_point> until;
    while (!until || Clock::now() < *until) {
      if (!until && fed.committed(kSlowRound)) until = Clock::now() + linger;
      if (Clock::now() > give_up) {
        slow_timed_out = true;
        break;
      }
      if (core.service().resynced) {
        slow_resynced = true;
        return true;
      }
      std::this_thread::sleep_for(milliseconds(20));  // a training step
    }
    return false;
  });
  ASSERT_EQ(fed.errors(), "");
  ASSERT_FALSE(slow_timed_out) << "round " << kSlowRound << " never closed without " << kSlowSite;
  EXPECT_FALSE(slow_resynced) << kSlowSite << " was resynced while it trained";
}

TEST_P(Quorum, DeadlineClosesWithoutASlowSiteAndItsLateDeltaIsStale) {
  constexpr double kDeadline = 1.5;
  QuorumFederation fed(GetParam(), quorum_spec(0.6, kDeadline));
  run_with_a_late_site(fed, milliseconds(0));
  expect_closed_without_the_slow_site(fed, kDeadline);
}

// The same with overlapped rounds: the sites merge each anchor 2 steps
// after their update; site-0's late update is still stale, the anchor that
// closed without it is merged into its training, and it finishes in step.
TEST_P(Quorum, OverlappedRoundsCloseWithoutASlowSiteToo) {
  constexpr double kDeadline = 1.5;
  FederationSpec spec = quorum_spec(0.6, kDeadline);
  spec.overlap_steps = 2;
  QuorumFederation fed(GetParam(), spec);
  run_with_a_late_site(fed, milliseconds(300));
  expect_closed_without_the_slow_site(fed, kDeadline);
}

// As above, but site-0 is still training, and servicing its link, for 0.8 s
// (four heartbeats) after its round closed without it: the anchor of the
// next round reaches it during that time and is kept until its late update
// is computed. The parent's heartbeats of the next round are normal then and
// must not make the site rejoin (which would throw its training away).
TEST_P(Quorum, ASiteStillTrainingAfterItsRoundClosedIsNotResynced) {
  constexpr double kDeadline = 1.5;
  QuorumFederation fed(GetParam(), quorum_spec(0.6, kDeadline));
  run_with_a_late_site(fed, milliseconds(800));
  expect_closed_without_the_slow_site(fed, kDeadline);
}

TEST_P(Quorum, FullQuorumWaitsPastTheDeadlineForAMissingSite) {
  constexpr double kDeadline = 1.0;
  constexpr auto kLate = milliseconds(2000);  // twice the deadline
  QuorumFederation fed(GetParam(), quorum_spec(1.0, kDeadline));
  const uint32_t chunks = fed.chunks();
  // site-0 trains for twice the deadline in round kSlowRound, keeping its
  // link alive meanwhile.
  bool slow_resynced = false;
  fed.run([&](const std::string& site, uint64_t round, SiteCore& core) {
    if (site != kSlowSite || round != kSlowRound) return false;
    const auto end = Clock::now() + kLate;
    while (Clock::now() < end) {
      if (core.service().resynced) {
        slow_resynced = true;
        return true;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  });
  ASSERT_EQ(fed.errors(), "");
  EXPECT_FALSE(slow_resynced) << kSlowSite << " was resynced while it trained";
  const std::string parent = fed.sites_parent();
  const std::vector<AuditEntry> log = read_audit(fed.audit(parent));

  // The deadline passed without closing anything: no quorum without site-0.
  const std::vector<AuditEntry> deadlines = events(log, "deadline");
  ASSERT_EQ(deadlines.size(), 1u);
  EXPECT_EQ(round_of(deadlines[0]), kSlowRound);
  EXPECT_EQ(deadlines[0].fields.value("chunks_closed", 99u), 0u);
  EXPECT_EQ(missing_of(deadlines[0]), std::vector<std::string>{kSlowSite});
  // The round closed later, with everyone.
  const std::vector<AuditEntry> closed = events(log, "round_closed");
  ASSERT_EQ(closed.size(), kRounds);
  for (const AuditEntry& e : closed) {
    EXPECT_TRUE(missing_of(e).empty()) << "round " << round_of(e);
    if (round_of(e) == kSlowRound) EXPECT_GT(e.seq, deadlines[0].seq);
  }
  ASSERT_GT(fed.root().reports.size(), kSlowRound);
  EXPECT_GE(fed.root().reports[kSlowRound].seconds,
            std::chrono::duration<double>(kLate).count() - 0.01);

  // Nothing stale, nothing dropped, nothing sent twice: every update of
  // every round, site-0's late one included, was accepted the one time it came.
  std::vector<std::string> nodes = {"root"};
  if (parent != "root") nodes.push_back(parent);
  for (const std::string& node : nodes) {
    for (const AuditEntry& e : settled_updates(fed.audit(node))) {
      EXPECT_EQ(e.fields.value("decision", ""), "accepted") << node << ": " << e.fields.dump();
    }
  }
  EXPECT_EQ(fed.root().stale_updates, 0u);
  EXPECT_EQ(fed.sites_parent_summary().stale_updates, 0u);
  EXPECT_EQ(fed.sites_parent_summary().children_lost, 0u);
  const ReplayResult replay =
      replay_root_audit(fed.topo(), fed.init(), fed.audit("root"), fed.store());
  const std::vector<std::string> senders =
      parent == "root" ? std::vector<std::string>{"site-0", "site-1", "site-2"}
                       : std::vector<std::string>{"region-0"};
  for (uint64_t r = 0; r < kRounds; ++r) {
    for (const std::string& s : senders) {
      const auto it = replay.accepted_by_round_sender.find({r, s});
      EXPECT_EQ(it == replay.accepted_by_round_sender.end() ? 0 : it->second,
                static_cast<int>(chunks))
          << "round " << r << ", " << s;
    }
  }
  expect_replay_matches(fed);
  expect_sites_finished_together(fed);
}

INSTANTIATE_TEST_SUITE_P(Topologies, Quorum, ::testing::Values(0, 1), [](const auto& info) {
  return info.param == 0 ? std::string("SitesUnderTheRoot") : std::string("SitesUnderARegion");
});

// A healthy federation with frequent heartbeats: every update is sent once
// and accepted the first time. The aggregator flags kFlagNeedUpdate for a
// child whose update is still on its way (its heartbeat timer runs before
// the loop reads the deltas that woke it); the child must not take that for
// a loss. Before commit b27aa3b (an update goes again only when it went out
// a heartbeat timeout ago) sites and regions sent whole updates again in
// every run of this test, audited "duplicate" or, once the round had
// closed, "stale".
class Heartbeats : public ::testing::TestWithParam<int> {};

TEST_P(Heartbeats, AnUpdateOnItsWayIsNotSentAgain) {
  FederationSpec spec = quorum_spec(1.0, 0);
  spec.rounds = 3 * kRounds;
  spec.heartbeat_s = 0.03;  // many heartbeats: the race shows in most runs
  QuorumFederation fed(GetParam(), spec);
  fed.run([](const std::string&, uint64_t, SiteCore&) { return false; });
  ASSERT_EQ(fed.errors(), "");
  std::vector<std::string> nodes = {"root"};
  if (fed.sites_parent() != "root") nodes.push_back(fed.sites_parent());
  size_t updates = 0;
  for (const std::string& node : nodes) {
    for (const AuditEntry& e : settled_updates(fed.audit(node))) {
      ++updates;
      EXPECT_EQ(e.fields.value("decision", ""), "accepted") << node << ": " << e.fields.dump();
    }
  }
  const size_t senders = fed.sites_parent() == "root" ? 3 : 3 + 1;
  EXPECT_EQ(updates, spec.rounds * senders * fed.chunks());
  expect_replay_matches(fed);
  expect_sites_finished_together(fed);
}

INSTANTIATE_TEST_SUITE_P(Topologies, Heartbeats, ::testing::Values(0, 1), [](const auto& info) {
  return info.param == 0 ? std::string("SitesUnderTheRoot") : std::string("SitesUnderARegion");
});

// A healthy federation whose sites train for longer than a heartbeat period
// and upload chunks of 1 MiB: sync() seals the delta chunks on a
// security::SealingPipeline worker, and a heartbeat that falls due meanwhile
// must not be sealed on the caller's thread with the same sealer (that race
// made the parent refuse frames as "bad tag" or "replay" and could kill the
// site with a CryptoError). Nothing is refused, nothing fails.
TEST_P(Heartbeats, AHeartbeatDueDuringAnUploadDoesNotBreakTheLink) {
  FederationSpec spec = quorum_spec(1.0, 0);
  spec.rounds = 20;  // each round, each site gets another chance to race
  spec.chunk_bytes = 1 << 20;
  spec.heartbeat_s = 0.01;
  QuorumFederation fed(GetParam(), spec, /*params=*/1 << 20);  // 4 chunks
  fed.run([](const std::string&, uint64_t, SiteCore&) {
    std::this_thread::sleep_for(milliseconds(30));  // three heartbeat periods of training
    return false;
  });
  std::vector<std::string> nodes = {"root"};
  if (fed.sites_parent() != "root") nodes.push_back(fed.sites_parent());
  for (const std::string& node : nodes) {
    for (const AuditEntry& e : events(read_audit(fed.audit(node)), "frame_rejected")) {
      ADD_FAILURE() << node << " refused a frame: " << e.fields.dump();
    }
  }
  ASSERT_EQ(fed.errors(), "");
  expect_replay_matches(fed);
  expect_sites_finished_together(fed);
}

}  // namespace
}  // namespace fedwan::testing
