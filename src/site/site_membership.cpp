// SiteCore, membership: joining (from its checkpoint, or its parent's
// replica when it has none), a graceful leave, and the pause outside the site's
// participation windows (NodeSpec::windows). Both are announced to the
// parent on a heartbeat (wire::kFlagLeaving, kFlagPausing), so it stops
// waiting for the site at once instead of after its heartbeat timeout; a
// paused site comes back with a hello and is welcomed, with a resync, at
// the parent's next round boundary (docs/protocol.md, "Membership").
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/replica_fetch.hpp"
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

// "0.5 s", "300 s": a timeout as its user gave it (a sub-second join
// timeout must not read "within 0 s").
std::string seconds_text(std::chrono::milliseconds d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g s", static_cast<double>(d.count()) / 1000.0);
  return text;
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

// ---- joining ---------------------------------------------------------------------

SyncResult SiteCore::Impl::join() {
  if (joined) throw Error("site '" + self.id + "' already joined");
  if (left) throw Error("site '" + self.id + "' has left the federation");
  SyncResult res;
  // From a checkpoint, when there is one; with none intact, from the copy
  // the parent keeps (then resumed like a local one).
  if (!resume() && !opt.checkpoint_dir.empty() &&
      checkpoint::fetch_replica(
          link(),
          [this](const std::string& why) -> transport::ParentLink& {
            // The fetch paces its new sessions itself; a backoff grown here
            // would only hold back the join's first reconnect afterwards.
            reconnect(why, /*grow_backoff=*/false);
            return link();
          },
          topo, self, cfg, opt.checkpoint_dir, plan.total(), opt.join_timeout, *security,
          &stop_requested)) {
    resume();
  }
  // Sent once the secure session is up (upkeep); asked again when lost.
  welcome.hello_pending = true;
  welcome.awaiting = true;
  welcome.hello_sent_at = Clock::now();
  uplink->progressed(welcome.hello_sent_at);
  parent().heard(Clock::now(), /*reset_backoff=*/false);
  const auto deadline = Clock::now() + opt.join_timeout;
  while (welcome.awaiting || incoming.full_pending()) {
    if (Clock::now() >= deadline) {
      if (!link().established()) {
        throw TimeoutError(
            "TLS handshake with parent " + link().endpoint() + " did not complete within " +
            std::to_string(opt.join_timeout.count()) +
            " ms: is the parent running, with its credentials?" +
            (welcome.last_link_error.empty() ? "" : " Last error: " + welcome.last_link_error));
      }
      throw TimeoutError("site '" + self.id + "': no welcome from parent '" +
                         topo.node(self.parent_index).id + "' at " + link().endpoint() +
                         " within " + seconds_text(opt.join_timeout) + " (is it running?)");
    }
    throw_if_stopped("while joining");
    pump(Millis(100), &res);
  }
  joined = true;
  log().info("[site:{}] joined at round {}", self.id, round);
  pause_outside_window(&res);
  res.round = round;
  res.finished = finished;
  cost_link_bytes();
  trained_since = Clock::now();
  update_metrics(true);
  return res;
}

}  // namespace fedwan
