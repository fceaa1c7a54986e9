// SiteCore, membership: a graceful leave, and the pause outside the site's
// participation windows (NodeSpec::windows). Both are announced to the
// parent on a heartbeat (wire::kFlagLeaving, kFlagPausing), so it stops
// waiting for the site at once instead of after its heartbeat timeout; a
// paused site comes back with a hello and is welcomed, with a resync, at
// the parent's next round boundary (docs/protocol.md, "Membership").
#include <chrono>
#include <ctime>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "common/utc_time.hpp"
#include "fedwan/error.hpp"
#include "site/site_impl.hpp"

namespace fedwan {
namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool SiteCore::Impl::announce(uint8_t flag, Millis timeout, SyncResult* res) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (link().established() && parent().heartbeat(round, flag)) return true;
    pump(Millis(50), res);
  }
  return false;
}

void SiteCore::Impl::await_welcome(Millis timeout, const char* why, SyncResult* res) {
  const auto deadline = Clock::now() + timeout;
  while (welcome.awaiting || incoming.full_pending()) {
    if (Clock::now() >= deadline) {
      throw TimeoutError("site '" + self.id + "': no welcome from parent '" +
                         topo.node(self.parent_index).id + "' at " + link().endpoint() +
                         " within " + std::to_string(timeout.count() / 1000) + " s " + why);
    }
    throw_if_stopped(why);
    pump(Millis(100), res);
  }
}

bool SiteCore::Impl::leave(Millis timeout) {
  if (overlap.pending) {
    throw Error("site '" + self.id + "': a sync is pending; call finish_sync() before leave()");
  }
  if (left) return true;
  if (!joined || finished) {
    left = true;
    return false;
  }
  SyncResult res;
  const bool told = announce(wire::kFlagLeaving, timeout, &res);
  left = true;
  // The round it leaves in: what it trained and sent since the last sync.
  cost_training_ends();
  cost_link_bytes();
  costs.round_ended(round, false);
  security->audit("left", {{"round", round}, {"parent_told", told}});
  if (told) {
    log().info("[site:{}] left the federation at round {}", self.id, round);
  } else {
    log().warn("[site:{}] left at round {}, but the parent could not be told within {} ms; it "
               "stops waiting for this site after its heartbeat timeout",
               self.id, round, timeout.count());
  }
  return told;
}

void SiteCore::Impl::pause_outside_window(SyncResult* res) {
  if (windows.always() || finished || left) return;
  const int64_t now = unix_now();
  if (windows.open_at(now)) return;
  const int64_t wait = windows.seconds_until_open(now);
  log().info("[site:{}] outside its participation windows at round {}; pausing until {} UTC "
             "({} s)",
             self.id, round, utc_text(static_cast<std::time_t>(now + wait)), wait);
  const bool told = announce(wire::kFlagPausing, cfg.heartbeat_timeout, res);
  site_metrics.paused = true;
  update_metrics(true);
  security->audit("paused", {{"round", round}, {"seconds", wait}, {"parent_told", told}});
  const auto t0 = Clock::now();
  // Nothing goes over the link while paused: the parent does not expect
  // this site, and a heartbeat would only keep a session nobody uses.
  while (!windows.open_at(unix_now())) {
    throw_if_stopped("while paused outside its participation windows");
    update_metrics();  // at most once a second
    std::this_thread::sleep_for(Millis(100));
  }
  res->paused_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  site_metrics.paused = false;
  // A new session and a hello: welcomed at the parent's next round
  // boundary, with the model of that round in full.
  reconnect("its participation window opened", /*grow_backoff=*/false);
  await_welcome(cfg.round_timeout, "after its participation window opened", res);
  security->audit("resumed", {{"round", round}, {"paused_seconds", res->paused_seconds}});
  log().info("[site:{}] back in its participation window at round {} after {:.1f} s", self.id,
             round, res->paused_seconds);
}

}  // namespace fedwan
