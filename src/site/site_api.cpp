// SiteCore's public face: it forwards to SiteCore::Impl (site_core.cpp,
// site_overlap.cpp) and answers the getters.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_core.hpp"
#include "site/site_impl.hpp"

namespace fedwan {

// ---- facade ----------------------------------------------------------------------------

SiteCore::SiteCore(SiteOptions options, float* params, size_t n)
    : impl_(std::make_unique<Impl>(std::move(options), params, n)) {}
SiteCore::~SiteCore() = default;
// Lines logged while the site works carry its id and round (LogScope).
SyncResult SiteCore::join() {
  LogScope scope(impl_->self.id, &impl_->round);
  return impl_->join();
}
SyncResult SiteCore::sync() {
  LogScope scope(impl_->self.id, &impl_->round);
  return impl_->sync();
}
SyncResult SiteCore::service() {
  LogScope scope(impl_->self.id, &impl_->round);
  return impl_->service();
}
void SiteCore::checkpoint() {
  LogScope scope(impl_->self.id, &impl_->round);
  if (impl_->sync_unfinished && !impl_->opt.checkpoint_dir.empty()) {
    // Part of the next round may be in params and the residual (or an
    // overlapped sync's worker holds them): the checkpoint of the round
    // boundary, or of the last merge, stays the one to resume from.
    log().warn("[site:{}] not checkpointing: the sync of round {} {}; a restart resumes from "
               "the last round boundary's checkpoint (before the first one, it joins afresh)",
               impl_->self.id, round(),
               impl_->overlap.pending ? "is still in flight" : "did not finish");
    return;
  }
  impl_->save_checkpoint();
}
void SiteCore::stop(std::chrono::milliseconds grace) {
  // Async-signal-safe: clock_gettime and lock-free atomics only.
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  impl_->stop_deadline_ns.store(now + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::max(grace, std::chrono::milliseconds(0)))
                                          .count());
  impl_->stop_requested.store(true);
}

bool SiteCore::leave(std::chrono::milliseconds timeout) {
  LogScope scope(impl_->self.id, &impl_->round);
  return impl_->leave(timeout);
}

void SiteCore::Impl::throw_if_stopped(const char* where) const {
  if (!stop_requested.load()) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (in_sync.load() && now < stop_deadline_ns.load()) return;  // it may still finish
  {
    throw StoppedError("site '" + self.id + "' stopped " + where + " (round " +
                       std::to_string(round) + ")");
  }
}
void SiteCore::set_data_position(uint64_t p) { impl_->data_position = p; }
uint64_t SiteCore::data_position() const { return impl_->data_position; }
bool SiteCore::resumed() const { return impl_->resumed; }
std::vector<std::string> SiteCore::alarms() const {
  // An overlapped sync's worker owns the security layer until the merge.
  if (impl_->overlap.pending) return impl_->overlap.alarms;
  impl_->security->tick(/*all=*/true);
  return impl_->overlap.alarms = impl_->security->alarms();
}
uint64_t SiteCore::round() const {
  return impl_->overlap.pending ? impl_->overlap.round : impl_->round;
}
const float* SiteCore::anchor() const {
  return impl_->anchor.empty() ? impl_->params : impl_->anchor.data();
}
bool SiteCore::finished() const { return !impl_->overlap.pending && impl_->finished; }
uint64_t SiteCore::inner_steps() const { return impl_->cfg.inner_steps; }
uint64_t SiteCore::overlap_steps() const { return impl_->topo.federation().overlap_steps; }
uint64_t SiteCore::rounds() const { return impl_->cfg.rounds; }
PendingSync SiteCore::begin_sync() {
  LogScope scope(impl_->self.id, &impl_->round);
  impl_->begin_sync();
  return PendingSync(this, impl_->overlap.generation);
}
bool SiteCore::sync_pending() const { return impl_->overlap.pending; }
bool SiteCore::sync_ready() const { return impl_->sync_ready(); }
SyncResult SiteCore::finish_sync() {
  LogScope scope(impl_->self.id, &impl_->round);
  return impl_->finish_sync();
}
const std::array<uint8_t, 32>& SiteCore::initial_digest() const { return impl_->initial_digest; }

// ---- PendingSync ----------------------------------------------------------------

PendingSync::PendingSync(PendingSync&& other) noexcept
    : core_(std::exchange(other.core_, nullptr)), generation_(other.generation_) {}

PendingSync& PendingSync::operator=(PendingSync&& other) noexcept {
  core_ = std::exchange(other.core_, nullptr);
  generation_ = other.generation_;
  return *this;
}

bool PendingSync::valid() const {
  return core_ != nullptr && core_->impl_->overlap.pending &&
         core_->impl_->overlap.generation == generation_;
}

bool PendingSync::ready() const { return valid() && core_->impl_->sync_ready(); }

std::optional<SyncResult> PendingSync::wait(std::chrono::milliseconds timeout) {
  if (!valid()) {
    throw Error(core_ == nullptr
                    ? std::string("this PendingSync refers to no sync")
                    : "site '" + core_->impl_->self.id + "': this sync was merged already");
  }
  if (!core_->impl_->overlap.wait_done(timeout)) return std::nullopt;
  SiteCore* core = std::exchange(core_, nullptr);
  return core->finish_sync();
}

}  // namespace fedwan
