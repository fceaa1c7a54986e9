#include "cli/site_report.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/atomic_file.hpp"

namespace fedwan::cli {

SiteReport::SiteReport(std::string path, std::string node, double step_time_ms)
    : path_(std::move(path)), node_(std::move(node)), step_time_ms_(step_time_ms) {}

void SiteReport::joined(SiteReport::Clock::time_point join_started) {
  joined_at_ = last_sync_end_ = Clock::now();
  join_s_ = std::chrono::duration<double>(*joined_at_ - join_started).count();
}

void SiteReport::trained(double seconds, std::optional<double> cpu_s) {
  pending_train_s_ += seconds;
  if (cpu_s) pending_train_cpu_s_ = pending_train_cpu_s_.value_or(0) + *cpu_s;
}

void SiteReport::synced(uint64_t round, Clock::time_point sync_started, const SyncResult& r,
                        std::optional<double> waited_s) {
  last_sync_end_ = Clock::now();
  const double span_s = std::chrono::duration<double>(last_sync_end_ - sync_started).count();
  const double sync_s = waited_s ? std::min(*waited_s, span_s) : span_s;
  // Wall-clock time too, so a harness can line the sync up with what it
  // sampled on the same machine (CPU load, link counters).
  const double sync_end_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  rounds_.push_back({{"round", round},
                     {"sync_start_unix", sync_end_unix - sync_s},
                     {"train_s", pending_train_s_},
                     {"sync_s", sync_s},
                     {"bytes_sent", r.bytes_sent},
                     {"bytes_resent", r.bytes_resent},
                     {"bytes_received", r.bytes_received},
                     {"replica_bytes", r.replica_bytes}});
  if (waited_s) rounds_.back()["overlap_s"] = span_s;
  if (pending_train_cpu_s_) {
    rounds_.back()["train_cpu_s"] = *pending_train_cpu_s_;
    train_cpu_s_total_ = train_cpu_s_total_.value_or(0) + *pending_train_cpu_s_;
  }
  pending_train_cpu_s_.reset();
  train_s_total_ += pending_train_s_;
  sync_s_total_ += sync_s;
  bytes_sent_total_ += r.bytes_sent;
  bytes_resent_total_ += r.bytes_resent;
  bytes_received_total_ += r.bytes_received;
  pending_train_s_ = 0;
}

void SiteReport::write(bool stopped) const {
  if (path_.empty()) return;
  const double wall_s =
      joined_at_ ? std::chrono::duration<double>(last_sync_end_ - *joined_at_).count() : 0.0;
  nlohmann::json j = {{"node", node_},
                      {"rounds", rounds_},
                      {"train_s_total", train_s_total_},
                      {"sync_s_total", sync_s_total_},
                      {"wall_s", wall_s},
                      {"utilisation", wall_s > 0 ? train_s_total_ / wall_s : 0.0},
                      {"bytes_sent_total", bytes_sent_total_},
                      {"bytes_resent_total", bytes_resent_total_},
                      {"bytes_received_total", bytes_received_total_},
                      {"join_s", joined_at_ ? nlohmann::json(join_s_) : nlohmann::json(nullptr)},
                      {"step_time_ms", step_time_ms_},
                      {"stopped", stopped}};
  if (train_cpu_s_total_) j["train_cpu_s_total"] = *train_cpu_s_total_;
  write_file_atomic(path_, j.dump(2) + "\n", 0600);
}

}  // namespace fedwan::cli
