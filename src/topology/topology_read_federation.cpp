// Reading a topology file's `federation:` map: every key checked where it
// stands (the message has its line), the aggregation and privacy maps, the
// outer optimizer's hyper-parameters. See docs/topology.md.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "fedwan/outer_optimizer.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan::topology_detail {
namespace {

const std::vector<std::string> kFederationKeys = {
    "rounds",         "inner_steps",     "codec",         "chunk_bytes",         "round_timeout_s",
    "quorum",         "deadline_s",      "heartbeat_s",   "heartbeat_timeout_s", "replica_every",
    "tcp_congestion", "outer_optimizer", "overlap_steps", "socket_buffer_bytes", "streams",
    "max_streams",    "aggregation",     "privacy"};
// "name" and every hyper-parameter some optimizer takes (which one takes
// which is the optimizer's rule, checked in validate_federation).
std::vector<std::string> outer_keys() {
  std::vector<std::string> keys = {"name"};
  for (const auto& optimizer : outer_optimizer_names()) {
    for (const auto& p : outer_optimizer_params(optimizer)) {
      if (std::find(keys.begin(), keys.end(), p.name) == keys.end()) keys.push_back(p.name);
    }
  }
  return keys;
}

PrivacySpec read_privacy(const YamlReader& r, const YAML::Node& n) {
  const std::string ctx = "federation.privacy";
  PrivacySpec p;
  r.expect_map(n, ctx);
  r.check_keys(n,
               {"mode", "clip", "noise_multiplier", "target_epsilon", "delta", "epsilon_budget",
                "target_quantile", "clip_learning_rate", "clip_count_budget"},
               ctx);
  if (auto v = n["mode"]) p.mode = r.str(v, ctx, "mode");
  const std::pair<const char*, double*> numbers[] = {{"clip", &p.clip},
                                                     {"noise_multiplier", &p.noise_multiplier},
                                                     {"target_epsilon", &p.target_epsilon},
                                                     {"delta", &p.delta},
                                                     {"epsilon_budget", &p.epsilon_budget},
                                                     {"target_quantile", &p.target_quantile},
                                                     {"clip_learning_rate", &p.clip_learning_rate},
                                                     {"clip_count_budget", &p.clip_count_budget}};
  for (const auto& [key, field] : numbers) {
    if (auto v = n[key]) *field = r.f64(v, ctx, key);
  }
  return p;
}

}  // namespace

// A tcp_congestion value, checked where it stands so the message has its line.
std::string read_tcp_congestion(const YamlReader& r, const YAML::Node& v, const std::string& ctx) {
  std::string name = r.str(v, ctx, "tcp_congestion");
  const std::string why = topology_detail::tcp_congestion_problem(name);
  if (!why.empty()) r.fail(v, ctx, why);
  return name;
}

uint64_t read_streams(const YamlReader& r, const YAML::Node& v, const std::string& ctx) {
  if (v.IsScalar() && v.Scalar() == "auto") return kStreamsAuto;
  const uint64_t n = r.u64(v, ctx, "streams");
  if (n == kStreamsAuto) {
    r.fail(v, ctx,
           "streams 0 is out of range: a child opens 1 to 16 TCP connections to its parent, "
           "or `auto` to use as many as pay");
  }
  return n;
}

