// One direction of an emulated WAN link, as pure arithmetic: given a packet's
// size and the time it reaches the link, when (and whether, and how often) it
// leaves the far end. No sockets and no clock: the caller supplies the time,
// so the behaviour is unit-tested exactly.
//
// The model, in order, for each packet (the order netem applies its stages):
//   1. loss: dropped with probability `loss`, independently per packet;
//   2. the bottleneck queue: a FIFO drained at `rate_bps`; a packet that would
//      make the queue hold more than `queue_bytes` is dropped (tail drop);
//   3. propagation: `delay` plus a uniform sample in [-jitter, +jitter].
//      Packets leave in the order they were sent (jitter stretches the gaps
//      between them, as queueing does on a real path) unless
//   4. reordering: with probability `reorder` a packet skips the propagation
//      delay and overtakes the packets ahead of it (netem's `reorder`);
//   5. duplication: with probability `duplicate` a second copy follows.
//
// Times are nanoseconds on any monotonic clock. Thread safety: none; one
// LinkDirection belongs to the emulator's single event loop.
#pragma once

#include <cstdint>
#include <string>

namespace fedwan::linkemu {

struct LinkProfile {
  double rate_bps = 0;       // bits per second of IP packets; 0 = unlimited
  double delay_s = 0;        // one-way propagation delay
  double jitter_s = 0;       // +/- this much, uniformly (at most delay_s)
  double loss = 0;           // probability in [0, 1)
  double duplicate = 0;      // probability in [0, 1)
  double reorder = 0;        // probability in [0, 1)
  uint64_t queue_bytes = 0;  // bottleneck buffer; 0 = one bandwidth-delay product

  // The buffer a profile gets when queue_bytes is 0: the link's round-trip
  // bandwidth-delay product (2 x delay x rate), and at least 64 full-size
  // packets; unlimited links get 64 MiB.
  uint64_t effective_queue_bytes() const;
  // Empty when valid, otherwise what is wrong (a rate below zero, ...).
  std::string invalid_reason() const;
};

// What became of one packet.
struct Verdict {
  enum class Fate { kDeliver, kLost, kQueueFull };
  Fate fate = Fate::kDeliver;
  int copies = 0;              // 1, or 2 when duplicated
  int64_t deliver_ns[2] = {};  // for each copy
  bool reordered = false;
};

// xoshiro256** seeded through splitmix64: fast, and the same sequence on
// every platform (std distributions are not).
class Random {
 public:
  explicit Random(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1)

 private:
  uint64_t s_[4];
};

class LinkDirection {
 public:
  LinkDirection(const LinkProfile& profile, uint64_t seed);

  // A packet of `bytes` (its whole IP packet) reaches the link at now_ns.
  Verdict admit(int64_t now_ns, uint32_t bytes);

  // Bytes waiting in the bottleneck queue at now_ns (the packet being
  // serialised included).
  uint64_t backlog_bytes(int64_t now_ns) const;
  const LinkProfile& profile() const { return profile_; }

 private:
  LinkProfile profile_;
  uint64_t queue_limit_;
  Random random_;
  double ns_per_byte_;           // 0 when unlimited
  double busy_until_ns_ = 0;     // when the queue drains
  int64_t last_deliver_ns_ = 0;  // in-order delivery floor
};

}  // namespace fedwan::linkemu
