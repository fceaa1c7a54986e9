// Topology versions with every node as a thread over loopback TCP and
// mutual TLS: an operator changes a running federation by writing a later,
// admin-signed version of its topology over the aggregators' topology files.
//
//  * Version 2 adds a fifth site (site-4) while the root works on round
//    kAddRound; it is started with version 2 and credentials from the
//    federation's CA, and counts from the round boundary after it comes.
//  * Version 3 removes site-1 once version 2 is in: it is not waited for,
//    and refused from then on.
//  * Versions the aggregators must not adopt (unsigned, signed by a node,
//    changing the settings, edited after signing, not made from the running
//    version) are refused, audited and raised as alarms; the federation runs
//    on undisturbed.
//
// Quorum 1.0 and no deadline: any child waited for in vain would hang a
// round. The root's model is checked against the replay of its audit log
// over the recorded payloads: nothing lost, nothing counted twice.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.hpp"
#include "fedwan/aggregator.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "harness/audit_replay.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/process.hpp"
#include "security/certs.hpp"
#include "security/node_key.hpp"
#include "security/topology_signature.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kSeed = 23;
constexpr size_t kParams = 3000;  // 3 chunks
constexpr uint32_t kChunks = 3;
constexpr uint64_t kAddRound = 4;  // version 2 is written while the root works on it

FederationSpec spec(uint64_t rounds) { return every_member_federation(rounds, 30); }

// An operator's actions while the federation runs, on a thread of its own;
// it may start sites.
using Operator = std::function<void(NodeSpawner&)>;

class VersionedFederation {
 public:
  // Four sites under the root (regions 0) or under region-0.
  VersionedFederation(int regions, uint64_t rounds, milliseconds step = milliseconds(60))
      : regions_(regions), step_(step) {
    std::vector<NodeSpec> nodes = make_tree(dir_.path(), regions, 4, spec(rounds)).nodes();
    for (NodeSpec& n : nodes) {
      if (n.role == Role::kSite) continue;
      n.endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
      n.bind = n.endpoint;
    }
    v1_ = Topology::build("versions-test", spec(rounds), nodes);
    running_ = v1_;
    init_ = synthetic::initial_model(kParams, kSeed);
    (void)security_for(v1_, "root");
    pki_ = credentials_dir_for(v1_);
    for (const NodeSpec& n : v1_.nodes()) {
      if (n.role != Role::kSite) write_file_atomic(topology_file(n.id), v1_.to_yaml(), 0644);
    }
  }

  const Topology& v1() const { return v1_; }
  const std::string& pki() const { return pki_; }
  std::string parent() const { return regions_ == 0 ? "root" : "region-0"; }
  fs::path audit(const std::string& node) const { return dir_.path() / (node + ".audit"); }
  fs::path store() const { return dir_.path() / "updates"; }
  fs::path topology_file(const std::string& node) const {
    return dir_.path() / (node + ".topology.yaml");
  }

  // `next` as every aggregator's topology file (what an operator does).
  void publish(const Topology& next) {
    for (const NodeSpec& n : v1_.nodes()) {
      if (n.role != Role::kSite) write_file_atomic(topology_file(n.id), next.to_yaml(), 0644);
    }
  }
  // `topo`, numbered after the running version and signed by the admin.
  Topology signed_successor(const Topology& topo) const {
    const auto admin = security::NodeKey::from_bundle((fs::path(pki_) / "admin").string());
    return security::sign_topology(topo.as_successor_of(running_), *admin);
  }
  void set_running(const Topology& t) { running_ = t; }
  const Topology& running() const { return running_; }

  // Waits until `node`'s audit log has `count` entries of `event`.
  bool await_event(const std::string& node, const std::string& event, size_t count = 1) {
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < give_up) {
      if (audit_events(audit(node), event).size() >= count) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }
  bool await_round(uint64_t round) {
    const auto give_up = Clock::now() + std::chrono::seconds(60);
    while (committed() < round && Clock::now() < give_up) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    return committed() >= round;
  }
  uint64_t committed() {
    std::lock_guard<std::mutex> lock(mu_);
    return committed_;
  }

