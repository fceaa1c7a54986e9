// Aggregator, metrics and status (docs/operations.md, "Metrics and
// dashboards"): a Prometheus exposition and a JSON status served over HTTP
// at the node's `metrics` address. The counters and gauges are refreshed on
// the event loop's thread (every heartbeat and at each round's end) and read
// by the server's thread; the status is a JSON text swapped under a mutex.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/privacy_noise.hpp"
#include "aggregator/role.hpp"
#include "metrics/metrics_registry.hpp"
#include "node/node_metrics.hpp"

namespace fedwan {

using node::raise_to;

void Aggregator::Impl::start_metrics() {
  metrics_.served = node::NodeMetrics::start(
      {!opt_.metrics_bind.empty() ? opt_.metrics_bind : self_.metrics, opt_.metrics_token_file,
       self_.id, role_name(self_.role), topo_.job(), "agg:" + self_.id});
  update_metrics();
}

void Aggregator::Impl::round_metrics(double seconds) {
  if (!metrics_.served) return;
  metrics_.served->registry()
      .histogram("fedwan_round_duration_seconds", "Rounds, opened to complete, at this node.",
                 {"node"}, metrics::exponential_buckets(0.05, 2, 16))
      .with({self_.id})
      .observe(seconds);
  metrics_.served->round_completed();
}

void Aggregator::Impl::update_metrics() {
  if (!metrics_.served) return;
  node::NodeMetrics& served = *metrics_.served;
  metrics::MetricsRegistry& m = served.registry();
  const std::string& me = self_.id;
  const auto now = Clock::now();
  // Once the federation is over, every node shows the number of rounds (a
  // region never opens the round after the last).
  const bool over = phase_ == Phase::kDraining || phase_ == Phase::kDone;
  const uint64_t shown_round = over ? std::max<uint64_t>(round_, cfg_.rounds) : round_;
  served.round(shown_round);
  nlohmann::json children = children_metrics(now);
  if (session::Uplink* up = role_->uplink()) {
    served.link_bytes(topo_.node(self_.parent_index).id, up->session().bytes_sent(),
                      up->session().bytes_received());
  }
  m.gauge("fedwan_compression_ratio",
          "fp32-equivalent bytes over bytes on the wire, rounds reported so far.", {"node"})
      .with({me})
      .set(summary_.wan_bytes_total > 0 ? static_cast<double>(summary_.fp32_bytes_total) /
                                              static_cast<double>(summary_.wan_bytes_total)
                                        : std::nan(""));
  auto& rejected = m.counter("fedwan_rejected_frames_total",
                             "Frames from children not taken, by reason.", {"node", "reason"});
  raise_to(rejected.with({me, "malformed"}), metrics_.malformed);
  raise_to(rejected.with({me, "refused"}), metrics_.refused);
  raise_to(rejected.with({me, "stale"}), summary_.stale_updates);
  raise_to(rejected.with({me, "security"}), down_.link.link().counters().rejected);
  raise_to(rejected.with({me, "other_session"}), down_.link.link().counters().other_session);
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
      served.checkpoints(metrics_.last_checkpoint, summary_.checkpoints_written, now);
  m.gauge("fedwan_replicas", "Children's checkpoint replicas kept (stored so far).", {"node"})
      .with({me})
      .set(static_cast<double>(summary_.replicas_stored));
  raise_to(
      m.counter("fedwan_children_lost_total", "Children lost to the heartbeat timeout.", {"node"})
          .with({me}),
      summary_.children_lost);
  raise_to(
      m.counter("fedwan_rejoins_total", "Children that said hello again.", {"node"}).with({me}),
      summary_.rejoins);
  if (acc_) {
    // Chunks of a round waiting on disk for their other copies (beyond the
    // memory budget): a child far ahead of the others shows here.
    raise_to(m.counter("fedwan_chunks_parked_total",
                       "Chunk states and copies set aside on disk while their chunks wait.",
                       {"node"})
                 .with({me}),
             acc_->chunks_parked());
    raise_to(m.counter("fedwan_parked_bytes_total", "Bytes of them written.", {"node"}).with({me}),
             acc_->bytes_parked());
  }
  if (session::Uplink* up = role_->uplink())
    served.parent_last_seen(up->session().last_heard(), now);
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
  if (cfg_.privacy.on()) status["privacy"] = privacy_metrics(m);
  served.publish_status(status.dump());
}

// Differential privacy: what the rounds so far spent, the same figures at
// every aggregator (the root's report and audit have them per round).
nlohmann::json Aggregator::Impl::privacy_metrics(metrics::MetricsRegistry& m) {
  const std::string& me = self_.id;
  nlohmann::json p = aggregator::privacy_spent(cfg_, round_, privacy_clip_);
  p["clipped_copies"] = acc_ ? acc_->privacy_clipped() : 0;
  m.gauge("fedwan_privacy_epsilon",
          "Epsilon spent by the rounds so far (at fedwan_privacy_delta; site-level DP).", {"node"})
      .with({me})
      .set(p["epsilon"].get<double>());
  m.gauge("fedwan_privacy_delta", "The delta of fedwan_privacy_epsilon.", {"node"})
      .with({me})
      .set(cfg_.privacy.delta);
  m.gauge("fedwan_privacy_epsilon_budget", "The privacy budget (0: none).", {"node"})
      .with({me})
      .set(cfg_.privacy.epsilon_budget);
  m.gauge("fedwan_privacy_noise_multiplier", "Noise standard deviation over the sensitivity.",
          {"node"})
      .with({me})
      .set(cfg_.privacy.noise_multiplier);
  m.gauge("fedwan_privacy_clip",
          "The L2 bound this round's site updates are clipped to (adaptive clipping moves it).",
          {"node"})
      .with({me})
      .set(privacy_clip_);
  raise_to(m.counter("fedwan_privacy_clipped_copies_total",
                     "Sites' copies of a chunk this node clipped to the privacy bound.", {"node"})
               .with({me}),
           acc_ ? acc_->privacy_clipped() : 0);
  return p;
}

nlohmann::json Aggregator::Impl::children_metrics(Clock::time_point now) {
  node::NodeMetrics& served = *metrics_.served;
  metrics::MetricsRegistry& m = served.registry();
  const std::string& me = self_.id;
  auto& up = m.gauge("fedwan_child_up", "1 while the child is heard within the heartbeat timeout.",
                     {"node", "child"});
  auto& seen = m.gauge("fedwan_child_last_seen_seconds", "Seconds since the child was last heard.",
                       {"node", "child"});
  auto& beats = m.counter("fedwan_child_heartbeats_total", "Heartbeats received from the child.",
                          {"node", "child"});
  auto& member =
      m.gauge("fedwan_child_member", "1 while the child counts in the quorum.", {"node", "child"});
  auto& judged = m.counter("fedwan_child_copies_judged_total",
                           "The child's copies of chunks this node refused or clipped.",
                           {"node", "child", "verdict"});
  auto& flag = m.gauge("fedwan_child_flagged",
                       "1 while the child's copies have been refused or clipped in several rounds "
                       "in a row.",
                       {"node", "child"});
  nlohmann::json children = nlohmann::json::array();
  for (const Child& c : down_.children) {
    const uint64_t sent = down_.link.link().bytes_sent_to(c.id);
    served.link_bytes(c.id, sent, c.bytes_received);
    const double age = node::seconds_since(c.last_heard, now);
    const bool healthy = c.live && c.joined && !(age > cfg_.heartbeat_timeout.count() / 1000.0);
    up.with({me, c.id}).set(healthy ? 1 : 0);
    seen.with({me, c.id}).set(age);
    raise_to(beats.with({me, c.id}), c.heartbeats);
    member.with({me, c.id}).set(c.member ? 1 : 0);
    raise_to(judged.with({me, c.id, "refused"}), c.copies_refused);
    raise_to(judged.with({me, c.id, "clipped"}), c.copies_clipped);
    const bool is_flagged = aggregator::flagged(c, round_);
    flag.with({me, c.id}).set(is_flagged ? 1 : 0);
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
        {"bytes_received", c.bytes_received},
        {"refused", c.copies_refused},
        {"clipped", c.copies_clipped},
        {"flagged", is_flagged}};
    if (c.is_site) {
      j["windows"] = topo_.node(c.index).windows;
    } else {
      j["member_weight"] = c.member_weight;
      j["member_sites"] = c.member_sites;
    }
    children.push_back(std::move(j));
  }
  return children;
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
