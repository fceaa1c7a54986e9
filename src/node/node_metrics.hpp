// What every node serves at its `metrics` address (docs/operations.md,
// "Metrics and dashboards"), declared once for the site and the aggregator:
// the HTTP server with its registry and JSON status, and the families both
// roles expose (fedwan_info, fedwan_round, fedwan_rounds_total,
// fedwan_link_bytes_total, fedwan_parent_last_seen_seconds,
// fedwan_checkpoint_age_seconds, fedwan_checkpoints_total). A role adds its
// own families through registry(). Updated by the node's driving thread,
// read by the server's thread (the status text is swapped under a mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "metrics/metrics_registry.hpp"
#include "metrics/metrics_server.hpp"

namespace fedwan::node {

// Raises a counter to a running total kept elsewhere (a counter never goes
// down: a total that fell, as a replaced link's, leaves it where it is).
void raise_to(metrics::Counter& counter, uint64_t total);
void raise_to(metrics::DoubleCounter& counter, double total);

// Seconds from `since` to `now`, NaN when `since` never happened.
double seconds_since(std::optional<std::chrono::steady_clock::time_point> since,
                     std::chrono::steady_clock::time_point now);

class NodeMetrics {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::string bind;        // host:port; empty: no metrics
    std::string token_file;  // a bearer token required of clients, when set
    std::string node;        // the node's id
    std::string role;        // "site", "region", "root"
    std::string job;         // the federation
    std::string log_tag;     // e.g. "site:a", in the log line naming the address
  };

  // Serves metrics at `options.bind`; nullptr when it is empty. Throws
  // TransportError when it cannot listen there, Error on an unreadable
  // token file.
  static std::unique_ptr<NodeMetrics> start(const Options& options);

  metrics::MetricsRegistry& registry() { return *registry_; }
  uint16_t port() const { return server_->port(); }
  const std::string& node() const { return node_; }

  // fedwan_round (and fedwan_rounds_total declared, so that it shows 0
  // before the first round completes).
  void round(uint64_t round);
  void round_completed();
  // fedwan_link_bytes_total for `peer`, raised to the link's totals.
  void link_bytes(const std::string& peer, uint64_t sent, uint64_t received);
  // fedwan_parent_last_seen_seconds; the age it set (NaN: never heard).
  double parent_last_seen(Clock::time_point heard, Clock::time_point now);
  // fedwan_checkpoint_age_seconds and fedwan_checkpoints_total; the age it
  // set (NaN: none written yet).
  double checkpoints(std::optional<Clock::time_point> last, uint64_t written,
                     Clock::time_point now);
  // The JSON text /status answers from now on.
  void publish_status(std::string json);

 private:
  struct StatusText {
    std::mutex mu;
    std::string json = "{}";
  };
  NodeMetrics() = default;

  std::string node_;
  std::shared_ptr<metrics::MetricsRegistry> registry_;
  std::shared_ptr<StatusText> status_;
  std::unique_ptr<metrics::MetricsServer> server_;  // declared last: stops first
};

}  // namespace fedwan::node
