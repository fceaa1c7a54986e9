// What a node learns about its own loop from the times it turns: a turn
// later than two periods means the loop was away meanwhile (a checkpoint
// of a large model written on it, a slow disk, the host reclaiming memory,
// a caller that trained without servicing its site). Silence of peers
// during that time is the node's own deafness, not theirs: what they sent
// waits unread. An aggregator ticks it from its heartbeat timer, a site
// from each turn of its link (session::ParentSession::turn). Pure: the
// caller passes the time.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>

namespace fedwan {

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

  // A peer last heard at `t` is credited with `d` this node spent away:
  // `t` moves on by `d`, never past `now`. The zero time point (never
  // heard: judged at once) stays.
  static void credit(Clock::time_point& t, Clock::duration d, Clock::time_point now) {
    if (t != Clock::time_point{} && t < now) t = std::min(now, t + d);
  }

  // The time away until `now` was accounted for otherwise (the node
  // credited its peers with a checkpoint's duration itself): the next tick
  // counts from `now`, so nothing is credited twice.
  void reset(Clock::time_point now) { last_ = now; }

 private:
  Clock::duration period_{0};
  std::optional<Clock::time_point> last_;
};

}  // namespace fedwan
