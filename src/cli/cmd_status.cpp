// `fedwan status --topology T [--json] [--timeout S]`: the live tree of a
// running federation, read from every node's HTTP status (its `metrics`
// address in the topology) and, for each child, from its parent's view:
// round, last heartbeat, bytes, health, participation window, membership.
// A node is healthy when it answers and its parent heard from it within the
// heartbeat timeout. Exit 0 when every node is healthy, 3 otherwise.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "metrics/http_get.hpp"

namespace fedwan::cli {
namespace {

using json = nlohmann::json;

struct StatusArgs {
  std::string topology;
  bool json = false;
  double timeout_s = 2;
};

struct NodeView {
  const NodeSpec* spec = nullptr;
  json self;          // its own /status (null when it did not answer)
  std::string error;  // why not
  json seen;          // its parent's entry for it (null at the root, or unknown)
  bool healthy = false;
  std::string health;  // "healthy" or why not
};

std::string bytes_text(uint64_t b) {
  char buf[32];
  if (b >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  } else if (b >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  }
  return buf;
}

std::string seconds_text(const json& v) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", v.get<double>());
  return buf;
}

// Reads every node, then judges each from its own answer and its parent's.
std::map<std::string, NodeView> look(const Topology& topo, std::chrono::milliseconds timeout) {
  std::map<std::string, NodeView> views;
  for (const NodeSpec& n : topo.nodes()) {
    NodeView& v = views[n.id];
    v.spec = &n;
    if (n.removed) continue;  // taken out by a topology version: nothing runs there
    if (n.metrics.empty()) {
      v.error = "no metrics address in the topology";
      continue;
    }
    const metrics::HttpResponse r = metrics::http_get(n.metrics, "/status", timeout);
    if (r.status != 200) {
      v.error = r.status == 0 ? r.error : "HTTP " + std::to_string(r.status);
      continue;
    }
    v.self = json::parse(r.body, nullptr, false);
    if (!v.self.is_object() || v.self.value("node", "") != n.id) {
      v.error = v.self.is_object()
                    ? "answers as '" + v.self.value("node", "?") + "', not '" + n.id + "'"
                    : "its status is not JSON";
      v.self = nullptr;
    }
  }
  for (auto& [id, v] : views) {
    if (v.spec->role == Role::kRoot) continue;
    const NodeView& parent = views[topo.node(v.spec->parent_index).id];
    if (!parent.self.is_object()) continue;
    for (const json& c : parent.self.value("children", json::array())) {
      if (c.value("id", "") == id) v.seen = c;
    }
  }
  for (auto& [id, v] : views) {
    if (v.spec->removed) {
      v.healthy = true;
      v.health = "removed";
      continue;
    }
    if (v.self.is_null()) {
      v.health = "unreachable: " + v.error;
    } else if (v.seen.is_object() && !v.seen.value("healthy", false)) {
      v.health = "parent has not heard from it for " + seconds_text(v.seen["last_seen_s"]);
    } else {
      v.healthy = true;
      v.health = "healthy";
    }
    if (v.seen.is_object() && v.seen.value("membership", "member") != "member" &&
        v.self.is_null()) {
      // A site that left or paused is not running: that is its state, not a fault.
      v.healthy = true;
      v.health = v.seen.value("membership", "");
    }
  }
  return views;
}

void print_tree(const Topology& topo, const std::map<std::string, NodeView>& views, uint32_t index,
                int depth) {
  const NodeSpec& n = topo.node(index);
  const NodeView& v = views.at(n.id);
  std::string line(static_cast<size_t>(depth) * 2, ' ');
  line += n.id + " (" + role_name(n.role) + ")";
  char buf[512];
  const json& s = v.self;
  const json& seen = v.seen;
  const std::string round = s.is_object() ? std::to_string(s.value("round", uint64_t{0}) + 1) +
                                                "/" + std::to_string(s.value("rounds", uint64_t{0}))
                            : seen.is_object()
                                ? std::to_string(seen.value("round", uint64_t{0}) + 1) + "?"
                                : "-";
  std::string membership = seen.is_object() ? seen.value("membership", "-") : std::string("-");
  if (n.role != Role::kSite && s.is_object()) {
    membership = std::to_string(s.value("members", 0)) + " member sites";
  }
  const uint64_t sent = s.is_object() ? s.value("bytes_sent", uint64_t{0}) : 0;
  const uint64_t received = s.is_object() ? s.value("bytes_received", uint64_t{0}) : 0;
  std::string window = "-";
  if (n.role == Role::kSite) {
    window = n.windows.empty() ? "always" : "";
    for (const std::string& w : n.windows) window += (window.empty() ? "" : ",") + w;
    if (s.is_object() && s.value("paused", false)) window += " (paused)";
  }
  std::snprintf(buf, sizeof buf, "%-28s round %-7s heard %-8s %-22s window %-14s %s", line.c_str(),
                round.c_str(),
                seconds_text(seen.is_object() ? seen["last_seen_s"] : json()).c_str(),
                membership.c_str(), window.c_str(), v.health.c_str());
  std::string out = buf;
  if (n.role == Role::kSite && s.is_object()) {
    out += "  sent " + bytes_text(sent) + ", received " + bytes_text(received);
  }
  std::cout << out << "\n";
  for (uint32_t c : n.children) print_tree(topo, views, c, depth + 1);
}

int run_status(const StatusArgs& a) {
  const Topology topo = Topology::load(a.topology);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  const std::map<std::string, NodeView> views = look(topo, timeout);
  bool all = true;
  for (const auto& [id, v] : views) all = all && v.healthy;
  if (a.json) {
    json nodes = json::array();
    for (const NodeSpec& n : topo.nodes()) {
      const NodeView& v = views.at(n.id);
      nodes.push_back({{"node", n.id},
                       {"role", role_name(n.role)},
                       {"parent", n.parent},
                       {"healthy", v.healthy},
                       {"health", v.health},
                       {"status", v.self},
                       {"seen_by_parent", v.seen}});
    }
    std::cout << json({{"job", topo.job()}, {"healthy", all}, {"nodes", nodes}}).dump(2) << "\n";
  } else {
    std::cout << "federation '" << topo.job() << "' (" << topo.nodes().size() << " nodes)\n";
    print_tree(topo, views, topo.root().index, 0);
  }
  return all ? 0 : 3;
}

}  // namespace

void add_status_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<StatusArgs>();
  CLI::App* cmd = app.add_subcommand(
      "status",
      "show the live tree of a running federation: every node's round, last heartbeat, bytes, "
      "health, window and membership, read from the nodes' metrics addresses (exit 3 when a "
      "node is unhealthy)");
  cmd->add_option("--topology", args->topology, "the federation's topology file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_flag("--json", args->json, "print one JSON object instead of the tree");
  cmd->add_option("--timeout", args->timeout_s, "seconds to wait for each node's answer")
      ->check(CLI::Range(0.1, 60.0))
      ->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = run_status(*args); });
}

}  // namespace fedwan::cli
