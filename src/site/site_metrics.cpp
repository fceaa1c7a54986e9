// SiteCore, metrics and status (docs/operations.md, "Metrics and
// dashboards"): served over HTTP at the site's `metrics` address, refreshed
// by the thread that drives the SiteCore (after each join, sync and, at
// most once a second, service call) and read by the server's thread.
#include <chrono>
#include <cmath>
#include <ctime>
#include <string>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "node/node_metrics.hpp"
#include "site/site_impl.hpp"

namespace fedwan {

void SiteCore::Impl::start_metrics() {
  site_metrics.served = node::NodeMetrics::start(
      {!opt.metrics_bind.empty() ? opt.metrics_bind : self.metrics, opt.metrics_token_file, self.id,
       "site", topo.job(), "site:" + self.id});
  update_metrics(true);
}

void SiteCore::Impl::update_metrics(bool force, double sync_seconds) {
  if (!site_metrics.served) return;
  node::NodeMetrics& served = *site_metrics.served;
  metrics::MetricsRegistry& m = served.registry();
  const std::string& me = self.id;
  const std::string& parent_id = topo.node(self.parent_index).id;
  if (sync_seconds >= 0) {
    m.histogram("fedwan_sync_duration_seconds", "Sync calls, start to return.", {"node"},
                metrics::exponential_buckets(0.01, 2, 18))
        .with({me})
        .observe(sync_seconds);
    served.round_completed();
  }
  const auto now = Clock::now();
  if (!force && sync_seconds < 0 && now - site_metrics.updated < std::chrono::seconds(1)) return;
  site_metrics.updated = now;
  served.round(round);
  served.link_bytes(parent_id, parent().bytes_sent(), parent().bytes_received());
  node::raise_to(m.double_counter("fedwan_train_seconds_total",
                                  "Seconds the caller trained between syncs.", {"node"})
                     .with({me}),
                 site_metrics.train_seconds);
  node::raise_to(m.double_counter("fedwan_device_seconds_total",
                                  "Training seconds times devices, by device kind.",
                                  {"node", "device"})
                     .with({me, opt.device_kind}),
                 site_metrics.train_seconds * opt.devices);
  m.gauge("fedwan_paused", "1 while the site waits outside its participation windows.", {"node"})
      .with({me})
      .set(site_metrics.paused ? 1 : 0);
  const double parent_age = served.parent_last_seen(parent().last_heard(), now);
  const double ckpt_age =
      served.checkpoints(site_metrics.last_checkpoint, site_metrics.checkpoints, now);
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
                           {"bytes_sent", parent().bytes_sent()},
                           {"bytes_received", parent().bytes_received()},
                           {"train_seconds", site_metrics.train_seconds},
                           {"devices", opt.devices},
                           {"device", opt.device_kind},
                           {"checkpoint_age_s", opt_num(ckpt_age)}};
  served.publish_status(status.dump());
}

}  // namespace fedwan
