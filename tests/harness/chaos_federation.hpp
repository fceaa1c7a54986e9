// The chaos suite's federation of real `fedwan` processes on loopback (root,
// regions, sites, optionally the root's standby), with mutual TLS,
// checkpoints and recorded updates, and the checks every scenario makes
// against the root's audit log (see integration/test_chaos.cpp):
//   * the final global model equals, bit for bit, a replay of exactly the
//     updates the log records as accepted (payloads kept by
//     --record-updates), discarding rounds a restarted root reopened;
//   * no (round, sender, chunk) is accepted twice.
// report() adds a scenario's row (RPO, RTO) to the chaos report.
// Needs FEDWAN_CLI_PATH (the fedwan binary). Not thread safe.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/synthetic.hpp"
#include "harness/audit_replay.hpp"
#include "harness/chaos_report.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/process.hpp"
#include "security/audit_log.hpp"
#include "transport/routing_id.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {

using Env = std::vector<std::pair<std::string, std::string>>;
using SysClock = std::chrono::system_clock;

inline constexpr uint64_t kSeed = 7;
inline constexpr size_t kParams = 20000;

// Parses the audit log's "2026-11-22T10:00:00.123Z" (UTC).
inline SysClock::time_point audit_time(const std::string& t) {
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
  // root -> `regions` regions -> `sites` sites each, fp16, DiLoCo, 5 chunks;
  // `overlap_steps` > 0: overlapped rounds; `streams` TCP connections per
  // link.
  // `adjust` may change the federation's settings before the topology is
  // built (differential privacy, say).
  ChaosFederation(int regions, int sites, uint64_t rounds = 6, uint64_t overlap_steps = 0,
                  uint64_t streams = 1,
                  const std::function<void(FederationSpec&)>& adjust = nullptr) {
    FederationSpec fed;
    fed.rounds = rounds;
    fed.inner_steps = 3;
    fed.overlap_steps = overlap_steps;
    fed.streams = streams;
    fed.codec = "fp16";
    fed.chunk_bytes = 16384;
    fed.outer.name = "diloco";
    fed.round_timeout_s = 90;
    fed.heartbeat_s = 0.3;
    fed.heartbeat_timeout_s = 2;
    if (adjust) adjust(fed);
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
  void place(const std::string& node, const std::string& bind_host, const std::string& reach_host) {
    std::vector<NodeSpec> nodes = topo_.nodes();
    for (NodeSpec& n : nodes) {
      if (n.id != node) continue;
      n.bind = "tcp://" + bind_host + ":" + std::to_string(ports_[node]);
      n.endpoint = "tcp://" + reach_host + ":" + std::to_string(ports_[node]);
    }
    topo_ = Topology::build("chaos", topo_.federation(), nodes);
    write_topology();
  }

  // The synthetic model's parameters (kParams unless set before start).
  void set_params(size_t n) { params_ = n; }
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
  // Its last `lines` lines.
  std::string log_tail(const std::string& node, size_t lines) const {
    const std::string text = log(node);
    size_t at = text.size();
    for (size_t n = 0; n <= lines && at > 0; ++n) {
      const size_t nl = text.rfind('\n', at - 1);
      if (nl == std::string::npos) return text;
      at = nl;
    }
    return text.substr(at == 0 ? 0 : at + 1);
  }
  // The newest round of which `parent` keeps a replica of `child` (0: none).
  uint64_t newest_replica(const std::string& parent, const std::string& child) const {
    uint64_t newest = 0;
    std::error_code ec;
    for (const auto& e :
         std::filesystem::directory_iterator(checkpoint_dir(parent) / "replicas" / child, ec)) {
      unsigned long long r = 0;
      if (std::sscanf(e.path().filename().c_str(), "round-%llu.fwck", &r) == 1) {
        newest = std::max<uint64_t>(newest, r);
      }
    }
    return newest;
  }

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
                                     "--topology",
                                     (dir_.path() / "topology.yaml").string(),
                                     "--node",
                                     node,
                                     "--trainer",
                                     "synthetic",
                                     "--synthetic-size",
                                     std::to_string(params_),
                                     "--seed",
                                     std::to_string(kSeed),
                                     "--join-timeout",
                                     "60",
                                     "--credentials",
                                     security_for(topo_, node).credentials_dir,
                                     "--audit-log",
                                     audit(name).string(),
                                     "--checkpoint-dir",
                                     checkpoint_dir(name).string()};
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
    const std::vector<float> init = synthetic::initial_model(params_, kSeed);
    std::vector<std::filesystem::path> logs = {audit(topo_.root().id)};
    if (standby_ && std::filesystem::exists(audit("standby"))) logs.push_back(audit("standby"));
    ReplayResult r = replay_root_audits(topo_, init, logs, dir_.path() / "store");
    EXPECT_TRUE(r.problems.empty()) << ::testing::PrintToString(r.problems);
    EXPECT_EQ(r.rounds_committed, topo_.federation().rounds);
    const std::vector<float> global = read_model(model_path());
    EXPECT_EQ(global.size(), params_);
    if (global.size() == r.global.size()) {
      EXPECT_EQ(0, std::memcmp(global.data(), r.global.data(), params_ * sizeof(float)))
          << "the final model is not the replay of the accepted updates";
    }
    const uint64_t chunk_bytes = topo_.federation().chunk_bytes;
    const uint32_t chunks = static_cast<uint32_t>((params_ * 4 + chunk_bytes - 1) / chunk_bytes);
    for (const auto& [key, n] : r.accepted_by_round_sender) {
      EXPECT_LE(n, static_cast<int>(chunks)) << "round " << key.first << " sender " << key.second;
    }
    for (const std::filesystem::path& p : logs) {
      const security::AuditVerifyResult v = security::verify_audit_file(p.string());
      EXPECT_TRUE(v.ok) << p << ": " << v.problem;
    }
    // Crashes, restarts and partitions tamper with nothing: what they leave
    // on the way is a frame of another session, never a rejected one, and
    // no node of the federation is refused a link (on any of its
    // connections).
    if (!rejections_expected_) {
      std::vector<std::string> names;
      for (const NodeSpec& n : topo_.nodes()) names.push_back(n.id);
      if (standby_) names.emplace_back("standby");
      // The first one reported comes with both ends' last log lines: a rare
      // failure is understood from the run that had it.
      bool told = false;
      const auto ends = [&](const std::string& name, const AuditEntry& e) {
        if (told) return std::string();
        told = true;
        std::string out = "\n--- " + name + "'s log, last lines:\n" + log_tail(name, 60);
        const std::string peer = transport::untagged_routing_id(e.fields.value("peer", ""));
        const std::string node = peer.substr(0, peer.find('~'));
        if (node != name && std::filesystem::exists(log_path(node))) {
          out += "--- " + node + "'s log, last lines:\n" + log_tail(node, 60);
        }
        return out;
      };
      for (const std::string& name : names) {
        if (!std::filesystem::exists(audit(name))) continue;
        for (const AuditEntry& e : read_audit(audit(name))) {
          if (e.event == "frame_rejected") {
            ADD_FAILURE() << name << " rejected a frame: " << e.fields.dump() << ends(name, e);
          }
          if (e.event == "handshake" && e.fields.value("decision", "") == "refused") {
            ADD_FAILURE() << name << " refused a link: " << e.fields.dump() << ends(name, e);
          }
        }
      }
    }
    return r;
  }

  // Frames the scenario damages on the way (a proxy that duplicates or
  // corrupts them) are rejected as they should be: check_against_audit
  // then does not fail on `frame_rejected` or refused `handshake` entries.
  void expect_rejected_frames() { rejections_expected_ = true; }

  // The first entry of `event` at `node` logged after `t` (its time).
  std::optional<SysClock::time_point> first_after(const std::string& node, const std::string& event,
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
  void write_topology() { std::ofstream(dir_.path() / "topology.yaml") << topo_.to_yaml(); }

  TempDir dir_;
  Topology topo_;
  std::map<std::string, int> ports_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, bool> started_, crashed_;
  bool standby_ = false;
  bool rejections_expected_ = false;
  size_t params_ = kParams;
};

inline double seconds_between(SysClock::time_point a, std::optional<SysClock::time_point> b) {
  return b ? std::chrono::duration<double>(*b - a).count() : -1;
}

inline void report(const std::string& scenario, const std::string& mechanism, uint64_t rpo,
                   double rto, const std::string& notes) {
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

}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
