#include "transport/resequencer.hpp"

#include <utility>

namespace fedwan::transport {

void Resequencer::push(ChannelSecurity::Order order, std::optional<Frame> frame,
                       Clock::time_point now) {
  if (!started_ || order.session != session_) {
    // Frames already in order stay deliverable; what waited on a gap of the
    // old session never will be.
    for (auto& [seq, f] : held_) {
      if (f) stats_.dropped += 1;
    }
    held_.clear();
    started_ = true;
    session_ = order.session;
    next_ = 0;
  }
  if (order.seq < next_) {
    // Its gap was given up: late, but not lost.
    if (frame) {
      stats_.late += 1;
      ready_.push_back(std::move(*frame));
    }
    return;
  }
  if (order.seq == next_) {
    if (frame) ready_.push_back(std::move(*frame));
    next_ += 1;
    drain(now);
    return;
  }
  if (held_.empty()) gap_since_ = now;
  if (frame) stats_.held += 1;
  held_.emplace(order.seq, std::move(frame));
  if (held_.size() > options_.max_frames) skip_gap(now);
}

void Resequencer::drain(Clock::time_point now) {
  bool moved = false;
  while (!held_.empty() && held_.begin()->first == next_) {
    auto node = held_.extract(held_.begin());
    if (node.mapped()) ready_.push_back(std::move(*node.mapped()));
    next_ += 1;
    moved = true;
  }
  // The wait for the next gap starts once the one before it filled.
  if (moved && !held_.empty()) gap_since_ = now;
}

void Resequencer::skip_gap(Clock::time_point now) {
  if (held_.empty()) return;
  stats_.gaps_skipped += held_.begin()->first - next_;
  next_ = held_.begin()->first;
  drain(now);
}

bool Resequencer::pop(Frame* out, Clock::time_point now) {
  if (ready_.empty() && !held_.empty() && now - gap_since_ >= options_.max_wait) {
    skip_gap(now);
  }
  if (ready_.empty()) return false;
  *out = std::move(ready_.front());
  ready_.pop_front();
  return true;
}

void Resequencer::clear() {
  for (auto& [seq, f] : held_) {
    if (f) stats_.dropped += 1;
  }
  stats_.dropped += ready_.size();
  held_.clear();
  ready_.clear();
}

Resequencer::Clock::time_point Resequencer::wake_at() const {
  if (!ready_.empty()) return Clock::time_point::min();
  if (held_.empty()) return Clock::time_point::max();
  return gap_since_ + options_.max_wait;
}

}  // namespace fedwan::transport
