// Puts the frames of a link striped over several connections back in the
// order their sender sealed them. Each connection delivers in order, but a
// frame on a slow connection is overtaken by later ones on the others; the
// receiver holds those until the gap fills. The order is the secure
// channel's authenticated sequence number (ChannelSecurity::Order), so a
// network attacker cannot reorder what the protocol above sees any more
// than it could on one connection.
//
// A gap that does not fill (its frame was lost when a connection broke) is
// given up after `max_wait`, or at once when `max_frames` are held: the held
// frames go on, and the missing one, should it still come, is delivered late
// (the replay window has already refused duplicates). The protocol above
// recovers a lost frame as it does after any reconnect. A new session (new
// keys) starts the count again and drops what the old one still held.
//
// Not thread safe: owned by the link's thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>

#include "transport/channel_security.hpp"
#include "transport/transport.hpp"

namespace fedwan::transport {

class Resequencer {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    size_t max_frames = 64;                    // held out of order, at most
    std::chrono::milliseconds max_wait{5000};  // for a missing frame
  };
  struct Frame {
    Message message;
    size_t frame_size = 0;
  };
  struct Stats {
    uint64_t held = 0;          // frames that waited for an earlier one
    uint64_t gaps_skipped = 0;  // missing frames given up on
    uint64_t late = 0;          // frames that came after their gap was given up
    uint64_t dropped = 0;       // held frames of a session that ended
  };

  explicit Resequencer(Options options) : options_(options) {}

  // A sealed message opened at `order`: `frame` is what the link returns for
  // it, or nullopt when the security layer consumed or refused it (its
  // sequence number is used up all the same).
  void push(ChannelSecurity::Order order, std::optional<Frame> frame, Clock::time_point now);
  // The next frame in order, if one is ready (giving up a gap whose wait ran
  // out by `now`).
  bool pop(Frame* out, Clock::time_point now);
  // Drops every frame held, ready or not (counted as dropped).
  void clear();
  // When pop() may have a frame without another push(): the end of the
  // current gap's wait; Clock::time_point::max() when none is running.
  Clock::time_point wake_at() const;
  // Frames held, ready or waiting for a gap.
  size_t holding() const { return ready_.size() + held_.size(); }
  const Stats& stats() const { return stats_; }
  const Options& options() const { return options_; }
  uint64_t session() const { return session_; }

 private:
  void drain(Clock::time_point now);
  void skip_gap(Clock::time_point now);

  Options options_;
  bool started_ = false;
  uint64_t session_ = 0;
  uint64_t next_ = 0;  // the sequence number the link returns next
  std::map<uint64_t, std::optional<Frame>> held_;
  std::deque<Frame> ready_;
  Clock::time_point gap_since_{};
  Stats stats_;
};

}  // namespace fedwan::transport
