// Delivers the frames of a link striped over several connections in an
// order the protocol above can rely on, without making every frame wait for
// every earlier one. Each connection delivers in order, but a frame on a
// slow connection (one in loss recovery) is overtaken by later ones on the
// others. Chunks are independent units and go on at once; only what must
// not be overtaken waits (wire/frame_order.hpp): a barrier or a heartbeat
// waits for every frame sealed before it, a chunk for the barriers before
// it, a checkpoint piece for the barriers and pieces before it. Order is the
// secure channel's authenticated sequence number and the header's
// authenticated order tag (ChannelSecurity::Order), so a network attacker
// cannot reorder what the protocol above sees beyond what the sender allowed.
//
// A frame that does not come (lost when a connection broke) is given up
// after `max_wait`, at once when `max_frames` are held waiting, or when
// frames 1024 sequence numbers past it have come (the replay window would
// refuse it): what waited goes on, the missing one, should it still come, is
// delivered late, and stats().gaps_skipped counts it; the owner takes that as
// the link having failed and the protocol above recovers as after any
// reconnect. Frames whose order tags can never be satisfied (a dishonest
// sender) count the same way once `max_frames` are held. A new session (new
// keys) starts the count again and drops what the old one still held.
//
// A link that may become striped (`streams: auto`) runs through its
// resequencer from the start, marked single (set_striped(false)) while it
// has one connection: frames go on as they come, as on any one connection,
// and a missing one (dropped or refused on the way) is passed over without
// ending the link, while the counts stay in step for when a second
// connection opens.
//
// Not thread safe: owned by the link's thread.
#pragma once

#include <any>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>

#include "transport/channel_security.hpp"
#include "transport/transport.hpp"

namespace fedwan::transport {

class Resequencer {
 public:
  using Clock = std::chrono::steady_clock;
  // Sequence numbers tracked past a missing one: the replay window's span.
  static constexpr uint64_t kSpan = 1024;

  struct Options {
    size_t max_frames = 64;                    // held waiting, at most
    std::chrono::milliseconds max_wait{5000};  // for a missing frame
  };
  struct Frame {
    Message message;
    size_t frame_size = 0;
    std::any inspected;  // Incoming::inspected
  };
  struct Stats {
    uint64_t held = 0;          // frames that waited for an earlier one
    uint64_t overtook = 0;      // frames delivered while an earlier one was missing
    uint64_t gaps_skipped = 0;  // missing frames given up on (or unsatisfiable tags)
    uint64_t late = 0;          // frames that came after their gap was given up
    uint64_t dropped = 0;       // held frames of a session that ended
  };

  explicit Resequencer(Options options) : options_(options) {}

  // A sealed message opened at `order`: `frame` is what the link returns for
  // it, or nullopt when the security layer consumed it (its sequence number
  // and its place in the order count all the same).
  void push(const ChannelSecurity::Order& order, std::optional<Frame> frame, Clock::time_point now);
  // Whether frames may come over several connections (the default), or
  // over one (see the class comment). A link only goes from one to
  // several within a session.
  void set_striped(bool striped) { striped_ = striped; }
  bool striped() const { return striped_; }
  // The next frame ready, if any (giving up a gap whose wait ran out by `now`).
  bool pop(Frame* out, Clock::time_point now);
  // Drops every frame held, ready or not (counted as dropped).
  void clear();
  // When pop() may have a frame without another push(): now when one is
  // ready, the end of the current gap's wait, or Clock::time_point::max().
  Clock::time_point wake_at() const;
  // Frames held, ready or waiting.
  size_t holding() const { return ready_.size() + held_.size(); }
  const Stats& stats() const { return stats_; }
  const Options& options() const { return options_; }
  uint64_t session() const { return session_; }

 private:
  struct Held {
    std::optional<Frame> frame;
    wire::OrderClass klass = wire::OrderClass::kBarrier;
    wire::OrderTag tag{};
  };
  void arrive(uint64_t seq, Clock::time_point now);
  bool deliverable(uint64_t seq, const Held& h, bool first) const;
  void deliver(uint64_t seq, Held& h);
  // Delivers every held frame whose turn has come.
  void settle();
  void skip_gap(Clock::time_point now);
  // Too many held with nothing missing: tags that cannot be satisfied.
  void flush_unsatisfiable();

  Options options_;
  bool started_ = false;
  bool striped_ = true;
  uint64_t session_ = 0;
  uint64_t next_ = 0;              // every number below has come (or was given up)
  std::set<uint64_t> ahead_;       // numbers above next_ that have come
  std::map<uint64_t, Held> held_;  // come, not yet deliverable
  std::deque<Frame> ready_;
  uint16_t barriers_ = 0, pieces_ = 0;  // delivered, modulo 2^16
  Clock::time_point gap_since_{};
  Stats stats_;
};

}  // namespace fedwan::transport