// The aggregation keys given in `a`, applied over *out (a new rule starts
// with no params of the old one).
void read_aggregation(const YamlReader& r, const YAML::Node& a, const std::string& ctx,
                      AggregationSpec* out) {
  AggregationSpec& g = *out;
  r.expect_map(a, ctx);
  r.check_keys(a, {"rule", "params", "finite_check", "max_abs", "replay_window", "norm_bound"},
               ctx);
  if (auto v = a["rule"]) {
    g.rule = r.str(v, ctx, "rule");
    g.params.clear();
  }
  if (auto p = a["params"]) {
    const std::string pctx = ctx + ".params";
    r.expect_map(p, pctx);
    g.params.clear();
    for (const auto& entry : p) {
      const std::string key = entry.first.as<std::string>();
      g.params[key] = r.f64(entry.second, pctx, key);
    }
  }
  if (auto v = a["finite_check"]) g.finite_check = r.boolean(v, ctx, "finite_check");
  if (auto v = a["max_abs"]) g.max_abs = r.f64(v, ctx, "max_abs");
  if (auto v = a["replay_window"]) g.replay_window = r.u64(v, ctx, "replay_window");
  if (auto b = a["norm_bound"]) {
    const std::string bctx = ctx + ".norm_bound";
    NormBoundSpec& nb = g.norm_bound;
    r.expect_map(b, bctx);
    r.check_keys(b, {"mode", "factor", "window", "bound", "action"}, bctx);
    if (auto v = b["mode"]) nb.mode = r.str(v, bctx, "mode");
    if (auto v = b["factor"]) nb.factor = r.f64(v, bctx, "factor");
    if (auto v = b["window"]) nb.window = r.u64(v, bctx, "window");
    if (auto v = b["bound"]) nb.bound = r.f64(v, bctx, "bound");
    if (auto v = b["action"]) nb.action = r.str(v, bctx, "action");
  }
}

FederationSpec read_federation(const YamlReader& r, const YAML::Node& n) {
  FederationSpec f;
  r.expect_map(n, "federation");
  r.check_keys(n, kFederationKeys, "federation");
  if (auto v = n["rounds"]) f.rounds = r.u64(v, "federation", "rounds");
  if (auto v = n["inner_steps"]) f.inner_steps = r.u64(v, "federation", "inner_steps");
  if (auto v = n["codec"]) f.codec = r.str(v, "federation", "codec");
  if (auto v = n["chunk_bytes"]) f.chunk_bytes = r.u64(v, "federation", "chunk_bytes");
  if (auto v = n["round_timeout_s"]) f.round_timeout_s = r.f64(v, "federation", "round_timeout_s");
  if (auto v = n["quorum"]) f.quorum = r.f64(v, "federation", "quorum");
  if (auto v = n["deadline_s"]) f.deadline_s = r.f64(v, "federation", "deadline_s");
  if (auto v = n["heartbeat_s"]) f.heartbeat_s = r.f64(v, "federation", "heartbeat_s");
  if (auto v = n["heartbeat_timeout_s"]) {
    f.heartbeat_timeout_s = r.f64(v, "federation", "heartbeat_timeout_s");
  }
  if (auto v = n["replica_every"]) f.replica_every = r.u64(v, "federation", "replica_every");
  if (auto v = n["tcp_congestion"]) f.tcp_congestion = read_tcp_congestion(r, v, "federation");
  if (auto v = n["overlap_steps"]) f.overlap_steps = r.u64(v, "federation", "overlap_steps");
  if (auto v = n["socket_buffer_bytes"]) {
    f.socket_buffer_bytes = r.u64(v, "federation", "socket_buffer_bytes");
  }
  if (auto v = n["streams"]) f.streams = read_streams(r, v, "federation");
  if (auto v = n["max_streams"]) f.max_streams = r.u64(v, "federation", "max_streams");
  if (auto a = n["aggregation"]) read_aggregation(r, a, "federation.aggregation", &f.aggregation);
  if (auto p = n["privacy"]) f.privacy = read_privacy(r, p);
  if (auto o = n["outer_optimizer"]) {
    const std::string ctx = "federation.outer_optimizer";
    r.expect_map(o, ctx);
    r.check_keys(o, outer_keys(), ctx);
    for (const auto& entry : o) {
      const std::string key = entry.first.as<std::string>();
      if (key == "name") {
        f.outer.name = r.str(entry.second, ctx, "name");
      } else {
        f.outer.params[key] = r.f64(entry.second, ctx, key);
      }
    }
  }
  return f;
}

}  // namespace fedwan::topology_detail
