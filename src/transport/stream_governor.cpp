#include "transport/stream_governor.hpp"

#include <algorithm>

namespace fedwan::transport {

StreamGovernor::StreamGovernor(Options options) : options_(options) {
  options_.max = std::max<size_t>(1, options_.max);
  options_.epoch = std::max(options_.epoch, std::chrono::milliseconds(1));
  options_.keep = std::clamp(options_.keep, 0.0, 1.0);
  options_.settle_epochs = std::max<size_t>(1, options_.settle_epochs);
  options_.first_lossy_count = std::clamp<size_t>(options_.first_lossy_count, 1, options_.max);
  retry_after_ = std::min(kFirstRetry, options_.settle_epochs);
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

bool StreamGovernor::tick(Clock::time_point now, std::optional<TcpCounters> tcp, Change* change) {
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
    if (backlog_start_ >= kQueued) last_activity_ = now;
    // A connection that closed takes its counts with it: no measurement.
    if (!from || tcp->acked < from->acked || tcp->retransmits < from->retransmits) {
      start_epoch(now);
      return false;
    }
    moved = tcp->acked - from->acked;
    // Only a long link's losses hold a connection's window down for long:
    // on a loopback or LAN one recovers within a millisecond (and a slow
    // reader can make loopback TCP drop and resend).
    lossy = tcp->retransmits > from->retransmits && tcp->rtt_us >= kLongRttUs;
    // ... or, with TCP, what it had handed over and its peer had not yet
    // acknowledged was more than its connections' windows let be in flight,
    // by kQueued for each connection in use, when the epoch began and when
    // it ended: the rest waited in queues and socket buffers throughout.
    // With many connections the queues can hold a whole update, and the
    // sender is never refused; a bar of the windows' size, not a fixed one
    // per connection, lets a link whose 16 small CUBIC windows carry 20 MB/s
    // see that they hold it back, and an epoch at an update's tail, when
    // the queues ran dry, is no measurement.
    const uint64_t queued = kQueued * active_;
    backlogged = backlogged ||
                 (backlog_from >= from->window + queued && backlog_start_ >= tcp->window + queued);
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
  return decide(rate, lossy, moved, change);
}

bool StreamGovernor::move_to(size_t k, double rate, const char* why, Change* change) {
  k = std::clamp<size_t>(k, 1, options_.max);
  if (k == active_) return false;
  if (change != nullptr) *change = Change{active_, k, rate, why};
  active_ = k;
  peak_ = std::max(peak_, k);
  warming_ = true;
  at_count_ = 0;
  return true;
}

bool StreamGovernor::decide(double rate, bool lossy, uint64_t moved, Change* change) {
  // An epoch without a retransmission says the link is clean only when it
  // carried enough packets to have lost one at the loss rates that keep
  // CUBIC's windows small (a slow tail of an update at 0.1% loss often
  // has none): fewer neither count nor break a clean run.
  if (lossy) {
    clean_epochs_ = 0;
  } else if (moved >= kCleanEpochBytes) {
    clean_epochs_ += 1;
  }
  if (probing_) {
    // The count was just doubled: kept unless the goodput fell, in both of
    // its first two measured epochs (one alone is noise on a lossy link: a
    // loss on the new connections, or the old ones' windows collapsing).
    probe_best_ = std::max(probe_best_, rate);
    if (probe_best_ >= options_.keep * base_rate_) {
      // The doubling paid: the next one needs no wait, whatever was undone
      // before (an early undo is often a first connection's slow start
      // ending in losses, not the count).
      probing_ = false;
      settled_ = false;
      retry_after_ = std::min(kFirstRetry, options_.settle_epochs);
    } else if (++probe_epochs_ >= 2) {
      probing_ = false;
      settled_ = true;
      settled_epochs_ = 0;
      // Tried again after 2 measured epochs, then 4, ... up to
      // settle_epochs while doublings keep being undone.
      settle_for_ = retry_after_;
      retry_after_ = std::min(retry_after_ * 2, options_.settle_epochs);
      return move_to(base_, rate, "more connections cost goodput", change);
    } else {
      return false;
    }
  }
  // The first loss on a long link: one CUBIC connection's share of it is
  // small (about 6 Mbit/s at 0.1% loss and 80 ms), and climbing from one
  // by doublings would take rounds. It starts from first_lossy_count, and
  // goes on from there as below.
  if (lossy && !started_) {
    started_ = true;
    if (active_ < options_.first_lossy_count) {
      return move_to(options_.first_lossy_count, rate, "a long link lost packets", change);
    }
  }
  // The base of the next doubling is the least goodput seen at this count:
  // a new connection's first epochs, before its first loss, read far above
  // what it keeps (12 MB/s on one CUBIC connection that then carries 0.75),
  // and against such a base every doubling would look like a loss.
  base_rate_ = at_count_ == 0 || base_ != active_ ? rate : std::min(base_rate_, rate);
  base_ = active_;
  at_count_ += 1;
  // Losses hold each connection's window down: more of them carry more,
  // while the link has more to carry than it takes. One measured epoch at
  // a count comes first (that of the doubling that led to it, when it was
  // kept); four at one connection, whose first seconds (slow start, then
  // the losses that end it) are no base for a doubling.
  if (lossy && active_ < options_.max && at_count_ >= measured_before_doubling() &&
      (!settled_ || ++settled_epochs_ >= settle_for_)) {
    probing_ = true;
    probe_best_ = 0;
    probe_epochs_ = 0;
    settled_epochs_ = 0;
    return move_to(active_ * 2, rate, "lossy link held the sender back", change);
  }
  if (lossy && active_ < options_.max) return false;
  // No loss for a while: a connection's window is not what limits it.
  if (active_ > 1 && clean_epochs_ >= options_.settle_epochs) {
    clean_epochs_ = 0;
    return move_to(active_ / 2, rate, "no loss: fewer connections suffice", change);
  }
  return false;
}

}  // namespace fedwan::transport
