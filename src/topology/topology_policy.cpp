// Residency policy of a topology: the `policy:` mapping and the nodes'
// `jurisdiction`, `allowed_jurisdictions` and `k_min` keys, their checks at
// load, and the checks the runtime asks of a loaded topology (k_min_for,
// residency_refusal). topology.cpp has the file format.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/node_id.hpp"
#include "fedwan/topology.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan {
namespace topology_detail {
namespace {

constexpr size_t kMaxJurisdictionLength = 32;

const std::vector<std::string> kPolicyKeys = {"k_min"};

// "" when `label` is a valid jurisdiction, else what is wrong with it.
std::string label_problem(const std::string& what, const std::string& label) {
  if (label.size() <= kMaxJurisdictionLength && is_valid_node_id(label)) return "";
  return what + " '" + label +
         "' is invalid; use 1..32 characters of [A-Za-z0-9._-], such as EU or US-CA";
}

// "" when a node of `role` may carry residency key `key`, else why not.
std::string misplaced_residency_key(const std::string& key, Role role) {
  if (key == "jurisdiction" && role == Role::kSite) {
    return "'jurisdiction' applies to root and region nodes, which receive deltas; a site "
           "says where its delta may go with 'allowed_jurisdictions'";
  }
  if (key == "allowed_jurisdictions" && role != Role::kSite) {
    return "'allowed_jurisdictions' applies to sites only; give an aggregator a "
           "'jurisdiction' instead";
  }
  if (key == "k_min" && role == Role::kSite) {
    return "'k_min' applies to regions only; a site sends only its own delta";
  }
  if (key == "k_min" && role == Role::kRoot) {
    return "'k_min' applies to regions only; the root is the final destination and sends "
           "nothing upward (policy.k_min sets the default of all regions)";
  }
  return "";
}

// Why `site` may not send its delta to aggregator `to` by jurisdiction alone,
// or nullopt. `to_name` says how to refer to `to` ("its parent", "aggregator").
std::optional<std::string> jurisdiction_refusal(const NodeSpec& site, const NodeSpec& to,
                                                const std::string& to_name) {
  const std::vector<std::string>& allowed = site.allowed_jurisdictions;
  if (allowed.empty() ||
      std::find(allowed.begin(), allowed.end(), to.jurisdiction) != allowed.end()) {
    return std::nullopt;
  }
  return "site '" + site.id + "' may send its delta only to [" + join(allowed) + "]; " + to_name +
         " '" + to.id + "' " +
         (to.jurisdiction.empty() ? std::string("has no jurisdiction")
                                  : "is in jurisdiction '" + to.jurisdiction + "'");
}

uint32_t read_k_min(const YamlReader& r, const YAML::Node& n, const std::string& ctx) {
  uint64_t v = r.u64(n, ctx, "k_min");
  if (v < 1 || v > UINT32_MAX) {
    r.fail(n, ctx, "k_min " + std::to_string(v) + " is invalid; use an integer >= 1");
  }
  return static_cast<uint32_t>(v);
}

}  // namespace

PolicySpec read_policy(const YamlReader& r, const YAML::Node& n) {
  PolicySpec p;
  r.expect_map(n, "policy");
  r.check_keys(n, kPolicyKeys, "policy");
  if (auto v = n["k_min"]) p.k_min = read_k_min(r, v, "policy");
  return p;
}

void read_residency(const YamlReader& r, const YAML::Node& n, const std::string& ctx, NodeSpec& s) {
  for (const char* key : {"jurisdiction", "allowed_jurisdictions", "k_min"}) {
    YAML::Node v = n[key];
    std::string why = v ? misplaced_residency_key(key, s.role) : "";
    if (!why.empty()) r.fail(v, ctx, why);
  }
  if (auto v = n["jurisdiction"]) {
    s.jurisdiction = r.str(v, ctx, "jurisdiction");
    std::string why = label_problem("jurisdiction", s.jurisdiction);
    if (!why.empty()) r.fail(v, ctx, why);
  }
  if (auto v = n["allowed_jurisdictions"]) {
    if (!v.IsSequence()) {
      r.fail(v, ctx, "'allowed_jurisdictions' must be a list of jurisdictions, such as [EU]");
    }
    for (size_t i = 0; i < v.size(); ++i) {
      std::string label = r.str(v[i], ctx, "allowed_jurisdictions[" + std::to_string(i) + "]");
      std::string why = label_problem("allowed jurisdiction", label);
      const auto& seen = s.allowed_jurisdictions;
      if (why.empty() && std::find(seen.begin(), seen.end(), label) != seen.end()) {
        why = "allowed_jurisdictions lists '" + label + "' twice";
      }
      if (!why.empty()) r.fail(v[i], ctx, why);
      s.allowed_jurisdictions.push_back(label);
    }
  }
  if (auto v = n["k_min"]) s.k_min = read_k_min(r, v, ctx);
}

std::string residency_field_problem(const NodeSpec& s) {
  const std::pair<const char*, bool> present[] = {
      {"jurisdiction", !s.jurisdiction.empty()},
      {"allowed_jurisdictions", !s.allowed_jurisdictions.empty()},
      {"k_min", s.k_min != 0}};
  for (const auto& [key, set] : present) {
    std::string why = set ? misplaced_residency_key(key, s.role) : "";
    if (!why.empty()) return why;
  }
  if (!s.jurisdiction.empty()) {
    std::string why = label_problem("jurisdiction", s.jurisdiction);
    if (!why.empty()) return why;
  }
  const std::vector<std::string>& allowed = s.allowed_jurisdictions;
  for (auto it = allowed.begin(); it != allowed.end(); ++it) {
    std::string why = label_problem("allowed jurisdiction", *it);
    if (!why.empty()) return why;
    if (std::find(allowed.begin(), it, *it) != it) {
      return "allowed_jurisdictions lists '" + *it + "' twice";
    }
  }
  return "";
}

std::optional<std::string> residency_tree_problem(const Topology& t) {
  // A site's allowed list is checked against its parent only: what its
  // parent sends further up is an aggregate, and k_min is what keeps that
  // aggregate from being one site's delta.
  for (const NodeSpec& s : t.nodes()) {
    if (s.role == Role::kSite) {
      const NodeSpec& p = t.node(s.parent_index);
      if (auto why = jurisdiction_refusal(s, p, "its parent")) {
        return *why + (p.jurisdiction.empty()
                           ? "; give '" + p.id + "' a jurisdiction from that list"
                           : "; move the site under an aggregator in one of them or add '" +
                                 p.jurisdiction + "' to its allowed_jurisdictions");
      }
    } else if (s.role == Role::kRegion) {
      size_t have = t.sites_under(s.index).size();
      uint32_t need = t.k_min_for(s.index);
      if (have < need) {
        std::string rule = need == 2 ? std::string("no single site's delta may leave its region")
                                     : "no aggregate of fewer than " + std::to_string(need) +
                                           " sites may leave its region";
        const char* from =
            s.k_min != 0 ? "set on the region" : "set by policy.k_min; a region may set its own";
        return "region '" + s.id + "' aggregates " + std::to_string(have) +
               (have == 1 ? " site" : " sites") + " but residency policy requires k_min " +
               std::to_string(need) + ": " + rule + "; add sites or lower k_min (" + from + ")";
      }
    }
  }
  return std::nullopt;
}

}  // namespace topology_detail