  // Starts `site` (of topology `topo`) on the running federation.
  void start_site(NodeSpawner& nodes, const Topology& topo, const std::string& site) {
    nodes.spawn(site, [this, topo, site](NodeStopper& stopper) { run_site(stopper, topo, site); });
  }

  void run(const Operator& op) {
    NodeSpawner nodes;
    for (const NodeSpec& n : v1_.nodes()) {
      if (n.role == Role::kSite) continue;
      spawn_aggregator(nodes, v1_, n.id, init_, &summaries_[n.id],
                       [this, id = n.id](AggregatorOptions& o) {
                         // From its file, which the operator replaces while it runs.
                         o.topology = Topology::load(topology_file(id).string());
                         o.topology_file = topology_file(id).string();
                         o.join_timeout = std::chrono::seconds(30);
                         o.security.audit_log = audit(id).string();
                         if (o.node_id != v1_.root().id) return;
                         o.record_updates_dir = store().string();
                         o.on_model = [this](uint64_t round, const std::vector<float>&) {
                           std::lock_guard<std::mutex> lock(mu_);
                           committed_ = round + 1;
                         };
                       });
    }
    for (const NodeSpec& n : v1_.nodes()) {
      if (n.role == Role::kSite) start_site(nodes, v1_, n.id);
    }
    std::thread operator_thread([&] {
      try {
        op(nodes);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu_);
        errors_ += std::string("operator: ") + e.what() + "\n";
      }
    });
    operator_thread.join();
    nodes.join();
    std::lock_guard<std::mutex> lock(mu_);
    errors_ += nodes.errors();
  }
  std::string errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  const AggregatorSummary& summary(const std::string& id) { return summaries_.at(id); }
  std::map<std::string, uint64_t> site_rounds_;
  std::map<std::string, std::vector<float>> site_models_;
  std::map<std::string, std::string> refused_;  // site -> its parent's refusal

 private:
  void run_site(NodeStopper& stopper, const Topology& topo, const std::string& id) {
    std::vector<float> params = init_;
    SiteOptions o;
    o.topology = topo;
    o.node_id = id;
    o.join_timeout = o.round_timeout = std::chrono::seconds(30);
    o.security = credentials_in(pki_, id);
    o.security.audit_log = audit(id).string();
    SiteCore site(std::move(o), params.data(), params.size());
    const auto bound = stopper.bind([&site] { site.stop(); });
    const uint32_t index = topo.node(id).index;
    try {
      SyncResult r = site.join();
      while (!r.finished) {
        synthetic::local_steps(params.data(), params.size(), index, topo.federation().inner_steps,
                               kSeed);
        std::this_thread::sleep_for(step_);
        r = site.sync();
      }
    } catch (const Error& e) {  // refused: removed from the federation
      std::lock_guard<std::mutex> lock(mu_);
      refused_[id] = e.what();
      site_rounds_[id] = site.round();
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    site_rounds_[id] = site.round();
    site_models_[id] = params;
  }

  int regions_;
  milliseconds step_;
  TempDir dir_;
  Topology v1_, running_;
  std::string pki_;
  std::vector<float> init_;
  std::mutex mu_;
  uint64_t committed_ = 0;
  std::string errors_;
  std::map<std::string, AggregatorSummary> summaries_;
};

// Chunks `node`'s audit log accepted from `site` in `round`.
int accepted(const fs::path& log, const std::string& site, uint64_t round) {
  int n = 0;
  for (const AuditEntry& e : settled_updates(log)) {
    if (e.fields.value("sender", "") == site && e.fields.value("round", uint64_t{0}) == round &&
        e.fields.value("decision", "") == "accepted")
      ++n;
  }
  return n;
}

// The root's model is the replay of its audit log under the final version.
void expect_replay(VersionedFederation& fed, const Topology& last) {
  const ReplayResult replay = replay_root_audit(last, synthetic::initial_model(kParams, kSeed),
                                                fed.audit("root"), fed.store());
  std::string problems;
  for (const std::string& p : replay.problems) problems += p + "\n";
  EXPECT_TRUE(replay.problems.empty()) << problems;
  EXPECT_EQ(replay.rounds_committed, last.federation().rounds);
  EXPECT_TRUE(bit_equal(replay.global, fed.summary("root").global_model))
      << "the root's model is not what its audit log says it accepted";
}

