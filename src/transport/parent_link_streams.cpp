// ParentLink's connections (parent_link.cpp has the rest): opening them
// as its governor asks (`streams: auto`), how many carry frames now, and
// whether a frame goes in pieces.
#include "transport/links.hpp"

#include <algorithm>
#include <string>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "transport/routing_id.hpp"

namespace fedwan::transport {

using Clock = std::chrono::steady_clock;

void ParentLink::open_stripe() {
  const size_t k = stripes_.size();
  // Under this link's own tag: a connection of a link this node replaced
  // can never take one of this link's over at the parent (routing_id.hpp).
  const std::string id = routing_id(k);
  LinkOptions o = options_;
  // An adaptive link may open dozens: each further connection queues half
  // the window (frames waiting for its TCP connection), not all of it.
  if (governor_ && k > 0) o.window = std::max(2, options_.window / 2);
  stripes_.push_back(transport_.connect(endpoint_, id, o));
}

std::string ParentLink::routing_id(size_t k) const {
  return transport::routing_id(self_id_, k, link_tag_);
}

size_t ParentLink::active_streams() const {
  return governor_ ? std::min(governor_->active(), stripes_.size()) : stripes_.size();
}

void ParentLink::govern(std::optional<size_t> sent) {
  if (!governor_) return;
  const auto now = Clock::now();
  if (sent) {
    governor_->sent(*sent, now);
  } else {
    governor_->blocked(now);
  }
  govern_tick(now);
}

void ParentLink::govern_tick(Clock::time_point now) {
  if (!governor_ || !governor_->due(now)) return;
  // BBR keeps one connection's link full despite loss: the first choice,
  // one connection, stays.
  if (stripes_.front()->congestion_control() == "bbr") return;
  // What the kernel counts on the link's connections.
  std::optional<TcpCounters> tcp;
  for (auto& s : stripes_) {
    if (const auto c = s->tcp_counters()) {
      if (!tcp) tcp.emplace();
      tcp->acked += c->acked;
      tcp->retransmits += c->retransmits;
      tcp->rtt_us = std::max(tcp->rtt_us, c->rtt_us);
      tcp->window += c->window;
    }
  }
  StreamGovernor::Change c;
  if (!governor_->tick(now, tcp, &c)) return;
  try {
    while (stripes_.size() < governor_->active()) open_stripe();
    announce_ = c.to > c.from;
  } catch (const TransportError& e) {
    log().warn("link to parent {}: cannot open connection {}: {}", endpoint_, stripes_.size() + 1,
               e.what());
  }
  log().info("link to parent {}: {} -> {} TCP connections ({}; {:.1f} MB/s at {})", endpoint_,
             c.from, c.to, c.why, c.rate / 1e6, c.from);
}

bool ParentLink::fragmenting(size_t size) {
  if (size < 2 * kFragmentBytes || !security_->established() || active_streams() < 2) return false;
  // Only over a long link: there the kernel keeps each connection's queue
  // short (long_link_notsent_lowat), so pieces go where they drain; on a
  // short one its buffers would take them all at once, and the pieces would
  // only cost copies.
  return long_link();
}

bool ParentLink::long_link() {
  const auto now = Clock::now();
  if (now >= long_checked_) {
    long_checked_ = now + Millis(500);
    long_link_ = false;
    for (auto& s : stripes_) {
      const auto c = s->tcp_counters();
      long_link_ = long_link_ || (c && c->rtt_us >= options_.long_link_rtt_us);
    }
  }
  return long_link_;
}

}  // namespace fedwan::transport
