#include "transport/stream_governor.hpp"

#include <algorithm>

namespace fedwan::transport {

StreamGovernor::StreamGovernor(Options options) : options_(options) {
  options_.max = std::max<size_t>(1, options_.max);
  options_.epoch = std::max(options_.epoch, std::chrono::milliseconds(1));
  options_.gain = std::max(1.0, options_.gain);
  if (options_.max == 1) phase_ = Phase::kSettled;
}

void StreamGovernor::start_epoch(Clock::time_point now) {
  running_ = true;
  start_ = now;
  bytes_ = 0;
  blocked_ = false;
}

void StreamGovernor::sent(size_t bytes, Clock::time_point now) {
  // After an idle spell a new epoch starts: idle time says nothing of the
  // link, and the counters from before it are stale.
  if (!running_ || now - last_activity_ > options_.epoch) {
    start_epoch(now);
    tcp_start_.reset();
  }
  bytes_ += bytes;
  sent_total_ += bytes;
  last_activity_ = now;
}

void StreamGovernor::blocked(Clock::time_point now) {
  if (!running_ || now - last_activity_ > options_.epoch) {
    start_epoch(now);
    tcp_start_.reset();
  }
  if (!blocked_) first_blocked_ = now;
  blocked_ = true;
  last_blocked_ = now;
  last_activity_ = now;
}

bool StreamGovernor::tick(Clock::time_point now, std::optional<TcpCounters> tcp,
                          Change* change) {
  if (!due(now)) return false;
  const auto len = now - start_;
  // The link was the limit throughout: the sender found it full near the
  // epoch's start and near its end...
  bool backlogged =
      blocked_ && first_blocked_ - start_ <= len / 4 && now - last_blocked_ <= len / 4;
  const std::optional<TcpCounters> from = tcp_start_;
  const uint64_t backlog_from = backlog_start_;
  tcp_start_ = tcp;
  uint64_t moved = bytes_;
  bool lossy = false;
  if (tcp) {
    backlog_start_ = sent_total_ > tcp->acked ? sent_total_ - tcp->acked : 0;
    // Draining a backlog is activity: the next send does not start over.
    if (backlog_start_ >= kPerConnection) last_activity_ = now;
    // A connection that closed takes its counts with it: no measurement.
    if (!from || tcp->acked < from->acked || tcp->retransmits < from->retransmits) {
      start_epoch(now);
      return false;
    }
    moved = tcp->acked - from->acked;
    lossy = tcp->retransmits > from->retransmits;
    // ... or, with TCP, what it had handed over and its peer had not yet
    // acknowledged when the epoch began (waiting in queues and socket
    // buffers, or in flight) was more than the epoch moved, by kPerConnection
    // for each connection in use: none ran dry. (With many connections the
    // queues can hold a whole update, and the sender is never refused.)
    backlogged = backlogged || backlog_from >= moved + kPerConnection * active_;
  }
  const double rate = static_cast<double>(moved) / std::chrono::duration<double>(len).count();
  start_epoch(now);
  const bool moved_bytes = moved > 0;
  // Nothing went through at all: the peer stalled, the link was not measured.
  if (!backlogged || !moved_bytes) return false;
  if (warming_) {  // a new connection is still in slow start
    warming_ = false;
    return false;
  }
  measured_ += 1;
  return decide(rate, lossy, change);
}

bool StreamGovernor::move_to(size_t k, double rate, const char* why, Change* change) {
  k = std::clamp<size_t>(k, 1, options_.max);
  if (k == active_) return false;
  if (change != nullptr) *change = Change{active_, k, rate, why};
  active_ = k;
  peak_ = std::max(peak_, k);
  warming_ = true;
  return true;
}

bool StreamGovernor::decide(double rate, bool lossy, Change* change) {
  switch (phase_) {
    case Phase::kRamp:
      if (base_rate_ <= 0) {  // the first measurement, at one connection
        base_ = active_;
        base_rate_ = rate;
        if (!lossy) {  // one connection is not held back by loss: measure again
          base_rate_ = 0;
          return false;
        }
        return move_to(active_ * 2, rate, "lossy link, first measurement", change);
      }
      [[fallthrough]];
    case Phase::kProbeUp:
      if (rate >= options_.gain * base_rate_) {
        base_ = active_;
        base_rate_ = rate;
        if (phase_ == Phase::kRamp && active_ < options_.max && lossy) {
          return move_to(active_ * 2, rate, "more connections paid", change);
        }
        phase_ = Phase::kSettled;
        return false;
      }
      phase_ = Phase::kSettled;
      return move_to(base_, rate, "more connections did not pay", change);
    case Phase::kProbeDown:
      phase_ = Phase::kSettled;
      if (rate * options_.gain >= base_rate_) {
        base_ = active_;
        base_rate_ = rate;
        return false;
      }
      return move_to(base_, rate, "fewer connections cost goodput", change);
    case Phase::kSettled:
      base_ = active_;
      base_rate_ = rate;
      if (++settled_epochs_ < options_.settle_epochs) return false;
      settled_epochs_ = 0;
      const bool up = next_probe_up_;
      next_probe_up_ = !next_probe_up_;
      if (up && active_ < options_.max && lossy) {
        phase_ = Phase::kProbeUp;
        return move_to(active_ * 2, rate, "probing for more", change);
      }
      if (active_ > 1) {
        phase_ = Phase::kProbeDown;
        return move_to(active_ / 2, rate, "probing for fewer", change);
      }
      return false;
  }
  return false;
}

}  // namespace fedwan::transport
