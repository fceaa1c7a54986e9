#include "node/node_metrics.hpp"

#include <cmath>
#include <utility>

#include "common/log.hpp"
#include "metrics/bearer_token.hpp"

namespace fedwan::node {

void raise_to(metrics::Counter& counter, uint64_t total) {
  if (total > counter.value()) counter.add(total - counter.value());
}

void raise_to(metrics::DoubleCounter& counter, double total) {
  if (total > counter.value()) counter.add(total - counter.value());
}

double seconds_since(std::optional<std::chrono::steady_clock::time_point> since,
                     std::chrono::steady_clock::time_point now) {
  if (!since || *since == std::chrono::steady_clock::time_point{}) return std::nan("");
  return std::chrono::duration<double>(now - *since).count();
}

std::unique_ptr<NodeMetrics> NodeMetrics::start(const Options& options) {
  if (options.bind.empty()) return nullptr;
  std::unique_ptr<NodeMetrics> m(new NodeMetrics());
  m->node_ = options.node;
  m->registry_ = std::make_shared<metrics::MetricsRegistry>();
  m->status_ = std::make_shared<StatusText>();
  m->registry_
      ->gauge("fedwan_info", "The node: its role and federation.", {"node", "role", "federation"})
      .with({options.node, options.role, options.job})
      .set(1);
  metrics::MetricsServer::Options o;
  o.bind = options.bind;
  if (!options.token_file.empty()) {
    o.bearer_token = metrics::read_bearer_token_file(options.token_file);
  }
  std::shared_ptr<metrics::MetricsRegistry> registry = m->registry_;
  o.metrics = [registry] { return registry->render(); };
  std::shared_ptr<StatusText> status = m->status_;
  o.status = [status] {
    std::lock_guard<std::mutex> lock(status->mu);
    return status->json;
  };
  m->server_ = std::make_unique<metrics::MetricsServer>(std::move(o));
  log().info("[{}] metrics at http://{}:{}/metrics", options.log_tag,
             options.bind.substr(0, options.bind.rfind(':')), m->server_->port());
  return m;
}

void NodeMetrics::round(uint64_t round) {
  registry_
      ->gauge("fedwan_round", "The round this node works on (0-based; the rounds once over).",
              {"node"})
      .with({node_})
      .set(static_cast<double>(round));
  (void)registry_->counter("fedwan_rounds_total", "Rounds this node completed.", {"node"})
      .with({node_});
}

void NodeMetrics::round_completed() {
  registry_->counter("fedwan_rounds_total", "Rounds this node completed.", {"node"})
      .with({node_})
      .inc();
}

void NodeMetrics::link_bytes(const std::string& peer, uint64_t sent, uint64_t received) {
  auto& bytes =
      registry_->counter("fedwan_link_bytes_total", "Bytes on this node's links, by peer.",
                         {"node", "peer", "direction"});
  raise_to(bytes.with({node_, peer, "sent"}), sent);
  raise_to(bytes.with({node_, peer, "received"}), received);
}

double NodeMetrics::parent_last_seen(Clock::time_point heard, Clock::time_point now) {
  const double age = seconds_since(heard, now);
  registry_
      ->gauge("fedwan_parent_last_seen_seconds", "Seconds since the parent was last heard.",
              {"node"})
      .with({node_})
      .set(age);
  return age;
}

double NodeMetrics::checkpoints(std::optional<Clock::time_point> last, uint64_t written,
                                Clock::time_point now) {
  const double age = seconds_since(last, now);
  registry_
      ->gauge("fedwan_checkpoint_age_seconds", "Seconds since this node's last checkpoint.",
              {"node"})
      .with({node_})
      .set(age);
  raise_to(registry_->counter("fedwan_checkpoints_total", "Checkpoints written.", {"node"})
               .with({node_}),
           written);
  return age;
}

void NodeMetrics::publish_status(std::string json) {
  std::lock_guard<std::mutex> lock(status_->mu);
  status_->json = std::move(json);
}

}  // namespace fedwan::node