class TopologyVersions : public ::testing::TestWithParam<int> {};  // regions above the sites

TEST_P(TopologyVersions, OperatorAddsAFifthSiteAndRemovesOne) {
  const int regions = GetParam();
  constexpr uint64_t kRounds = 14;
  VersionedFederation fed(regions, kRounds, milliseconds(120));
  Topology v2, v3;
  uint64_t started = 0, remove_written = 0;
  fed.run([&](NodeSpawner& nodes) {
    ASSERT_TRUE(fed.await_round(kAddRound));
    // Version 2: site-4 appended under the sites' parent.
    std::vector<NodeSpec> nodes2 = fed.v1().nodes();
    NodeSpec s4;
    s4.id = "site-4";
    s4.role = Role::kSite;
    s4.parent = fed.parent();
    s4.weight = 250;
    nodes2.push_back(s4);
    v2 = fed.signed_successor(Topology::build(fed.v1().job(), fed.v1().federation(), nodes2));
    fed.publish(v2);
    ASSERT_TRUE(fed.await_event(fed.parent(), "topology_adopted"));
    ASSERT_TRUE(fed.await_event("root", "topology_adopted"));
    fed.set_running(v2);
    security::issue_node(fed.pki(), security::identity_for(v2, "site-4"));
    started = fed.committed();
    fed.start_site(nodes, v2, "site-4");
    // Version 3: site-1 removed, once site-4 counts.
    ASSERT_TRUE(fed.await_event(fed.parent(), "member_joined", 5));
    std::vector<NodeSpec> nodes3 = v2.nodes();
    for (NodeSpec& n : nodes3) n.removed = n.removed || n.id == "site-1";
    v3 = fed.signed_successor(Topology::build(v2.job(), v2.federation(), nodes3));
    remove_written = fed.committed();
    fed.publish(v3);
    ASSERT_TRUE(fed.await_event(fed.parent(), "member_removed"));
  });
  ASSERT_EQ(fed.errors(), "");
  const std::string parent = fed.parent();
  EXPECT_EQ(fed.summary(parent).children_lost, 0u) << "a child was waited for until lost";
  EXPECT_TRUE(audit_events(fed.audit(parent), "child_lost").empty());
  EXPECT_EQ(fed.summary(parent).topology_version, 3u);
  EXPECT_EQ(fed.summary("root").topology_version, 3u);
  expect_replay(fed, v3);

  // Both versions adopted by both aggregators, with what they changed.
  for (const std::string& node : {std::string("root"), parent}) {
    const auto adopted = audit_events(fed.audit(node), "topology_adopted");
    ASSERT_EQ(adopted.size(), 2u) << node;
    EXPECT_EQ(adopted[0].fields.value("version", uint64_t{0}), 2u);
    EXPECT_EQ(adopted[0].fields["added"], nlohmann::json::array({"site-4"}));
    EXPECT_EQ(adopted[1].fields.value("version", uint64_t{0}), 3u);
    EXPECT_EQ(adopted[1].fields["removed"], nlohmann::json::array({"site-1"}));
    EXPECT_TRUE(audit_events(fed.audit(node), "topology_refused").empty()) << node;
  }

  // site-4 counts from the boundary after its hello, then every round.
  const auto joining = audit_events(fed.audit(parent), "member_joining");
  ASSERT_EQ(joining.size(), 1u);
  EXPECT_EQ(joining[0].fields.value("peer", ""), "site-4");
  const uint64_t from = joining[0].fields.value("counts_from_round", uint64_t{0});
  EXPECT_GE(from, started);
  ASSERT_LT(from, kRounds) << "the run was too fast for the new site to take part";
  for (uint64_t r = 0; r < kRounds; ++r) {
    EXPECT_EQ(accepted(fed.audit(parent), "site-4", r), r >= from ? static_cast<int>(kChunks) : 0)
        << "site-4, round " << r;
    EXPECT_EQ(accepted(fed.audit(parent), "site-0", r), static_cast<int>(kChunks)) << r;
  }
  EXPECT_EQ(fed.site_rounds_.at("site-4"), kRounds);
  EXPECT_TRUE(bit_equal(fed.site_models_.at("site-4"), fed.site_models_.at("site-0")))
      << "the new site did not end with the federation's model";

  // site-1: every round before its removal, none after; refused, told why.
  const auto removed = audit_events(fed.audit(parent), "member_removed");
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].fields.value("peer", ""), "site-1");
  const uint64_t removed_in = removed[0].fields.value("round", uint64_t{0});
  EXPECT_GE(removed_in, remove_written);
  ASSERT_LT(removed_in + 1, kRounds);
  for (uint64_t r = 0; r < kRounds; ++r) {
    const int got = accepted(fed.audit(parent), "site-1", r);
    if (r < removed_in) EXPECT_EQ(got, static_cast<int>(kChunks)) << "site-1, round " << r;
    if (r > removed_in) EXPECT_EQ(got, 0) << "site-1 counted after its removal, round " << r;
  }
  ASSERT_EQ(fed.refused_.count("site-1"), 1u) << "site-1 was not told it was removed";
  EXPECT_NE(fed.refused_.at("site-1").find("removed"), std::string::npos)
      << fed.refused_.at("site-1");
  EXPECT_EQ(fed.refused_.size(), 1u);
}

