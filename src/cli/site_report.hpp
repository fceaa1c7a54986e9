// A site's --report: per synced round, the wall time of its inner steps and
// of the sync that ended it, and the sync's traffic; written as JSON at the
// end. Shared by the synthetic and fashion-cnn sites of `fedwan site`.
// Thread safety: one training thread drives a SiteReport.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "fedwan/site_core.hpp"

namespace fedwan::cli {

class SiteReport {
 public:
  using Clock = std::chrono::steady_clock;

  // An empty `path` (no --report, or a rank other than the leader): write()
  // does nothing.
  SiteReport(std::string path, std::string node, double step_time_ms);

  // join() returned; the wall time (and utilisation) counts from now.
  void joined(Clock::time_point join_started);
  // Training counts towards the round the next sync ends: a resync restarts
  // the round, and the training before it still took the site's time.
  // `cpu_s`: the CPU time of the thread that trained, where it did all of
  // the training (the synthetic trainer); the report then has train_cpu_s.
  void trained(double seconds, std::optional<double> cpu_s = std::nullopt);
  // The sync that ended `round` returned `r` (not a resync). An overlapped
  // sync gives `waited_s`, the time the site spent in begin_sync and
  // finish_sync (its sync_s); the transfer behind the steps between them
  // is in overlap_s.
  void synced(uint64_t round, Clock::time_point sync_started, const SyncResult& r,
              std::optional<double> waited_s = std::nullopt);

  // Replaces the report file whole (a reader never sees half of one); throws
  // ConfigError when it cannot. The rounds are those synced: a round a signal
  // cut short is left out, and the totals are the sums of the rounds.
  void write(bool stopped) const;

 private:
  std::string path_;
  std::string node_;
  double step_time_ms_;
  std::optional<Clock::time_point> joined_at_;  // unset: stopped before it joined
  Clock::time_point last_sync_end_;
  double join_s_ = 0;
  double pending_train_s_ = 0;
  std::optional<double> pending_train_cpu_s_;
  std::optional<double> train_cpu_s_total_;
  nlohmann::json rounds_ = nlohmann::json::array();
  double train_s_total_ = 0;
  double sync_s_total_ = 0;
  uint64_t bytes_sent_total_ = 0;
  uint64_t bytes_resent_total_ = 0;
  uint64_t bytes_received_total_ = 0;
};

}  // namespace fedwan::cli
