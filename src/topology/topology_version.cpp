// Topology versions: the version keys of the file, the successor of a
// version, and what a later version may change in a running federation.
#include "topology/topology_version.hpp"

#include <string>
#include <utility>

#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan {
namespace {

// Longest base64 text a signature field may hold: a DER certificate of at
// most 4 KiB (security::kMaxSignerCertBytes) is under 5.5 KiB of base64.
constexpr size_t kMaxSignatureText = 8192;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool parse_digest(const std::string& hex, std::array<uint8_t, 32>* out) {
  if (hex.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    const int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

// The digest text of one node alone: equal for equal nodes whatever their
// children (a version may add children to an aggregator).
std::string node_text(const Topology& t, NodeSpec n) {
  n.children.clear();
  return topology_detail::canonical_text(t.job(), t.federation(), t.policy(), {n});
}

std::string settings_text(const Topology& t) {
  return topology_detail::canonical_text(t.job(), t.federation(), t.policy(), {});
}

}  // namespace

void topology_detail::read_version(const YamlReader& r, const YAML::Node& doc, uint64_t* version,
                                   std::vector<std::array<uint8_t, 32>>* history,
                                   std::optional<TopologySignature>* signature) {
  if (auto v = doc["version"]) {
    *version = r.u64(v, "topology", "version");
    if (*version < 1 || *version > kMaxCount) {
      r.fail(v, "topology", "'version' must be 1.." + std::to_string(kMaxCount));
    }
  }
  if (auto h = doc["history"]) {
    const std::vector<std::string> list = r.str_list(h, "topology", "history");
    for (size_t i = 0; i < list.size(); ++i) {
      std::array<uint8_t, 32> d{};
      if (!parse_digest(list[i], &d)) {
        r.fail(h[i], "topology",
               "history[" + std::to_string(i) + "] must be a topology digest (64 hex digits)");
      }
      history->push_back(d);
    }
  }
  if (auto s = doc["signature"]) {
    r.expect_map(s, "signature");
    r.check_keys(s, {"cert", "value"}, "signature");
    TopologySignature sig;
    for (const char* key : {"cert", "value"}) {
      if (!s[key]) r.fail(s, "signature", std::string("missing '") + key + "'");
      std::string text = r.str(s[key], "signature", key);
      if (text.empty() || text.size() > kMaxSignatureText) {
        r.fail(s[key], "signature",
               std::string("'") + key + "' must be 1.." + std::to_string(kMaxSignatureText) +
                   " characters of base64");
      }
      (std::string(key) == "cert" ? sig.cert : sig.value) = std::move(text);
    }
    *signature = std::move(sig);
  }
}

bool Topology::knows_digest(const std::array<uint8_t, 32>& digest) const {
  if (digest == digest_) return true;
  for (const auto& d : history_) {
    if (d == digest) return true;
  }
  return false;
}

Topology Topology::as_successor_of(const Topology& previous) const {
  if (previous.job() != job_) {
    throw ConfigError("the new topology is for job '" + job_ + "', the previous version for '" +
                      previous.job() + "'");
  }
  Topology t = *this;
  t.version_ = previous.version_ + 1;
  t.history_ = previous.history_;
  t.history_.push_back(previous.digest_);
  t.signature_.reset();
  t.finalize("<version " + std::to_string(t.version_) + ">");
  return t;
}

Topology Topology::with_signature(TopologySignature signature) const {
  Topology t = *this;
  t.signature_ = std::move(signature);
  return t;
}

namespace topology {

VersionChange version_change(const Topology& current, const Topology& next) {
  const std::string v = "version " + std::to_string(next.version());
  if (next.job() != current.job()) {
    throw ConfigError(v + " is for job '" + next.job() + "', this federation runs '" +
                      current.job() + "'");
  }
  if (next.version() <= current.version()) {
    throw ConfigError(v + " is not later than the running version " +
                      std::to_string(current.version()) + "; a new version counts up");
  }
  const auto& h = next.history();
  const auto& mine = current.history();
  bool continues = h.size() > mine.size() && h[mine.size()] == current.digest();
  for (size_t i = 0; continues && i < mine.size(); ++i) continues = h[i] == mine[i];
  if (!continues) {
    throw ConfigError(v + " was not made from the running version " +
                      std::to_string(current.version()) + " (digest " +
                      current.digest_hex().substr(0, 12) +
                      "): its history does not list it; make it with `fedwan topology sign "
                      "--previous` the running topology");
  }
  if (settings_text(next) != settings_text(current)) {
    throw ConfigError(v + " changes the federation settings or the policy; those are fixed "
                          "while a federation runs (only sites may be added or removed)");
  }
  const auto& old_nodes = current.nodes();
  const auto& new_nodes = next.nodes();
  if (new_nodes.size() < old_nodes.size()) {
    throw ConfigError(v + " has fewer nodes than version " + std::to_string(current.version()) +
                      "; a node's place in the file is its wire id, so mark a site "
                      "'removed: true' instead of deleting it");
  }
  VersionChange change;
  for (size_t i = 0; i < old_nodes.size(); ++i) {
    const NodeSpec& a = old_nodes[i];
    NodeSpec b = new_nodes[i];
    if (a.id != b.id) {
      throw ConfigError(v + " has '" + b.id + "' where version " +
                        std::to_string(current.version()) + " has '" + a.id +
                        "'; keep every node in its place and append new sites at the end");
    }
    if (a.removed && !b.removed) {
      throw ConfigError(v + " brings back '" + a.id +
                        "', which an earlier version removed; add it again under a new id");
    }
    const bool removes = b.removed && !a.removed;
    b.removed = a.removed;
    if (node_text(current, a) != node_text(next, b)) {
      throw ConfigError(v + " changes node '" + a.id +
                        "'; a running federation's nodes stay as they are (only sites may be "
                        "added or removed)");
    }
    if (removes) change.removed.push_back(a.index);
  }
  for (size_t i = old_nodes.size(); i < new_nodes.size(); ++i) {
    const NodeSpec& n = new_nodes[i];
    if (n.role != Role::kSite) {
      throw ConfigError(v + " adds " + role_name(n.role) + " '" + n.id +
                        "'; only sites may be added to a running federation");
    }
    if (n.removed) throw ConfigError(v + " adds '" + n.id + "' already removed");
    change.added.push_back(n.index);
  }
  if (change.added.empty() && change.removed.empty()) {
    throw ConfigError(v + " neither adds nor removes a site");
  }
  return change;
}

}  // namespace topology
}  // namespace fedwan