TEST_P(TopologyVersions, VersionsTheAdminDidNotSignOrThatChangeTooMuchAreRefused) {
  const int regions = GetParam();
  constexpr uint64_t kRounds = 16;
  // Slow rounds: the federation runs while every version is looked at.
  VersionedFederation fed(regions, kRounds, milliseconds(400));
  Topology good;
  std::vector<std::string> expected_reasons;
  fed.run([&](NodeSpawner&) {
    ASSERT_TRUE(fed.await_round(2));
    std::vector<NodeSpec> nodes = fed.v1().nodes();
    NodeSpec s4;
    s4.id = "site-4";
    s4.role = Role::kSite;
    s4.parent = fed.parent();
    nodes.push_back(s4);
    const Topology draft = Topology::build(fed.v1().job(), fed.v1().federation(), nodes);
    const Topology unsigned_v2 = draft.as_successor_of(fed.v1());
    // A site's key is not the admin's.
    const auto site_key = security::NodeKey::from_bundle((fs::path(fed.pki()) / "site-0").string());
    TopologySignature by_site;
    {
      const auto& d = unsigned_v2.digest();
      by_site.cert = security::base64_encode(site_key->cert_der());
      by_site.value = security::base64_encode(site_key->sign("fedwan-topology-v1", d.data(), 32));
    }
    // Signed, then edited (site-4's weight): the signature no longer holds.
    const Topology signed_v2 = fed.signed_successor(draft);
    std::vector<NodeSpec> edited_nodes = signed_v2.nodes();
    edited_nodes.back().weight = 1e6;
    const Topology edited = Topology::build(fed.v1().job(), fed.v1().federation(), edited_nodes)
                                .as_successor_of(fed.v1())
                                .with_signature(*signed_v2.signature());
    // Signed, but it changes the quorum.
    FederationSpec laxer = fed.v1().federation();
    laxer.quorum = 0.5;
    const Topology settings = fed.signed_successor(Topology::build(fed.v1().job(), laxer, nodes));
    // Signed, but made from another version 1 (a sibling federation's).
    std::vector<NodeSpec> other = fed.v1().nodes();
    other.back().weight += 1;
    const Topology sibling = Topology::build(fed.v1().job(), fed.v1().federation(), other);
    const Topology foreign = security::sign_topology(
        draft.as_successor_of(sibling),
        *security::NodeKey::from_bundle((fs::path(fed.pki()) / "admin").string()));
    const std::vector<std::pair<Topology, std::string>> bad = {
        {unsigned_v2, "not signed"},
        {unsigned_v2.with_signature(by_site), "not by the federation's admin"},
        {edited, "does not match"},
        {settings, "federation settings"},
        {foreign, "was not made from the running version"}};
    size_t refused = 0;
    for (const auto& [t, reason] : bad) {
      fed.publish(t);
      ++refused;
      ASSERT_TRUE(fed.await_event(fed.parent(), "topology_refused", refused)) << reason;
      ASSERT_TRUE(fed.await_event("root", "topology_refused", refused)) << reason;
      expected_reasons.push_back(reason);
    }
    // Signed by an admin revoked a moment ago: the CRL just written into
    // every bundle is read before the signature is judged.
    const Topology by_revoked = fed.signed_successor(draft);
    security::revoke_node(fed.pki(), security::kAdminName);
    fed.publish(by_revoked);
    ++refused;
    ASSERT_TRUE(fed.await_event(fed.parent(), "topology_refused", refused)) << "revoked";
    ASSERT_TRUE(fed.await_event("root", "topology_refused", refused)) << "revoked";
    expected_reasons.push_back("revoked");
    security::issue_admin(fed.pki());  // the federation's new admin
    good = fed.signed_successor(draft);
    fed.publish(good);
    ASSERT_TRUE(fed.await_event(fed.parent(), "topology_adopted"));
    ASSERT_TRUE(fed.await_event("root", "topology_adopted"));
  });
  ASSERT_EQ(fed.errors(), "");
  expect_replay(fed, good);
  for (const std::string& node : {std::string("root"), fed.parent()}) {
    const auto refused = audit_events(fed.audit(node), "topology_refused");
    ASSERT_EQ(refused.size(), expected_reasons.size()) << node;
    for (size_t i = 0; i < refused.size(); ++i) {
      const std::string why = refused[i].fields.value("reason", "");
      EXPECT_NE(why.find(expected_reasons[i]), std::string::npos) << node << ": " << why;
    }
    EXPECT_EQ(fed.summary(node).topology_version, 2u) << node;
    bool alarmed = false;
    for (const std::string& a : fed.summary(node).alarms) {
      alarmed = alarmed || a.rfind("topology_refused", 0) == 0;
    }
    EXPECT_TRUE(alarmed) << node << ": no topology_refused alarm";
  }
  // Nobody waited for the site that never came (site-4 was not started).
  EXPECT_EQ(fed.summary(fed.parent()).children_lost, 0u);
  for (uint64_t r = 0; r < kRounds; ++r) {
    EXPECT_EQ(accepted(fed.audit(fed.parent()), "site-0", r), static_cast<int>(kChunks)) << r;
  }
}

