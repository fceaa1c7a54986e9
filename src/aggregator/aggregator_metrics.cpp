// Aggregator, metrics and status (docs/operations.md, "Metrics and
// dashboards"): a Prometheus exposition and a JSON status served over HTTP
// at the node's `metrics` address. The counters and gauges are refreshed on
// the event loop's thread (every heartbeat and at each round's end) and read
// by the server's thread; the status is a JSON text swapped under a mutex.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "common/log.hpp"
#include "metrics/bearer_token.hpp"
#include "metrics/metrics_registry.hpp"
#include "metrics/metrics_server.hpp"

namespace fedwan {
namespace {

// Adds to a counter what a running total grew by since it was last pushed.
void push_total(metrics::Counter& c, uint64_t total) {
  if (total > c.value()) c.add(total - c.value());
}

}  // namespace

void Aggregator::Impl::start_metrics() {
  const std::string bind = !opt_.metrics_bind.empty() ? opt_.metrics_bind : self_.metrics;
  if (bind.empty()) return;
  metrics_.registry = std::make_shared<metrics::MetricsRegistry>();
  metrics_.registry
      ->gauge("fedwan_info", "The node: its role and federation.", {"node", "role", "federation"})
      .with({self_.id, role_name(self_.role), topo_.job()})
      .set(1);
  metrics::MetricsServer::Options o;
  o.bind = bind;
  if (!opt_.metrics_token_file.empty()) {
    o.bearer_token = metrics::read_bearer_token_file(opt_.metrics_token_file);
  }
  std::shared_ptr<metrics::MetricsRegistry> registry = metrics_.registry;
  o.metrics = [registry] { return registry->render(); };
  std::shared_ptr<StatusText> status = metrics_.status;
  o.status = [status] {
    std::lock_guard<std::mutex> lock(status->mu);
    return status->json;
  };
  metrics_.server = std::make_unique<metrics::MetricsServer>(std::move(o));
  log().info("[agg:{}] metrics at http://{}:{}/metrics", self_.id, bind.substr(0, bind.rfind(':')),
             metrics_.server->port());
  update_metrics();
}

void Aggregator::Impl::round_metrics(double seconds) {
  if (!metrics_.registry) return;
  metrics_.registry
      ->histogram("fedwan_round_duration_seconds", "Rounds, opened to complete, at this node.",
                  {"node"}, metrics::exponential_buckets(0.05, 2, 16))
      .with({self_.id})
      .observe(seconds);
  metrics_.registry->counter("fedwan_rounds_total", "Rounds this node completed.", {"node"})
      .with({self_.id})
      .inc();
}

void Aggregator::Impl::update_metrics() {
  if (!metrics_.registry) return;
  metrics::MetricsRegistry& m = *metrics_.registry;
  const std::string& me = self_.id;
  const auto now = Clock::now();
  // Once the federation is over, every node shows the number of rounds (a
  // region never opens the round after the last).
  const bool over = phase_ == Phase::kDraining || phase_ == Phase::kDone;
  const uint64_t shown_round = over ? std::max<uint64_t>(round_, cfg_.rounds) : round_;
  m.gauge("fedwan_round", "The round this node works on (0-based; the rounds once over).", {"node"})
      .with({me})
      .set(static_cast<double>(shown_round));
  (void)m.counter("fedwan_rounds_total", "Rounds this node completed.", {"node"}).with({me});
  auto& bytes = m.counter("fedwan_link_bytes_total", "Bytes on this node's links, by peer.",
                          {"node", "peer", "direction"});
  auto& up = m.gauge("fedwan_child_up", "1 while the child is heard within the heartbeat timeout.",
                     {"node", "child"});
  auto& seen = m.gauge("fedwan_child_last_seen_seconds", "Seconds since the child was last heard.",
                       {"node", "child"});
  auto& beats = m.counter("fedwan_child_heartbeats_total", "Heartbeats received from the child.",
                          {"node", "child"});
  auto& member =
      m.gauge("fedwan_child_member", "1 while the child counts in the quorum.", {"node", "child"});
  nlohmann::json children = nlohmann::json::array();
  for (const Child& c : down_.children) {
    const uint64_t sent = down_.link->bytes_sent_to(c.id);
    push_total(bytes.with({me, c.id, "sent"}), sent);
    push_total(bytes.with({me, c.id, "received"}), c.bytes_received);
    const double age = c.last_heard == Clock::time_point{}
                           ? std::nan("")
                           : std::chrono::duration<double>(now - c.last_heard).count();
    const bool healthy = c.live && c.joined && !(age > cfg_.heartbeat_timeout.count() / 1000.0);
    up.with({me, c.id}).set(healthy ? 1 : 0);
    seen.with({me, c.id}).set(age);
    push_total(beats.with({me, c.id}), c.heartbeats);
    member.with({me, c.id}).set(c.member ? 1 : 0);
    nlohmann::json j = {
        {"id", c.id},
        {"role", c.is_site ? "site" : "region"},
        {"healthy", healthy},
        {"live", c.live},
        {"membership", c.removed  ? "removed"
                       : c.member ? "member"
                                  : away_name(c.away)},
        {"round", c.last_round},
        {"last_seen_s", std::isnan(age) ? nlohmann::json(nullptr) : nlohmann::json(age)},
        {"heartbeats", c.heartbeats},
        {"bytes_sent", sent},
        {"bytes_received", c.bytes_received}};
    if (c.is_site) {
      j["windows"] = topo_.node(c.index).windows;
    } else {
      j["member_weight"] = c.member_weight;
      j["member_sites"] = c.member_sites;
    }
    children.push_back(std::move(j));
  }
  if (up_.session) {
    const std::string& parent = topo_.node(self_.parent_index).id;
    push_total(bytes.with({me, parent, "sent"}), up_.session->bytes_sent());
    push_total(bytes.with({me, parent, "received"}), up_.session->bytes_received());
  }
  m.gauge("fedwan_compression_ratio",
          "fp32-equivalent bytes over bytes on the wire, rounds reported so far.", {"node"})
      .with({me})
      .set(summary_.wan_bytes_total > 0 ? static_cast<double>(summary_.fp32_bytes_total) /
                                              static_cast<double>(summary_.wan_bytes_total)
                                        : std::nan(""));
  auto& rejected = m.counter("fedwan_rejected_frames_total",
                             "Frames from children not taken, by reason.", {"node", "reason"});
  push_total(rejected.with({me, "malformed"}), metrics_.malformed);
  push_total(rejected.with({me, "refused"}), metrics_.refused);
  push_total(rejected.with({me, "stale"}), summary_.stale_updates);
  push_total(rejected.with({me, "security"}), down_.link->counters().rejected);
  m.gauge("fedwan_topology_version", "The topology version this node runs.", {"node"})
      .with({me})
      .set(static_cast<double>(topo_.version()));
  m.gauge("fedwan_members", "Children counted in the quorum.", {"node"})
      .with({me})
      .set(static_cast<double>(member_sites()));
  m.gauge("fedwan_member_weight", "Weight of the sites counted in the quorum.", {"node"})
      .with({me})
      .set(member_weight());
  const double ckpt_age =
      metrics_.last_checkpoint
          ? std::chrono::duration<double>(now - *metrics_.last_checkpoint).count()
          : std::nan("");
  m.gauge("fedwan_checkpoint_age_seconds", "Seconds since this node's last checkpoint.", {"node"})
      .with({me})
      .set(ckpt_age);
  push_total(m.counter("fedwan_checkpoints_total", "Checkpoints written.", {"node"}).with({me}),
             summary_.checkpoints_written);
  m.gauge("fedwan_replicas", "Children's checkpoint replicas kept (stored so far).", {"node"})
      .with({me})
      .set(static_cast<double>(summary_.replicas_stored));
  push_total(
      m.counter("fedwan_children_lost_total", "Children lost to the heartbeat timeout.", {"node"})
          .with({me}),
      summary_.children_lost);
  push_total(
      m.counter("fedwan_rejoins_total", "Children that said hello again.", {"node"}).with({me}),
      summary_.rejoins);
  if (up_.session) {
    m.gauge("fedwan_parent_last_seen_seconds", "Seconds since the parent was last heard.", {"node"})
        .with({me})
        .set(up_.session->last_heard() == Clock::time_point{}
                 ? std::nan("")
                 : std::chrono::duration<double>(now - up_.session->last_heard()).count());
  }
  nlohmann::json status = {{"node", me},
                           {"role", role_name(self_.role)},
                           {"job", topo_.job()},
                           {"topology_version", topo_.version()},
                           {"round", shown_round},
                           {"rounds", cfg_.rounds},
                           {"phase", phase_name()},
                           {"heartbeat_timeout_s", cfg_.heartbeat_timeout.count() / 1000.0},
                           {"members", member_sites()},
                           {"member_weight", member_weight()},
                           {"checkpoint_age_s", std::isnan(ckpt_age) ? nlohmann::json(nullptr)
                                                                     : nlohmann::json(ckpt_age)},
                           {"children", children}};
  std::lock_guard<std::mutex> lock(metrics_.status->mu);
  metrics_.status->json = status.dump();
}

const char* Aggregator::Impl::phase_name() const {
  switch (phase_) {
    case Phase::kJoining: return "joining";
    case Phase::kAwaitWelcome: return "awaiting_welcome";
    case Phase::kTraining: return "training";
    case Phase::kAwaitAnchor: return "awaiting_anchor";
    case Phase::kDraining: return "draining";
    case Phase::kDone: return "done";
  }
  return "unknown";
}

}  // namespace fedwan
