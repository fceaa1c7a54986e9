// How many of a link's TCP connections carry frames, for `streams: auto`
// (docs/topology.md, "Several TCP connections per link"). A loss halves one
// CUBIC connection's window, so on a long lossy link one connection keeps
// the link far from full; several share the loss. The sender measures:
// while it has more to send than the link takes, its goodput over an epoch
// (the bytes its connections' peers acknowledged, from the kernel's
// TCP_INFO; the bytes it queued where there is no TCP) is the link's rate at
// that count. "More to send" is the sender finding every connection full,
// or, with TCP, more handed over and not yet acknowledged than the
// connections' congestion windows let be in flight. Over an epoch in which a long link (5 ms round
// trip or more) lost packets (its connections retransmitted) while it held the sender back, losses
// are what keep each connection's window small, and more connections carry more: the first such
// epoch takes it from one connection to `first_lossy_count`, later ones double the count (at one
// connection after four of them), and it keeps the doubling unless the goodput fell below `keep`
// times what it was. It goes on doubling while that holds, up to `max`; once a doubling was undone
// it tries again after 2 measured epochs, then 4, ... up to `settle_epochs` while doublings keep
// being undone (and without a wait once one is kept). After `settle_epochs` measured epochs without
// loss, each carrying enough packets (4 MiB) to have lost one, it halves the count: a connection's
// window is not what limits the link. So a loopback or clean LAN link stays at one. BBR is not
// loss-based: its owner keeps such a link at one connection (ParentLink).
//
// Pure arithmetic on the caller's clock: no sockets, no threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "transport/transport.hpp"

namespace fedwan::transport {

class StreamGovernor {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    size_t max = 8;                        // connections at most
    std::chrono::milliseconds epoch{500};  // one measurement
    double keep = 0.33;                    // a doubling stays unless goodput fell below this
    size_t settle_epochs = 8;              // the longest wait between tries, and without loss
    size_t first_lossy_count = 16;         // the count at the first loss on a long link
  };
  // A change of the count: the goodput (bytes per second) measured at
  // `from` in the epoch that decided it, and why.
  struct Change {
    size_t from = 1, to = 1;
    double rate = 0;
    std::string why;
  };

  explicit StreamGovernor(Options options);

  // The connections that carry frames now, 1..max.
  size_t active() const { return active_; }
  // The most this governor has used at once (connections opened).
  size_t peak() const { return peak_; }
  // The sender put `bytes` on the link.
  void sent(size_t bytes, Clock::time_point now);
  // The sender had a frame for the link and every active connection was full.
  void blocked(Clock::time_point now);
  // Whether tick() would close an epoch now.
  bool due(Clock::time_point now) const { return running_ && now - start_ >= options_.epoch; }
  // Closes the epoch when it is due, with the link's TCP counters now
  // (nullopt without TCP: goodput is then the bytes sent, and the link is
  // taken as lossless). True (and *change filled) when the count changed.
  bool tick(Clock::time_point now, std::optional<TcpCounters> tcp, Change* change = nullptr);
  // Epochs measured so far (the sender backlogged through them).
  uint64_t measured() const { return measured_; }
  const Options& options() const { return options_; }

 private:
  void start_epoch(Clock::time_point now);
  bool decide(double rate, bool lossy, uint64_t moved, Change* change);
  size_t measured_before_doubling() const { return active_ == 1 ? 4 : 1; }
  bool move_to(size_t k, double rate, const char* why, Change* change);

  Options options_;
  size_t active_ = 1, peak_ = 1;
  bool warming_ = true;  // the first epoch at a new count is not measured
  // The count and its goodput before the probe now running.
  size_t base_ = 1;
  double base_rate_ = 0;
  size_t settled_epochs_ = 0;
  size_t at_count_ = 0;      // epochs measured at the count now in use
  size_t clean_epochs_ = 0;  // measured in a row without loss
  bool probing_ = false;     // the count was just doubled
  double probe_best_ = 0;    // the best goodput measured since
  size_t probe_epochs_ = 0;  // epochs measured since
  bool started_ = false;     // the first loss on a long link was seen
  bool settled_ = false;     // the last doubling was undone
  // Measured epochs before trying again after an undo: kFirstRetry, doubled
  // by each undo in a row up to settle_epochs; a doubling kept resets it.
  static constexpr size_t kFirstRetry = 2;
  size_t retry_after_ = kFirstRetry;
  size_t settle_for_ = kFirstRetry;
  uint64_t measured_ = 0;
  // The epoch now running.
  bool running_ = false;
  Clock::time_point start_{}, first_blocked_{}, last_blocked_{}, last_activity_{};
  bool blocked_ = false;
  uint64_t bytes_ = 0;
  // Everything the sender handed over, and how much of it its peer had not
  // acknowledged when the running epoch began.
  uint64_t sent_total_ = 0;
  uint64_t backlog_start_ = 0;
  static constexpr uint64_t kQueued = 128 << 10;  // per connection, beyond its window
  static constexpr uint32_t kLongRttUs = 5000;
  // About 2,900 full segments: at 0.1% loss, one epoch in 18 carries none.
  static constexpr uint64_t kCleanEpochBytes = 4 << 20;
  // The TCP counters where the running epoch began (nullopt: it began after
  // an idle spell, or the transport has none).
  std::optional<TcpCounters> tcp_start_;
};

}  // namespace fedwan::transport
