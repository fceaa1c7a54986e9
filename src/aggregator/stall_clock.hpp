// What a node's periodic heartbeat timer learns about its own event loop:
// a tick later than two periods means the loop was away meanwhile (a
// checkpoint of a large model written on it, a slow disk, the host
// reclaiming memory). Silence of peers during that time is the node's own
// deafness, not theirs: what they sent waits unread. Pure: the caller
// passes the time.
#pragma once

#include <chrono>
#include <optional>

namespace fedwan::aggregator {

class StallClock {
 public:
  using Clock = std::chrono::steady_clock;

  StallClock() = default;  // never away, until given a period
  explicit StallClock(Clock::duration period) : period_(period) {}

  // One tick at `now`: how long the loop was away since the last tick
  // beyond the period it owed (zero when on time, late by at most one
  // period, at the first tick, or when time went backwards).
  Clock::duration tick(Clock::time_point now) {
    Clock::duration away{0};
    if (last_ && period_ > Clock::duration::zero() && now - *last_ > 2 * period_) {
      away = now - *last_ - period_;
    }
    last_ = now;
    return away;
  }

 private:
  Clock::duration period_{0};
  std::optional<Clock::time_point> last_;
};

}  // namespace fedwan::aggregator
