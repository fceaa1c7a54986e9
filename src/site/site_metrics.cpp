// SiteCore, metrics and status (docs/operations.md, "Metrics and
// dashboards"): served over HTTP at the site's `metrics` address, refreshed
// by the thread that drives the SiteCore (after each join, sync and, at
// most once a second, service call) and read by the server's thread.
#include <chrono>
#include <cmath>
#include <ctime>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "metrics/bearer_token.hpp"
#include "metrics/metrics_registry.hpp"
#include "metrics/metrics_server.hpp"
#include "site/site_impl.hpp"

namespace fedwan {

void SiteCore::Impl::start_metrics() {
  const std::string bind = !opt.metrics_bind.empty() ? opt.metrics_bind : self.metrics;
  if (bind.empty()) return;
  site_metrics.registry = std::make_shared<metrics::MetricsRegistry>();
  site_metrics.registry
      ->gauge("fedwan_info", "The node: its role and federation.", {"node", "role", "federation"})
      .with({self.id, "site", topo.job()})
      .set(1);
  metrics::MetricsServer::Options o;
  o.bind = bind;
  if (!opt.metrics_token_file.empty()) {
    o.bearer_token = metrics::read_bearer_token_file(opt.metrics_token_file);
  }
  std::shared_ptr<metrics::MetricsRegistry> registry = site_metrics.registry;
  o.metrics = [registry] { return registry->render(); };
  std::shared_ptr<SiteMetrics::Status> status = site_metrics.status;
  o.status = [status] {
    std::lock_guard<std::mutex> lock(status->mu);
    return status->json;
  };
  site_metrics.server = std::make_unique<metrics::MetricsServer>(std::move(o));
  log().info("[site:{}] metrics at http://{}:{}/metrics", self.id, bind.substr(0, bind.rfind(':')),
             site_metrics.server->port());
  update_metrics(true);
}

void SiteCore::Impl::update_metrics(bool force, double sync_seconds) {
  if (!site_metrics.registry) return;
  metrics::MetricsRegistry& m = *site_metrics.registry;
  const std::string& me = self.id;
  const std::string& parent_id = topo.node(self.parent_index).id;
  if (sync_seconds >= 0) {
    m.histogram("fedwan_sync_duration_seconds", "Sync calls, start to return.", {"node"},
                metrics::exponential_buckets(0.01, 2, 18))
        .with({me})
        .observe(sync_seconds);
    m.counter("fedwan_rounds_total", "Rounds this node completed.", {"node"}).with({me}).inc();
  }
  const auto now = Clock::now();
  if (!force && sync_seconds < 0 && now - site_metrics.updated < std::chrono::seconds(1)) return;
  site_metrics.updated = now;
  m.gauge("fedwan_round", "The round this node works on (0-based; the rounds once over).", {"node"})
      .with({me})
      .set(static_cast<double>(round));
  (void)m.counter("fedwan_rounds_total", "Rounds this node completed.", {"node"}).with({me});
  auto& bytes = m.counter("fedwan_link_bytes_total", "Bytes on this node's links, by peer.",
                          {"node", "peer", "direction"});
  auto push = [](metrics::Counter& c, uint64_t total) {
    if (total > c.value()) c.add(total - c.value());
  };
  push(bytes.with({me, parent_id, "sent"}), parent->bytes_sent());
  push(bytes.with({me, parent_id, "received"}), parent->bytes_received());
  auto& train = m.double_counter("fedwan_train_seconds_total",
                                 "Seconds the caller trained between syncs.", {"node"})
                    .with({me});
  if (site_metrics.train_seconds > train.value())
    train.add(site_metrics.train_seconds - train.value());
  auto& dev =
      m.double_counter("fedwan_device_seconds_total",
                       "Training seconds times devices, by device kind.", {"node", "device"})
          .with({me, opt.device_kind});
  const double device_s = site_metrics.train_seconds * opt.devices;
  if (device_s > dev.value()) dev.add(device_s - dev.value());
  m.gauge("fedwan_paused", "1 while the site waits outside its participation windows.", {"node"})
      .with({me})
      .set(site_metrics.paused ? 1 : 0);
  const auto heard = parent->last_heard();
  const double parent_age = heard == Clock::time_point{}
                                ? std::nan("")
                                : std::chrono::duration<double>(now - heard).count();
  m.gauge("fedwan_parent_last_seen_seconds", "Seconds since the parent was last heard.", {"node"})
      .with({me})
      .set(parent_age);
  const double ckpt_age =
      site_metrics.last_checkpoint
          ? std::chrono::duration<double>(now - *site_metrics.last_checkpoint).count()
          : std::nan("");
  m.gauge("fedwan_checkpoint_age_seconds", "Seconds since this node's last checkpoint.", {"node"})
      .with({me})
      .set(ckpt_age);
  auto& ckpts = m.counter("fedwan_checkpoints_total", "Checkpoints written.", {"node"}).with({me});
  if (site_metrics.checkpoints > ckpts.value()) ckpts.add(site_metrics.checkpoints - ckpts.value());
  const auto opt_num = [](double v) {
    return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
  };
  nlohmann::json status = {{"node", me},
                           {"role", "site"},
                           {"job", topo.job()},
                           {"parent", parent_id},
                           {"round", round},
                           {"rounds", cfg.rounds},
                           {"finished", finished},
                           {"left", left},
                           {"paused", site_metrics.paused},
                           {"windows", self.windows},
                           {"in_window", windows.open_at(std::time(nullptr))},
                           {"parent_last_seen_s", opt_num(parent_age)},
                           {"heartbeat_timeout_s", cfg.heartbeat_timeout.count() / 1000.0},
                           {"bytes_sent", parent->bytes_sent()},
                           {"bytes_received", parent->bytes_received()},
                           {"train_seconds", site_metrics.train_seconds},
                           {"devices", opt.devices},
                           {"device", opt.device_kind},
                           {"checkpoint_age_s", opt_num(ckpt_age)}};
  std::lock_guard<std::mutex> lock(site_metrics.status->mu);
  site_metrics.status->json = status.dump();
}

}  // namespace fedwan
