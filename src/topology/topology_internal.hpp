// Private to the translation units of Topology: topology.cpp (the YAML
// structure), topology_finalize.cpp (the checks of the tree, the canonical
// text of the digest), topology_rules.cpp (endpoints, nesting,
// standby keys, tcp_congestion, the ranges of the federation settings) and
// topology_policy.cpp (the residency policy: jurisdiction,
// allowed_jurisdictions, k_min, policy, and the runtime checks on them).
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"

namespace fedwan::topology_detail {

// "a, b, c".
std::string join(const std::vector<std::string>& v);

// Reads typed values from the YAML tree; every error is a ConfigError naming
// source:line:col, the context (e.g. "node 'eu'") and the problem. Holds a
// reference to `source`, which must outlive it.
class YamlReader {
 public:
  explicit YamlReader(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& ctx,
                         const std::string& msg) const {
    std::string where = source_;
    if (at && !at.Mark().is_null()) {
      where +=
          ":" + std::to_string(at.Mark().line + 1) + ":" + std::to_string(at.Mark().column + 1);
    }
    throw ConfigError(where + ": " + ctx + ": " + msg);
  }

  void expect_map(const YAML::Node& n, const std::string& ctx) const {
    if (!n.IsMap()) fail(n, ctx, "expected a mapping of key: value");
  }

  // Unknown and repeated keys are both errors (yaml-cpp keeps only one of a
  // repeated key, which would silently drop a setting).
  void check_keys(const YAML::Node& map, const std::vector<std::string>& known,
                  const std::string& ctx) const {
    std::vector<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (!it->first.IsScalar()) fail(it->first, ctx, "keys must be plain names");
      const std::string& key = it->first.Scalar();
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        fail(it->first, ctx, "unknown key '" + key + "'; known keys are " + join(known));
      }
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
        fail(it->first, ctx, "key '" + key + "' given twice");
      }
      seen.push_back(key);
    }
  }

  std::string str(const YAML::Node& n, const std::string& ctx, const std::string& key) const {
    if (!n.IsScalar()) fail(n, ctx, "'" + key + "' must be a string");
    return n.Scalar();
  }

  uint64_t u64(const YAML::Node& n, const std::string& ctx, const std::string& key) const {
    std::string s = n.IsScalar() ? n.Scalar() : std::string();
    uint64_t v = 0;
    auto res = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size()) {
      fail(n, ctx, "'" + key + "' must be a non-negative integer, got '" + s + "'");
    }
    return v;
  }

  bool boolean(const YAML::Node& n, const std::string& ctx, const std::string& key) const {
    const std::string s = n.IsScalar() ? n.Scalar() : std::string();
    if (s == "true") return true;
    if (s == "false") return false;
    fail(n, ctx, "'" + key + "' must be true or false, got '" + s + "'");
  }

  std::vector<std::string> str_list(const YAML::Node& n, const std::string& ctx,
                                    const std::string& key) const {
    if (!n.IsSequence()) fail(n, ctx, "'" + key + "' must be a list of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < n.size(); ++i) {
      out.push_back(str(n[i], ctx, key + "[" + std::to_string(i) + "]"));
    }
    return out;
  }

  double f64(const YAML::Node& n, const std::string& ctx, const std::string& key) const {
    std::string s = n.IsScalar() ? n.Scalar() : std::string();
    double v = 0;
    auto res = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size()) {
      fail(n, ctx, "'" + key + "' must be a number, got '" + s + "'");
    }
    return v;
  }

 private:
  const std::string& source_;
};

// ---- rules of the tree and the federation settings (topology_rules.cpp) -----

// Ranges of the federation settings: wide enough for any deployment, narrow
// enough that every conversion (seconds to milliseconds, sums of weights)
// stays exact and no timer can spin.
inline constexpr uint64_t kMinChunkBytes = 4096;
inline constexpr uint64_t kMaxChunkBytes = 4u << 20;
inline constexpr uint64_t kMaxCount = 1'000'000'000;    // rounds, inner_steps, replica_every
inline constexpr double kMaxRoundSeconds = 30 * 86400;  // round_timeout_s, deadline_s
inline constexpr double kMinRoundSeconds = 0.1;
inline constexpr double kMinHeartbeatSeconds = 0.01;
inline constexpr double kMaxHeartbeatSeconds = 3600;
inline constexpr double kMaxHeartbeatTimeoutSeconds = 86400;
inline constexpr double kMaxSiteWeight = 1e12;
inline constexpr uint64_t kMaxSiteDevices = 1000000;  // NodeSpec::devices
// A topology file is a few KiB; one past this is not one, and is not read.
inline constexpr size_t kMaxTopologyBytes = size_t{4} << 20;
// yaml-cpp parses nesting recursively: deeper than this is refused first.
inline constexpr size_t kMaxYamlNesting = 64;
// The kernel's TCP_CA_NAME_MAX (16) less its terminating NUL.
inline constexpr size_t kMaxCongestionNameLength = 15;
// federation.tcp_congestion's value that leaves the host's default alone.
inline constexpr const char* kSystemCongestion = "system";

