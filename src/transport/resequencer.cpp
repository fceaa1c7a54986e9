#include "transport/resequencer.hpp"

#include <utility>

namespace fedwan::transport {

namespace {

// Whether `tag` (what was sealed before a frame) is no further than `done`
// (what has been delivered), modulo 2^16.
bool reached(uint16_t tag, uint16_t done) { return static_cast<int16_t>(tag - done) <= 0; }

}  // namespace

void Resequencer::push(const ChannelSecurity::Order& order, std::optional<Frame> frame,
                       Clock::time_point now) {
  if (!started_ || order.session != session_) {
    // Frames already ready stay deliverable; what waited never will be.
    for (auto& [seq, h] : held_) {
      if (h.frame) stats_.dropped += 1;
    }
    held_.clear();
    ahead_.clear();
    started_ = true;
    session_ = order.session;
    next_ = 0;
    barriers_ = pieces_ = 0;
  }
  if (!striped_ && held_.empty()) {
    // One connection delivers in order: what is missing was lost or refused
    // on the way, and nothing will overtake it.
    if (order.seq >= next_) {
      next_ = order.seq + 1;
      ahead_.clear();
      barriers_ = order.tag.barriers;
      pieces_ = order.tag.pieces;
      if (order.klass == wire::OrderClass::kBarrier)
        barriers_ = static_cast<uint16_t>(barriers_ + 1);
      if (order.klass == wire::OrderClass::kPiece) pieces_ = static_cast<uint16_t>(pieces_ + 1);
    }
    if (frame) ready_.push_back(std::move(*frame));
    return;
  }
  if (order.seq < next_) {
    // Its gap was given up: late, but not lost.
    if (frame) {
      stats_.late += 1;
      ready_.push_back(std::move(*frame));
    }
    return;
  }
  if (order.seq - next_ >= kSpan) {
    // The missing frame can no longer be opened: the replay window moved on.
    skip_gap(now);
    if (order.seq - next_ >= kSpan) {
      stats_.gaps_skipped += order.seq - next_;
      next_ = order.seq;
    }
  }
  const bool was_gap = !ahead_.empty();
  arrive(order.seq, now);
  const bool has_frame = frame.has_value();
  held_.emplace(order.seq, Held{std::move(frame), order.klass, order.tag});
  settle();
  if (has_frame && held_.count(order.seq) != 0) stats_.held += 1;
  if (!was_gap && !ahead_.empty()) gap_since_ = now;
  if (held_.size() > options_.max_frames) {
    if (!ahead_.empty()) skip_gap(now);
    if (held_.size() > options_.max_frames) flush_unsatisfiable();
  }
}

void Resequencer::arrive(uint64_t seq, Clock::time_point now) {
  if (seq != next_) {
    ahead_.insert(seq);
    return;
  }
  next_ += 1;
  while (!ahead_.empty() && *ahead_.begin() == next_) {
    ahead_.erase(ahead_.begin());
    next_ += 1;
  }
  // The wait for the next gap starts once the one before it filled.
  gap_since_ = now;
}

bool Resequencer::deliverable(uint64_t seq, const Held& h, bool first) const {
  switch (h.klass) {
    case wire::OrderClass::kBarrier:
    case wire::OrderClass::kFollow:
      // Everything sealed before it has come and none of it still waits.
      return first && seq < next_;
    case wire::OrderClass::kChunk: return reached(h.tag.barriers, barriers_);
    case wire::OrderClass::kPiece:
      return reached(h.tag.barriers, barriers_) && reached(h.tag.pieces, pieces_);
  }
  return false;
}

void Resequencer::deliver(uint64_t seq, Held& h) {
  if (h.klass == wire::OrderClass::kBarrier) barriers_ = static_cast<uint16_t>(barriers_ + 1);
  if (h.klass == wire::OrderClass::kPiece) pieces_ = static_cast<uint16_t>(pieces_ + 1);
  if (!h.frame) return;
  if (seq > next_) stats_.overtook += 1;
  ready_.push_back(std::move(*h.frame));
}

void Resequencer::settle() {
  for (bool moved = true; moved;) {
    moved = false;
    for (auto it = held_.begin(); it != held_.end();) {
      if (deliverable(it->first, it->second, it == held_.begin())) {
        deliver(it->first, it->second);
        it = held_.erase(it);
        moved = true;
      } else {
        ++it;
      }
    }
  }
}

void Resequencer::skip_gap(Clock::time_point now) {
  if (ahead_.empty()) return;
  const uint64_t first = *ahead_.begin();
  ahead_.erase(ahead_.begin());
  stats_.gaps_skipped += first - next_;
  next_ = first;
  arrive(first, now);
  settle();
}

void Resequencer::flush_unsatisfiable() {
  stats_.gaps_skipped += 1;
  for (auto& [seq, h] : held_) {
    if (h.frame) ready_.push_back(std::move(*h.frame));
  }
  held_.clear();
}

bool Resequencer::pop(Frame* out, Clock::time_point now) {
  if (ready_.empty() && !ahead_.empty() && now - gap_since_ >= options_.max_wait) {
    skip_gap(now);
  }
  if (ready_.empty()) return false;
  *out = std::move(ready_.front());
  ready_.pop_front();
  return true;
}

void Resequencer::clear() {
  for (auto& [seq, h] : held_) {
    if (h.frame) stats_.dropped += 1;
  }
  stats_.dropped += ready_.size();
  held_.clear();
  ready_.clear();
  ahead_.clear();
}

Resequencer::Clock::time_point Resequencer::wake_at() const {
  if (!ready_.empty()) return Clock::time_point::min();
  if (ahead_.empty()) return Clock::time_point::max();
  return gap_since_ + options_.max_wait;
}

}  // namespace fedwan::transport
