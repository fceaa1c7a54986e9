// `fedwan status --topology T [--json] [--timeout S]`: the live tree of a
// running federation, read from every node's HTTP status (its `metrics`
// address in the topology) and, for each child, from its parent's view:
// round, last heartbeat, bytes, health, participation window, membership.
// A node is healthy when it answers and its parent heard from it within the
// heartbeat timeout. Exit 0 when every node is healthy, 3 otherwise.
//
// Every answer is untrusted: read type-safely (cli/node_status.hpp; a node
// whose answer is malformed is shown so, and unhealthy, and every other node
// still is), and every string from a node reaches the terminal through
// terminal_text (common/terminal_text.hpp). --json output is ASCII only.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/node_status.hpp"
#include "common/terminal_text.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "metrics/bearer_token.hpp"
#include "metrics/http_get.hpp"

namespace fedwan::cli {
namespace {

using json = nlohmann::json;

struct StatusArgs {
  std::string topology;
  bool json = false;
  double timeout_s = 2;
  std::string token_file;
};

// Longest piece of a node's text in one cell of the tree.
constexpr size_t kCellBytes = 64;

struct NodeView {
  const NodeSpec* spec = nullptr;
  std::optional<NodeStatus> self;  // its own /status, when it answered well formed
  json raw;                        // that answer as it came (for --json), else null
  std::string error;               // why not: unreachable, or what is malformed
  bool malformed = false;
  std::optional<ChildSeen> seen;  // its parent's entry for it (none at the root, or unknown)
  json seen_raw;                  // that entry as it came (for --json), else null
  bool healthy = false;
  std::string health;  // "healthy" or why not; terminal-safe
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

std::string seconds_text(std::optional<double> v) {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", *v);
  return buf;
}

// A node's own text, ready for the terminal.
std::string shown(const std::string& s) { return terminal_text(s, kCellBytes); }

void read_node(const NodeSpec& n, std::chrono::milliseconds timeout, const std::string& token,
               NodeView* v) {
  if (n.metrics.empty()) {
    v->error = "no metrics address in the topology";
    return;
  }
  const metrics::HttpResponse r =
      metrics::http_get(n.metrics, "/status", timeout, metrics::kHttpGetMaxBytes, token);
  if (r.status != 200) {
    v->error = r.status == 0 ? r.error : "HTTP " + std::to_string(r.status);
    if (r.status == 401) v->error += " (give the endpoint's token with --token-file)";
    return;
  }
  StatusReading reading = read_node_status(r.body, n.id);
  if (!reading.status) {
    v->malformed = true;
    v->error = std::move(reading.malformed);
    return;
  }
  v->self = std::move(reading.status);
  v->raw = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
}

// Reads every node, then judges each from its own answer and its parent's.
std::map<std::string, NodeView> look(const Topology& topo, std::chrono::milliseconds timeout,
                                     const std::string& token) {
  std::map<std::string, NodeView> views;
  for (const NodeSpec& n : topo.nodes()) {
    NodeView& v = views[n.id];
    v.spec = &n;
    if (n.removed) continue;  // taken out by a topology version: nothing runs there
    read_node(n, timeout, token, &v);
  }
  for (auto& [id, v] : views) {
    if (v.spec->role == Role::kRoot) continue;
    const NodeView& parent = views[topo.node(v.spec->parent_index).id];
    if (!parent.self) continue;
    for (const ChildSeen& c : parent.self->children) {
      if (c.id == id) v.seen = c;
    }
    // Well formed, so "children" is an array of objects whose ids are strings.
    for (const json& c : parent.raw.value("children", json::array())) {
      const auto cid = c.find("id");
      if (cid != c.end() && cid->is_string() && *cid == id) v.seen_raw = c;
    }
  }
  for (auto& [id, v] : views) {
    if (v.spec->removed) {
      v.healthy = true;
      v.health = "removed";
      continue;
    }
    if (v.malformed) {
      v.health = "malformed: " + terminal_text(v.error, 2 * kCellBytes);
    } else if (!v.self) {
      v.health = "unreachable: " + terminal_text(v.error, 4 * kCellBytes);
    } else if (v.seen && !v.seen->healthy.value_or(true)) {
      v.health = "parent has not heard from it for " + seconds_text(v.seen->last_seen_s);
    } else {
      v.healthy = true;
      v.health = "healthy";
    }
    if (v.seen && v.seen->membership.value_or("member") != "member" && !v.self && !v.malformed) {
      // A site that left or paused is not running: that is its state, not a fault.
      v.healthy = true;
      v.health = shown(*v.seen->membership);
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
  const std::optional<NodeStatus>& s = v.self;
  const std::optional<ChildSeen>& seen = v.seen;
  std::string round = "-";
  if (s) {
    round = std::to_string(s->round.value_or(0) + 1) + "/" + std::to_string(s->rounds.value_or(0));
  } else if (seen) {
    round = std::to_string(seen->round.value_or(0) + 1) + "?";
  }
  std::string membership = seen && seen->membership ? shown(*seen->membership) : "-";
  if (n.role != Role::kSite && s) {
    membership = std::to_string(s->members.value_or(0)) + " member sites";
  }
  std::string window = "-";
  if (n.role == Role::kSite) {
    window = n.windows.empty() ? "always" : "";
    for (const std::string& w : n.windows) window += (window.empty() ? "" : ",") + w;
    if (s && s->paused) window += " (paused)";
  }
  char buf[1024];
  std::snprintf(buf, sizeof buf, "%-28s round %-7s heard %-8s %-22s window %-14s %s", line.c_str(),
                round.c_str(), seconds_text(seen ? seen->last_seen_s : std::nullopt).c_str(),
                membership.c_str(), window.c_str(), v.health.c_str());
  std::string out = buf;
  if (seen && seen->flagged) {
    out += "  FLAGGED by its parent: " + std::to_string(seen->refused.value_or(0)) +
           " copies refused, " + std::to_string(seen->clipped.value_or(0)) + " clipped";
  } else if (seen && (seen->refused.value_or(0) > 0 || seen->clipped.value_or(0) > 0)) {
    out += "  copies refused " + std::to_string(seen->refused.value_or(0)) + ", clipped " +
           std::to_string(seen->clipped.value_or(0));
  }
  if (n.role == Role::kRoot && s && s->privacy_epsilon) {
    char p[160];
    std::snprintf(p, sizeof p, "  privacy: epsilon %.4g spent at delta %.3g", *s->privacy_epsilon,
                  s->privacy_delta.value_or(0));
    out += p;
    if (s->privacy_budget.value_or(0) > 0) {
      std::snprintf(p, sizeof p, " (budget %.4g)", *s->privacy_budget);
      out += p;
    }
    if (s->privacy_mode) out += ", " + shown(*s->privacy_mode);
    if (s->privacy_clip) {
      std::snprintf(p, sizeof p, ", clip %.4g", *s->privacy_clip);
      out += p;
    }
  }
  if (n.role == Role::kSite && s) {
    out += "  sent " + bytes_text(s->bytes_sent.value_or(0)) + ", received " +
           bytes_text(s->bytes_received.value_or(0));
  }
  std::cout << out << "\n";
  for (uint32_t c : n.children) print_tree(topo, views, c, depth + 1);
}

int run_status(const StatusArgs& a) {
  const Topology topo = Topology::load(a.topology);
  const std::string token =
      a.token_file.empty() ? std::string() : metrics::read_bearer_token_file(a.token_file);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  const std::map<std::string, NodeView> views = look(topo, timeout, token);
  bool all = true;
  for (const auto& [id, v] : views) all = all && v.healthy;
  if (a.json) {
    json nodes = json::array();
    for (const NodeSpec& n : topo.nodes()) {
      const NodeView& v = views.at(n.id);
      json node = {{"node", n.id},
                   {"role", role_name(n.role)},
                   {"parent", n.parent},
                   {"healthy", v.healthy},
                   {"health", v.health},
                   {"status", v.raw},
                   {"seen_by_parent", v.seen_raw}};
      if (v.malformed) node["malformed"] = v.error;
      node["flagged"] = v.seen && v.seen->flagged;
      nodes.push_back(std::move(node));
    }
    // ASCII only: whatever a node put in its strings arrives as \u escapes.
    std::cout << json({{"job", topo.job()}, {"healthy", all}, {"nodes", nodes}})
                     .dump(2, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace)
              << "\n";
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
  cmd->add_option("--token-file", args->token_file,
                  "file holding the bearer token the nodes' metrics endpoints require (their "
                  "--metrics-token-file)")
      ->check(CLI::ExistingFile);
  cmd->callback([args, exit_code] { *exit_code = run_status(*args); });
}

}  // namespace fedwan::cli