uint32_t Topology::k_min_for(uint32_t region_index) const {
  const NodeSpec& s = nodes_.at(region_index);
  if (s.role != Role::kRegion) return 1;
  return s.k_min != 0 ? s.k_min : policy_.k_min;
}

std::optional<std::string> Topology::residency_refusal(const std::string& site_id,
                                                       const std::string& aggregator_id) const {
  const NodeSpec* site = find(site_id);
  if (site == nullptr) return "sender '" + site_id + "' is not a node of topology '" + job_ + "'";
  if (site->role != Role::kSite) {
    return "'" + site_id + "' is a " + role_name(site->role) +
           ", not a site; only sites send deltas";
  }
  const NodeSpec* to = find(aggregator_id);
  if (to == nullptr) {
    return "aggregator '" + aggregator_id + "' is not a node of topology '" + job_ + "'";
  }
  if (to->role == Role::kSite) return "'" + aggregator_id + "' is a site, not an aggregator";
  // Jurisdiction before parentage: a delta headed out of its allowed
  // jurisdictions is the breach an audit log must name, even when the
  // aggregator is also the wrong one.
  if (auto why = topology_detail::jurisdiction_refusal(*site, *to, "aggregator")) return why;
  if (to->index != site->parent_index) {
    return "site '" + site_id + "' reports to '" + site->parent + "', not to '" + aggregator_id +
           "'";
  }
  return std::nullopt;
}

}  // namespace fedwan