// Operators' tools often keep a file's time (`cp -p`, `rsync -t`): a version
// of exactly the running file's size then looks unchanged by size and time.
// It is adopted all the same: the watch compares the file's content.
TEST(TopologyWatch, AVersionWithTheRunningFilesSizeAndTimeIsAdopted) {
  constexpr uint64_t kRounds = 8;
  VersionedFederation fed(0, kRounds, milliseconds(120));
  std::vector<NodeSpec> nodes2 = fed.v1().nodes();
  for (NodeSpec& n : nodes2) n.removed = n.removed || n.id == "site-3";
  const Topology v2 =
      fed.signed_successor(Topology::build(fed.v1().job(), fed.v1().federation(), nodes2));
  const std::string v2_text = v2.to_yaml();
  std::string v1_text = fed.v1().to_yaml();
  ASSERT_LT(v1_text.size() + 2, v2_text.size());
  // A comment: the same topology (digest), at version 2's size.
  v1_text += "#" + std::string(v2_text.size() - v1_text.size() - 2, ' ') + "\n";
  const fs::path file = fed.topology_file("root");
  write_file_atomic(file, v1_text, 0644);
  const auto when = fs::last_write_time(file);
  fed.run([&](NodeSpawner&) {
    ASSERT_TRUE(fed.await_round(2));
    write_file_atomic(file, v2_text, 0644);
    fs::last_write_time(file, when);
    ASSERT_EQ(fs::file_size(file), v1_text.size());
    ASSERT_TRUE(fed.await_event("root", "topology_adopted"));
  });
  ASSERT_EQ(fed.errors(), "");
  EXPECT_EQ(fed.summary("root").topology_version, 2u);
  const auto adopted = audit_events(fed.audit("root"), "topology_adopted");
  ASSERT_EQ(adopted.size(), 1u);
  EXPECT_EQ(adopted[0].fields["removed"], nlohmann::json::array({"site-3"}));
  EXPECT_EQ(fed.refused_.count("site-3"), 1u) << "site-3 was not told it was removed";
}

INSTANTIATE_TEST_SUITE_P(Tree, TopologyVersions, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param == 0 ? std::string("SitesUnderRoot")
                                               : std::string("SitesUnderRegion");
                         });

}  // namespace
}  // namespace fedwan::testing
