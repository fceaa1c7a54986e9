// The chaos suite: real `fedwan` processes on loopback, faults injected, and
// after each run two checks against the root's audit log:
//   * the final global model equals, bit for bit, a replay of exactly the
//     updates the log records as accepted (payloads kept by
//     --record-updates), discarding rounds a restarted root reopened;
//   * no (round, sender, chunk) is accepted twice.
// Each scenario adds a row (rounds lost = RPO, seconds to resume = RTO) to
// the chaos report (FEDWAN_CHAOS_REPORT, see harness/chaos_report.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/synthetic.hpp"
#include "harness/audit_replay.hpp"
#include "harness/chaos_report.hpp"
#include "harness/fault_proxy.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/netns.hpp"
#include "harness/process.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

using Env = std::vector<std::pair<std::string, std::string>>;
using SysClock = std::chrono::system_clock;

constexpr uint64_t kSeed = 7;
constexpr size_t kParams = 20000;

// Parses the audit log's "2026-11-22T10:00:00.123Z" (UTC).
SysClock::time_point audit_time(const std::string& t) {
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(t.c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7) {
    return {};
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return SysClock::from_time_t(timegm(&tm)) + std::chrono::milliseconds(ms);
}

class ChaosFederation {
 public:
  // root -> `regions` regions -> `sites` sites each, fp16, DiLoCo, 5 chunks.
  ChaosFederation(int regions, int sites, uint64_t rounds = 6) {
    FederationSpec fed;
    fed.rounds = rounds;
    fed.inner_steps = 3;
    fed.codec = "fp16";
    fed.chunk_bytes = 16384;
    fed.outer.name = "diloco";
    fed.round_timeout_s = 90;
    fed.heartbeat_s = 0.3;
    fed.heartbeat_timeout_s = 2;
    Topology tree = make_tree(dir_.path(), regions, sites, fed);
    std::vector<NodeSpec> nodes = tree.nodes();
    for (NodeSpec& n : nodes) {
      if (n.role == Role::kSite) continue;
      ports_[n.id] = free_tcp_port();
      n.endpoint = "tcp://127.0.0.1:" + std::to_string(ports_[n.id]);
      n.bind = n.endpoint;
    }
    topo_ = Topology::build("chaos", fed, nodes);
    write_topology();
  }

  // A test that fails half-way leaves no process behind.
  ~ChaosFederation() {
    for (const auto& [id, pid] : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  ChaosFederation(const ChaosFederation&) = delete;
  ChaosFederation& operator=(const ChaosFederation&) = delete;

  // Routes every child of `node` through `proxy_port` (a FaultProxy in front
  // of the node's real port).
  void route_through(const std::string& node, int proxy_port) {
    std::vector<NodeSpec> nodes = topo_.nodes();
    for (NodeSpec& n : nodes) {
      if (n.id == node) {
        n.bind = "tcp://127.0.0.1:" + std::to_string(ports_[node]);
        n.endpoint = "tcp://127.0.0.1:" + std::to_string(proxy_port);
      }
    }
    topo_ = Topology::build("chaos", topo_.federation(), nodes);
    write_topology();
  }

  // Sets where `node` listens (bind) and where its children reach it.
  void place(const std::string& node, const std::string& bind_host,
             const std::string& reach_host) {
    std::vector<NodeSpec> nodes = topo_.nodes();
    for (NodeSpec& n : nodes) {
      if (n.id != node) continue;
      n.bind = "tcp://" + bind_host + ":" + std::to_string(ports_[node]);
      n.endpoint = "tcp://" + reach_host + ":" + std::to_string(ports_[node]);
    }
    topo_ = Topology::build("chaos", topo_.federation(), nodes);
    write_topology();
  }

  const Topology& topo() const { return topo_; }
  pid_t pid(const std::string& node) const { return pids_.at(node); }
  const std::filesystem::path& dir() const { return dir_.path(); }
  int port(const std::string& node) const { return ports_.at(node); }
  std::filesystem::path checkpoint_dir(const std::string& node) const {
    return dir_.path() / "ckpt" / node;
  }
  std::filesystem::path audit(const std::string& node) const {
    return dir_.path() / (node + ".audit");
  }
  std::string log(const std::string& node) const { return read_text(log_path(node)); }

  // Gives the root a standby at a port of its own (topology
  // standby_endpoint); start it with start_standby().
  void add_standby() {
    ports_["standby"] = free_tcp_port();
    std::vector<NodeSpec> nodes = topo_.nodes();
    for (NodeSpec& n : nodes) {
      if (n.role != Role::kRoot) continue;
      n.standby_endpoint = "tcp://127.0.0.1:" + std::to_string(ports_["standby"]);
      n.standby_bind = n.standby_endpoint;
    }
    topo_ = Topology::build("chaos", topo_.federation(), nodes);
    write_topology();
    standby_ = true;
  }
  // The root's standby: the root node with its credentials, `--standby`,
  // its own checkpoint directory, audit log and log, named "standby" here.
  pid_t start_standby(const Env& env = {}) {
    return start(topo_.root().id, env, {}, "standby", {"--standby"});
  }

  // `prefix` runs the node under another program (ip netns exec NAME).
  // `name` (default: the node id) names its process, checkpoint directory,
  // audit log and log.
  pid_t start(const std::string& node, const Env& env = {},
              const std::vector<std::string>& prefix = {}, std::string name = {},
              const std::vector<std::string>& extra = {}) {
    if (name.empty()) name = node;
    const NodeSpec& n = topo_.node(node);
    const bool site = n.role == Role::kSite;
    std::vector<std::string> args = {site ? "site" : "aggregator",
                                     "--topology", (dir_.path() / "topology.yaml").string(),
                                     "--node", node,
                                     "--trainer", "synthetic",
                                     "--synthetic-size", std::to_string(kParams),
                                     "--seed", std::to_string(kSeed),
                                     "--join-timeout", "60",
                                     "--credentials", security_for(topo_, node).credentials_dir,
                                     "--audit-log", audit(name).string(),
                                     "--checkpoint-dir", checkpoint_dir(name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    if (!site) {
      args.insert(args.end(), {"--record-updates", (dir_.path() / "store").string()});
    }
    if (n.role == Role::kRoot) args.insert(args.end(), {"--out", model_path().string()});
    const bool restart = started_.count(name) > 0;
    started_[name] = true;
    std::string exe = FEDWAN_CLI_PATH;
    if (!prefix.empty()) {
      args.insert(args.begin(), exe);
      args.insert(args.begin(), prefix.begin() + 1, prefix.end());
      exe = prefix.front();
    }
    const pid_t pid = spawn_process(exe, args, log_path(name), env, restart);
    pids_[name] = pid;
    return pid;
  }

  void start_all(const std::map<std::string, Env>& envs = {},
                 const std::map<std::string, std::vector<std::string>>& prefixes = {}) {
    for (const NodeSpec& n : topo_.nodes()) {
      auto it = envs.find(n.id);
      auto pre = prefixes.find(n.id);
      start(n.id, it == envs.end() ? Env{} : it->second,
            pre == prefixes.end() ? std::vector<std::string>{} : pre->second);
    }
  }

  // Waits for `node` to die of a crash point (SIGKILL); returns when.
  SysClock::time_point wait_crash(const std::string& node, std::chrono::seconds limit) {
    const std::vector<int> codes = wait_processes({pids_.at(node)}, limit);
    EXPECT_EQ(codes[0], -1) << node << " did not crash; log:\n" << log(node);
    return SysClock::now();
  }

  // Waits for every running node; all must exit 0.
  void wait_all(std::chrono::seconds limit) {
    std::vector<pid_t> pids;
    std::vector<std::string> ids;
    for (const auto& [id, pid] : pids_) {
      pids.push_back(pid);
      ids.push_back(id);
    }
    const std::vector<int> codes = wait_processes(pids, limit);
    for (size_t i = 0; i < codes.size(); ++i) {
      // A node that crashed before was waited for already.
      if (codes[i] == -1 && ::kill(pids[i], 0) != 0 && crashed_.count(ids[i])) continue;
      EXPECT_EQ(codes[i], 0) << ids[i] << " log:\n" << log(ids[i]);
    }
    pids_.clear();
  }

  void forget(const std::string& node) {
    pids_.erase(node);
    crashed_[node] = true;
  }

  // The two checks of every scenario; returns the replay for RPO/RTO.
  ReplayResult check_against_audit() {
    const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
    std::vector<std::filesystem::path> logs = {audit(topo_.root().id)};
    if (standby_ && std::filesystem::exists(audit("standby"))) logs.push_back(audit("standby"));
    ReplayResult r = replay_root_audits(topo_, init, logs, dir_.path() / "store");
    EXPECT_TRUE(r.problems.empty()) << ::testing::PrintToString(r.problems);
    EXPECT_EQ(r.rounds_committed, topo_.federation().rounds);
    const std::vector<float> global = read_model(model_path());
    EXPECT_EQ(global.size(), kParams);
    if (global.size() == r.global.size()) {
      EXPECT_EQ(0, std::memcmp(global.data(), r.global.data(), kParams * sizeof(float)))
          << "the final model is not the replay of the accepted updates";
    }
    const uint32_t chunks = static_cast<uint32_t>((kParams * 4 + 16383) / 16384);
    for (const auto& [key, n] : r.accepted_by_round_sender) {
      EXPECT_LE(n, static_cast<int>(chunks)) << "round " << key.first << " sender " << key.second;
    }
    for (const std::filesystem::path& p : logs) {
      const security::AuditVerifyResult v = security::verify_audit_file(p.string());
      EXPECT_TRUE(v.ok) << p << ": " << v.problem;
    }
    return r;
  }

  // The first entry of `event` at `node` logged after `t` (its time).
  std::optional<SysClock::time_point> first_after(const std::string& node,
                                                  const std::string& event,
                                                  SysClock::time_point t) const {
    if (!std::filesystem::exists(audit(node))) return std::nullopt;
    for (const AuditEntry& e : read_audit(audit(node))) {
      const auto when = audit_time(e.time);
      if (e.event == event && when >= t) return when;
    }
    return std::nullopt;
  }

  // The round `node` resumed at after `t`, from its audit log.
  std::optional<uint64_t> resumed_round(const std::string& node) const {
    return last_field(node, "resumed", "round");
  }
  // Field `key` of the last `event` entry in `node`'s audit log.
  std::optional<uint64_t> last_field(const std::string& node, const std::string& event,
                                     const std::string& key) const {
    std::optional<uint64_t> out;
    if (!std::filesystem::exists(audit(node))) return out;
    for (const AuditEntry& e : read_audit(audit(node))) {
      if (e.event == event) out = e.fields.value(key, uint64_t{0});
    }
    return out;
  }

 private:
  std::filesystem::path log_path(const std::string& node) const {
    return dir_.path() / (node + ".log");
  }
  std::filesystem::path model_path() const { return dir_.path() / "root.bin"; }
  void write_topology() {
    std::ofstream(dir_.path() / "topology.yaml") << topo_.to_yaml();
  }

  TempDir dir_;
  Topology topo_;
  std::map<std::string, int> ports_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, bool> started_, crashed_;
  bool standby_ = false;
};

double seconds_between(SysClock::time_point a, std::optional<SysClock::time_point> b) {
  return b ? std::chrono::duration<double>(*b - a).count() : -1;
}

void report(const std::string& scenario, const std::string& mechanism, uint64_t rpo, double rto,
            const std::string& notes) {
  ChaosRow row;
  row.scenario = scenario;
  row.mechanism = mechanism;
  row.rpo_rounds = rpo;
  if (rto >= 0) row.rto_seconds = rto;
  row.passed = !::testing::Test::HasFailure();
  row.notes = notes;
  ChaosReport rep;
  rep.record(row);
  rep.flush();
}

// 1. A site is SIGKILLed after its first delta chunk of round 2; it restarts
// from its checkpoint, rejoins and the federation completes.
TEST(Chaos, SiteKilledMidUploadRestartsAndRejoins) {
  ChaosFederation fed(1, 2);
  const std::string victim = fed.topo().nodes().back().id;
  fed.start_all({{victim, {{"FEDWAN_CRASH_POINT", "site.mid_upload@3"}}}});
  const auto crashed = fed.wait_crash(victim, std::chrono::seconds(60));
  fed.forget(victim);
  fed.start(victim);
  fed.wait_all(std::chrono::seconds(120));
  fed.check_against_audit();
  const std::optional<uint64_t> resumed = fed.resumed_round(victim);
  ASSERT_TRUE(resumed.has_value()) << fed.log(victim);
  EXPECT_EQ(*resumed, 2u);
  report("1 site SIGKILL mid-upload", "crash point site.mid_upload (SIGKILL)", 2 - *resumed,
         seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "restarted site resumed at round " + std::to_string(*resumed));
}

// 2. A region is SIGKILLed after it accepted 7 of the 10 chunk updates of
// round 1 (its two sites, 5 chunks each); it restarts from its checkpoint,
// its sites send their updates again and nothing is counted twice.
TEST(Chaos, RegionKilledAfterSomeChildrenDelivered) {
  ChaosFederation fed(2, 2);
  const std::string region = fed.topo().node(fed.topo().root().children.front()).id;
  fed.start_all({{region, {{"FEDWAN_CRASH_POINT", "aggregator.update_accepted@17"}}}});
  const auto crashed = fed.wait_crash(region, std::chrono::seconds(60));
  fed.forget(region);
  fed.start(region);
  fed.wait_all(std::chrono::seconds(150));
  fed.check_against_audit();
  const std::optional<uint64_t> resumed = fed.resumed_round(region);
  ASSERT_TRUE(resumed.has_value()) << fed.log(region);
  report("2 region SIGKILL after k of n delivered", "crash point aggregator.update_accepted@17",
         1 - std::min<uint64_t>(1, *resumed),
         seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "region resumed at round " + std::to_string(*resumed));
}

// 3. The root is SIGKILLed inside its checkpoint write of round 3 (the
// third), after the write, after the fsync, after the rename.
class RootCheckpointCrash : public ::testing::TestWithParam<std::string> {};

TEST_P(RootCheckpointCrash, RestartsAtItsLastCommittedRound) {
  ChaosFederation fed(1, 2);
  const std::string step = GetParam();
  fed.start_all({{"root", {{"FEDWAN_CRASH_POINT", "checkpoint." + step + "@3"}}}});
  const auto crashed = fed.wait_crash("root", std::chrono::seconds(60));
  fed.forget("root");
  fed.start("root");
  fed.wait_all(std::chrono::seconds(150));
  const ReplayResult r = fed.check_against_audit();
  const std::optional<uint64_t> resumed = fed.resumed_round("root");
  ASSERT_TRUE(resumed.has_value()) << fed.log("root");
  // Before the rename the old checkpoint (round 2) is the durable one; after
  // it, the new one (round 3).
  EXPECT_EQ(*resumed, step == "renamed" ? 3u : 2u);
  report("3 root SIGKILL at checkpoint " + step, "crash point checkpoint." + step,
         3 - *resumed, seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "root resumed at round " + std::to_string(*resumed) + "; " +
             std::to_string(r.discarded) + " uncommitted acceptances discarded");
}

INSTANTIATE_TEST_SUITE_P(Steps, RootCheckpointCrash,
                         ::testing::Values("written", "synced", "renamed"));

// 4. While a site is down, one byte of its latest checkpoint is flipped and
// its previous checkpoint is lost too: the reader detects the flip (the file
// is kept aside as *.corrupt), finds nothing intact locally, and restores the
// replica its region keeps (sent in the background after each checkpoint).
TEST(Chaos, FlippedCheckpointByteRestoresTheParentsReplica) {
  ChaosFederation fed(1, 2);
  const std::string victim = fed.topo().nodes().back().id;
  const std::string region = fed.topo().node(fed.topo().node(victim).parent_index).id;
  fed.start_all({{victim, {{"FEDWAN_CRASH_POINT", "site.mid_upload@4"}}}});
  const auto crashed = fed.wait_crash(victim, std::chrono::seconds(60));
  fed.forget(victim);
  const auto latest = fed.checkpoint_dir(victim) / (victim + ".fwck");
  {
    std::fstream f(latest, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    char b = 0;
    f.seekg(200);
    f.read(&b, 1);
    b ^= 0x10;
    f.seekp(200);
    f.write(&b, 1);
  }
  std::filesystem::remove(fed.checkpoint_dir(victim) / (victim + ".prev.fwck"));
  // What the region holds for the site now (the newest is what comes back).
  uint64_t newest = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(fed.checkpoint_dir(region) / "replicas" / victim)) {
    unsigned long long r = 0;
    if (std::sscanf(e.path().filename().c_str(), "round-%llu.fwck", &r) == 1) {
      newest = std::max<uint64_t>(newest, r);
    }
  }
  ASSERT_GT(newest, 0u) << "the region kept no replica of " << victim;
  fed.start(victim);
  fed.wait_all(std::chrono::seconds(120));
  fed.check_against_audit();
  EXPECT_TRUE(std::filesystem::exists(latest.string() + ".corrupt"));
  EXPECT_EQ(fed.last_field(victim, "replica_restored", "round"), newest) << fed.log(victim);
  EXPECT_EQ(fed.last_field(region, "replica_served", "round"), newest) << fed.log(region);
  const std::optional<uint64_t> resumed = fed.resumed_round(victim);
  ASSERT_TRUE(resumed.has_value()) << fed.log(victim);
  EXPECT_EQ(*resumed, newest);
  report("4 flipped checkpoint byte, previous one lost",
         "byte flip at offset 200 of the latest checkpoint; previous checkpoint deleted",
         3 - *resumed, seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "detected (kept as .corrupt); restored the region's replica of round " +
             std::to_string(newest));
}

// 4b. A region loses its whole checkpoint directory while it is down: it
// restores the replica the root keeps of it, resumes from it and the
// federation completes with nothing counted twice.
TEST(Chaos, RegionWithoutItsDiskRestoresTheRootsReplica) {
  ChaosFederation fed(2, 2);
  const std::string region = fed.topo().node(fed.topo().root().children.front()).id;
  // Its 27th acceptance: round 2 (10 a round), after two checkpoints.
  fed.start_all({{region, {{"FEDWAN_CRASH_POINT", "aggregator.update_accepted@27"}}}});
  const auto crashed = fed.wait_crash(region, std::chrono::seconds(60));
  fed.forget(region);
  std::filesystem::remove_all(fed.checkpoint_dir(region));
  uint64_t newest = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(fed.checkpoint_dir("root") / "replicas" / region)) {
    unsigned long long r = 0;
    if (std::sscanf(e.path().filename().c_str(), "round-%llu.fwck", &r) == 1) {
      newest = std::max<uint64_t>(newest, r);
    }
  }
  ASSERT_GT(newest, 0u) << "the root kept no replica of " << region;
  fed.start(region);
  fed.wait_all(std::chrono::seconds(150));
  fed.check_against_audit();
  EXPECT_EQ(fed.last_field(region, "replica_restored", "round"), newest) << fed.log(region);
  EXPECT_EQ(fed.last_field("root", "replica_served", "round"), newest) << fed.log("root");
  const std::optional<uint64_t> resumed = fed.resumed_round(region);
  ASSERT_TRUE(resumed.has_value()) << fed.log(region);
  EXPECT_EQ(*resumed, newest);
  report("4b region's checkpoint directory lost", "crash point aggregator.update_accepted@27, "
         "then the region's checkpoint directory deleted",
         2 - std::min<uint64_t>(*resumed, 2),
         seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "restored the root's replica of round " + std::to_string(newest));
}

// 5. A region is cut off from its parent and its sites for 3x the
// heartbeat timeout, then the link heals. With network namespaces (root on
// Linux) the region runs in its own namespace behind a veth pair that is
// taken down; elsewhere a fault-injecting proxy in front of the root and of
// the region blackholes their connections. The test says which it used.
TEST(Chaos, RegionPartitionedThenHealed) {
  ChaosFederation fed(1, 2, 8);
  const std::string region = fed.topo().node(fed.topo().root().children.front()).id;
  std::optional<VethPartition> veth;
  std::unique_ptr<FaultProxy> to_root, to_region;
  std::string mechanism;
  std::map<std::string, std::vector<std::string>> prefixes;
  // FEDWAN_CHAOS_NO_NETNS=1 takes the proxy path on a machine with netns.
  if (netns_available() && std::getenv("FEDWAN_CHAOS_NO_NETNS") == nullptr) {
    veth.emplace();
    fed.place("root", "0.0.0.0", veth->host_address());
    fed.place(region, "0.0.0.0", veth->namespace_address());
    prefixes[region] = veth->exec_prefix();
    mechanism = "netns+veth (namespace " + veth->name() + ")";
  } else {
    to_root = std::make_unique<FaultProxy>("127.0.0.1", fed.port("root"));
    to_region = std::make_unique<FaultProxy>("127.0.0.1", fed.port(region));
    fed.route_through("root", to_root->port());
    fed.route_through(region, to_region->port());
    mechanism = "fault-injecting proxy (" +
                (netns_available() ? std::string("FEDWAN_CHAOS_NO_NETNS set")
                                   : netns_unavailable_reason()) +
                ")";
  }
  std::cout << "[ partition mechanism: " << mechanism << " ]" << std::endl;
  fed.start_all({}, prefixes);
  // Let it train a little, then cut.
  const auto t_start = SysClock::now();
  while (!fed.first_after("root", "round_closed", t_start)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_LT(SysClock::now() - t_start, std::chrono::seconds(60)) << fed.log("root");
  }
  if (veth) {
    veth->cut();
  } else {
    to_root->partition(region);
    to_region->partition();
  }
  const double timeout_s = fed.topo().federation().heartbeat_timeout_s;
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(3000 * timeout_s)));
  const auto healed = SysClock::now();
  if (veth) {
    veth->heal();
  } else {
    to_root->heal(region);
    to_region->heal();
  }
  fed.wait_all(std::chrono::seconds(180));
  fed.check_against_audit();
  bool lost = false;
  for (const AuditEntry& e : read_audit(fed.audit("root"))) {
    lost = lost || (e.event == "child_lost" && e.fields.value("peer", "") == region);
  }
  EXPECT_TRUE(lost) << "the root should have declared the region lost during the partition";
  report("5 region partitioned then healed", mechanism, 0,
         seconds_between(healed, fed.first_after("root", "round_closed", healed)),
         "cut for " + std::to_string(3 * timeout_s) + " s (3x heartbeat timeout); RTO from heal");
}

// SIGTERM, as an orchestrator sends it: a site and then the root are
// terminated mid-federation; each checkpoints (or keeps its last round
// boundary) and exits 0, and the restarted node carries on.
TEST(Chaos, SigtermCheckpointsAndExitsZero) {
  ChaosFederation fed(1, 2, 12);
  const std::string victim = fed.topo().nodes().back().id;
  fed.start_all();
  const auto wait_round = [&](SysClock::time_point after) {
    while (!fed.first_after("root", "round_closed", after)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ASSERT_LT(SysClock::now() - after, std::chrono::seconds(60)) << fed.log("root");
    }
  };
  wait_round(SysClock::now());
  for (const std::string& node : {victim, std::string("root")}) {
    const pid_t pid = fed.pid(node);
    ASSERT_EQ(::kill(pid, SIGTERM), 0);
    const std::vector<int> codes = wait_processes({pid}, std::chrono::seconds(60));
    EXPECT_EQ(codes[0], 0) << node << " did not exit 0 on SIGTERM; log:\n" << fed.log(node);
    EXPECT_TRUE(std::filesystem::exists(fed.checkpoint_dir(node) / (node + ".fwck"))) << node;
    fed.forget(node);
    const auto restarted = SysClock::now();
    fed.start(node);
    wait_round(restarted);
  }
  fed.wait_all(std::chrono::seconds(180));
  fed.check_against_audit();
  EXPECT_TRUE(fed.resumed_round(victim).has_value()) << fed.log(victim);
  EXPECT_TRUE(fed.resumed_round("root").has_value()) << fed.log("root");
}

// 6. Every link to the region passes a fault-injecting proxy that drops,
// duplicates and reorders ZeroMQ messages and adds delay. tc netem is not
// used: the test machine's kernel has no netem qdisc.
TEST(Chaos, LossyDuplicatingReorderingLink) {
  ChaosFederation fed(1, 2, 5);
  const std::string region = fed.topo().node(fed.topo().root().children.front()).id;
  FaultProxyOptions po;
  po.target_port = fed.port(region);
  FaultProxy proxy(po);
  fed.route_through(region, proxy.port());
  FaultSpec spec;
  spec.drop = 0.05;
  spec.duplicate = 0.05;
  spec.reorder = 0.05;
  spec.max_delay_ms = 5;
  spec.seed = 11;
  proxy.set_faults(spec);
  const auto t0 = SysClock::now();
  fed.start_all();
  fed.wait_all(std::chrono::seconds(180));
  fed.check_against_audit();
  const FaultProxyStats st = proxy.stats();
  EXPECT_GT(st.messages_dropped + st.messages_duplicated + st.messages_reordered, 0u);
  report("6 lossy, duplicating, reordering link", "fault-injecting proxy (no netem here)", 0,
         -1,
         "dropped " + std::to_string(st.messages_dropped) + ", duplicated " +
             std::to_string(st.messages_duplicated) + ", reordered " +
             std::to_string(st.messages_reordered) + " of " +
             std::to_string(st.messages_forwarded) + " messages; " +
             std::to_string(std::chrono::duration<double>(SysClock::now() - t0).count()) + " s");
}

// 7. The root is SIGKILLed in the middle of round 2. Its standby, which
// holds the root's checkpoint of every round it acknowledged, takes over
// when a region comes to it; training continues and completes. Then
// fencing: the standby, restarted, starts as the active root (it finds its
// own checkpoint), and the old root, started again, is refused by it and
// exits with an error.
TEST(Chaos, RootDiesStandbyTakesOver) {
  ChaosFederation fed(2, 2);
  fed.add_standby();
  fed.start_standby();
  // 5 chunks a region and round, 2 regions: the 25th acceptance is in round 2.
  fed.start_all({{"root", {{"FEDWAN_CRASH_POINT", "aggregator.update_accepted@25"}}}});
  const auto crashed = fed.wait_crash("root", std::chrono::seconds(90));
  fed.forget("root");
  fed.wait_all(std::chrono::seconds(180));
  ASSERT_TRUE(fed.first_after("standby", "takeover", crashed)) << fed.log("standby");
  fed.check_against_audit();
  uint64_t last_closed = 0;
  for (const AuditEntry& e : read_audit(fed.audit("root"))) {
    if (e.event == "round_closed") last_closed = e.fields.value("round", uint64_t{0});
  }
  const std::optional<uint64_t> resumed = fed.resumed_round("standby");
  ASSERT_TRUE(resumed.has_value()) << fed.log("standby");
  // Every round the root committed was held by the standby: none is redone.
  EXPECT_EQ(*resumed, last_closed + 1) << fed.log("standby");
  report("7 root dies, standby takes over", "aggregator.update_accepted@25 on the root",
         last_closed + 1 - *resumed,
         seconds_between(crashed, fed.first_after("standby", "round_closed", crashed)),
         "standby resumed at round " + std::to_string(*resumed) +
             " from the root's replicated checkpoint; a returning old root is fenced");

  // Fencing. The standby comes back as the root it became...
  const auto restarted = SysClock::now();
  const pid_t standby = fed.start_standby();
  const auto until = SysClock::now() + std::chrono::seconds(30);
  while (!fed.first_after("standby", "resumed", restarted) && SysClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(fed.first_after("standby", "resumed", restarted)) << fed.log("standby");
  // ... and refuses the old root, which stops with an error.
  const pid_t old_root = fed.start("root", {}, {}, "old-root");
  const std::vector<int> codes = wait_processes({old_root}, std::chrono::seconds(60));
  EXPECT_NE(codes[0], 0) << fed.log("old-root");
  EXPECT_NE(fed.log("old-root").find("took over as root"), std::string::npos)
      << fed.log("old-root") << "\nstandby:\n" << fed.log("standby");
  EXPECT_TRUE(fed.first_after("old-root", "fenced", restarted)) << fed.log("old-root");
  fed.forget("old-root");
  ::kill(standby, SIGTERM);
  EXPECT_EQ(wait_processes({standby}, std::chrono::seconds(30))[0], 0) << fed.log("standby");
  fed.forget("standby");
}

// Without a fault the standby holds every round's checkpoint of the root
// (acknowledged before the round's last anchor chunk left) and stops, exit
// 0, when the root finishes; a root whose standby is not running goes on
// without it and says so.
TEST(Chaos, StandbyKeepsEveryRoundAndStopsWithTheRoot) {
  ChaosFederation fed(1, 2, 4);
  fed.add_standby();
  fed.start_standby();
  fed.start_all();
  fed.wait_all(std::chrono::seconds(120));
  fed.check_against_audit();
  std::set<uint64_t> stored;
  bool done = false;
  for (const AuditEntry& e : read_audit(fed.audit("standby"))) {
    if (e.event == "replica_stored") stored.insert(e.fields.value("round", uint64_t{0}));
    done = done || e.event == "standby_done";
    EXPECT_NE(e.event, "takeover");
  }
  EXPECT_EQ(stored, (std::set<uint64_t>{1, 2, 3, 4})) << fed.log("standby");
  EXPECT_TRUE(done) << fed.log("standby");
  EXPECT_FALSE(fed.first_after("root", "standby_lost", SysClock::time_point{}))
      << fed.log("root");
  // What the standby costs a round: from the root's checkpoint to the
  // standby holding it (the last anchor chunk waits that long).
  std::map<uint64_t, SysClock::time_point> written;
  for (const AuditEntry& e : read_audit(fed.audit("root"))) {
    if (e.event == "checkpoint") written[e.fields.value("round", uint64_t{0})] = audit_time(e.time);
  }
  std::vector<double> waits;
  uint64_t bytes = 0;
  for (const AuditEntry& e : read_audit(fed.audit("standby"))) {
    if (e.event != "replica_stored") continue;
    auto it = written.find(e.fields.value("round", uint64_t{0}));
    if (it != written.end()) waits.push_back(seconds_between(it->second, audit_time(e.time)));
    bytes = e.fields.value("bytes", uint64_t{0});
  }
  ASSERT_FALSE(waits.empty());
  std::sort(waits.begin(), waits.end());
  report("standby replication, no fault", "root checkpoint streamed to the standby every round",
         0, -1,
         "root checkpoint " + std::to_string(bytes / 1024) + " KiB; checkpoint to standby holding "
         "it: median " + std::to_string(static_cast<int>(waits[waits.size() / 2] * 1000)) +
         " ms, max " + std::to_string(static_cast<int>(waits.back() * 1000)) + " ms");
}

TEST(Chaos, RootGoesOnWithoutItsStandby) {
  ChaosFederation fed(1, 2, 3);
  fed.add_standby();  // named in the topology, never started
  fed.start_all();
  fed.wait_all(std::chrono::seconds(120));
  fed.check_against_audit();
  EXPECT_TRUE(fed.first_after("root", "standby_lost", SysClock::time_point{})) << fed.log("root");
}

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