// tcp://HOST:PORT with a port in 1..65535, ipc://PATH or inproc://NAME.
bool valid_endpoint(const std::string& e);
// host:port with a port 0..65535 and a host of [A-Za-z0-9.-] or [v6].
bool valid_metrics_address(const std::string& a);
std::string invalid_endpoint(const std::string& what, const std::string& e);
// Deepest nesting of flow collections and of block sequences on one line.
size_t yaml_nesting(const std::string& text);
// "" when a node of `role` may carry standby key `key`, else why not.
std::string misplaced_standby_key(const std::string& key, Role role);
// First problem with node `s`'s standby fields ("" if none); defaults the
// root's standby_bind to its standby_endpoint.
std::string standby_problem(NodeSpec& s);
// "" when `name` may be a tcp_congestion value (a congestion control name
// or "system"), else what is wrong with it and what to write instead.
std::string tcp_congestion_problem(const std::string& name);
// "" when `bytes` may be a socket_buffer_bytes value, else why not.
std::string socket_buffer_problem(uint64_t bytes);
// "" when `streams` may be a streams value (auto, or 1 to 16), else why not.
std::string streams_problem(uint64_t streams);
// "" when `max` may be a max_streams value (1 to 64), else why not.
std::string max_streams_problem(uint64_t max);
// `auto` or the count.
std::string streams_text(uint64_t streams);
// Throws ConfigError naming `src` for a federation value out of range.
void validate_federation(const FederationSpec& f, const std::string& src);
// Why aggregation settings cannot work (an unknown rule, params the rule
// refuses, a bad check setting), or nullopt.
std::optional<std::string> aggregation_spec_problem(const AggregationSpec& a);

// ---- Topology::finalize's steps (topology_finalize.cpp) ----------------------

// Throws: a ConfigError naming the source, with the message given.
using Fail = std::function<void(const std::string& message)>;
void check_settings(const std::string& job, const FederationSpec& federation,
                    const PolicySpec& policy, const std::vector<NodeSpec>& nodes,
                    const std::string& src, const Fail& fail);
// Each node on its own (id, role, residency and standby fields, endpoints or
// weight); sets index, clears the links. Returns the root's index.
uint32_t check_nodes(std::vector<NodeSpec>& nodes, const Fail& fail);
void check_one_transport(const std::vector<NodeSpec>& nodes, const Fail& fail);
void link_parents(std::vector<NodeSpec>& nodes, const Fail& fail);  // sets parent_index
void check_reaches_root(const std::vector<NodeSpec>& nodes, uint32_t root, const Fail& fail);
void attach_children(std::vector<NodeSpec>& nodes, const Fail& fail);  // and none is childless
uint64_t job_id_of(const std::string& job);
// What the digest is taken of (docs/topology.md, "Digest").
std::string canonical_text(const std::string& job, const FederationSpec& federation,
                           const PolicySpec& policy, const std::vector<NodeSpec>& nodes);

// ---- versions (topology_version.cpp) ------------------------------------------

// The top-level version, history and signature keys of `doc`, where present.
void read_version(const YamlReader& r, const YAML::Node& doc, uint64_t* version,
                  std::vector<std::array<uint8_t, 32>>* history,
                  std::optional<TopologySignature>* signature);

// ---- residency policy (topology_policy.cpp) ---------------------------------

// The top-level `policy:` mapping.
PolicySpec read_policy(const YamlReader& r, const YAML::Node& n);
// The `federation:` map (topology_read_federation.cpp).
FederationSpec read_federation(const YamlReader& r, const YAML::Node& n);
// The aggregation keys given in `a`, applied over *out (a new rule starts
// with no params of the old one): federation.aggregation and a node's own.
void read_aggregation(const YamlReader& r, const YAML::Node& a, const std::string& ctx,
                      AggregationSpec* out);
// A tcp_congestion value, checked where it stands so the message has its line.
std::string read_tcp_congestion(const YamlReader& r, const YAML::Node& v, const std::string& ctx);
// A streams value: `auto` (kStreamsAuto) or a count (0 refused here).
uint64_t read_streams(const YamlReader& r, const YAML::Node& v, const std::string& ctx);

// Reads node `n`'s residency keys (jurisdiction, allowed_jurisdictions,
// k_min) into `s`, whose role is already read; `ctx` names the node.
void read_residency(const YamlReader& r, const YAML::Node& n, const std::string& ctx, NodeSpec& s);

// First problem with `s`'s residency fields taken one by one ("" if none):
// what build() checks that read_residency() checked while parsing.
std::string residency_field_problem(const NodeSpec& s);

// First residency problem across the finished tree (a site whose parent's
// jurisdiction it does not allow, a region with fewer sites than its k_min),
// or nullopt. `t` must have its indices, parents and children set.
std::optional<std::string> residency_tree_problem(const Topology& t);

// Shortest text that reads back to the same double: stable for the digest
// and readable in to_yaml().
std::string format_double(double d);

}  // namespace fedwan::topology_detail
