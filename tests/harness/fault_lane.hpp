// One direction of a faulty link at the ZeroMQ message layer: bytes read
// from one side go in, the bytes to write to the other side come out, with
// whole data messages dropped, duplicated, held back (reordered) or delayed
// as a FaultSpec says. Greeting and command frames always pass untouched and
// in order; a stream that is not ZMTP 3.x passes as plain bytes (see
// zmtp_splitter.hpp).
//
// Pure: no sockets; time comes in as arguments, so a test can drive it with
// a fake clock. Deterministic: each lane draws from its own generator seeded
// from (seed, connection ordinal, direction). Not thread safe: one owner
// (the proxy's loop thread); the counters it adds to are atomics that any
// thread may read.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "harness/zmtp_splitter.hpp"

namespace fedwan::testing {

// What happens to data messages. One uniform draw per message picks reset,
// drop, duplicate, reorder or plain forwarding, so the four probabilities
// must add up to at most 1.
struct FaultSpec {
  double drop = 0;            // the message is not sent
  double duplicate = 0;       // the message is sent twice
  double reorder = 0;         // held back and sent after the next message
  double reset = 0;           // the whole connection is reset (both sides)
  uint32_t max_delay_ms = 0;  // each message waits 0..max_delay_ms; order is kept
  // A held-back message goes out on its own after this long when no other
  // message follows; 0 = only after the next message, however long that is.
  uint32_t reorder_hold_ms = 200;
  bool to_target = true;  // fault the client -> target direction
  bool to_client = true;  // fault the target -> client direction
  // Only connections whose client announced this ZeroMQ routing id (the
  // READY command's Identity, without a fedwan link's tag: "eu" for a
  // node's first connection, "eu~1" for its second); empty: all.
  std::string peer;
  uint64_t seed = 1;

  bool any() const {
    return drop > 0 || duplicate > 0 || reorder > 0 || reset > 0 || max_delay_ms > 0;
  }
  // Empty when valid, else what is wrong.
  std::string problem() const;
};

// Message counters shared by the lanes of one proxy. A duplicated message
// counts once in `forwarded` and once in `duplicated`; a held-back one in
// `reordered` when held and in `forwarded` when sent.
struct FaultCounters {
  std::atomic<uint64_t> forwarded{0}, dropped{0}, duplicated{0}, reordered{0}, resets{0},
      commands{0}, raw_streams{0};
};

class FaultLane {
 public:
  using Clock = std::chrono::steady_clock;

  FaultLane(bool to_target, size_t max_message_bytes, FaultCounters* counters)
      : to_target_(to_target),
        max_message_(max_message_bytes),
        splitter_(max_message_bytes),
        counters_(counters) {}

  bool to_target() const { return to_target_; }

  // Applies a new spec from now on; reseeds. A message held back under the
  // old spec goes out now if this lane is no longer faulted.
  void set_faults(const FaultSpec& spec, uint64_t connection_ordinal, Clock::time_point now);

  // The client's routing id (untagged, as FaultSpec::peer): a client ->
  // target lane learns it from the READY command it forwards; the proxy
  // tells the other lane.
  const std::string& peer() const { return peer_; }
  void set_peer(const std::string& peer, Clock::time_point now) {
    peer_ = peer;
    refresh(now);
  }

  // Bytes read from the source. Returns false when a fault resets the
  // connection (nothing more should be written either way).
  [[nodiscard]] bool push(const uint8_t* p, size_t n, Clock::time_point now);

  // The source sent FIN: a truncated frame goes on as it came, and so does
  // a held-back message.
  [[nodiscard]] bool finish(Clock::time_point now);

  // Releases a held-back message whose hold time ran out.
  void tick(Clock::time_point now) {
    if (holding_ && spec_.reorder_hold_ms > 0 && now >= held_until_) release_held(now);
  }

  // The bytes to write next, when their time has come (else empty).
  std::pair<const uint8_t*, size_t> head(Clock::time_point now) const {
    if (out_.empty() || out_.front().release > now) return {nullptr, 0};
    const std::vector<uint8_t>& b = out_.front().bytes;
    return {b.data() + head_written_, b.size() - head_written_};
  }
  // `n` bytes of head() were written.
  void advance(size_t n) {
    head_written_ += n;
    if (head_written_ == out_.front().bytes.size()) {
      queued_ -= out_.front().bytes.size();
      out_.pop_front();
      head_written_ = 0;
    }
  }

  // When something not yet due (a delayed message, a held-back one) is due.
  std::optional<Clock::time_point> next_due(Clock::time_point now) const;

  // Bytes waiting to be written, and bytes waiting for the rest of a message.
  size_t queued_bytes() const { return queued_; }
  size_t buffered_bytes() const { return splitter_.buffered() + held_.size(); }
  // Whether reading more from the source is wise (memory stays bounded).
  bool wants_input(size_t max_queued_bytes) const {
    return !eof_ && queued_ < max_queued_bytes && splitter_.buffered() <= max_message_;
  }
  bool eof() const { return eof_; }
  // The source sent FIN and everything has been written: forward the FIN.
  bool drained() const { return eof_ && out_.empty() && !holding_; }

  // Forgets everything buffered (a partition discards what was in flight).
  void clear();

 private:
  struct Outgoing {
    std::vector<uint8_t> bytes;
    Clock::time_point release;
  };

  void refresh(Clock::time_point now);
  void enqueue(std::vector<uint8_t> bytes, Clock::time_point release);
  void release_held(Clock::time_point now);
  bool take(std::vector<ZmtpSplitter::Piece>& pieces, Clock::time_point now);

  // One whole data message: decides its fate. False: reset the connection.
  bool on_message(std::vector<uint8_t> msg, Clock::time_point now);

  bool to_target_;
  std::string peer_;
  size_t max_message_;
  ZmtpSplitter splitter_;
  FaultCounters* counters_;
  FaultSpec spec_;
  bool faulted_ = false;
  std::mt19937_64 rng_;
  std::deque<Outgoing> out_;
  size_t queued_ = 0;        // bytes in out_
  size_t head_written_ = 0;  // of out_.front()
  Clock::time_point last_release_{};
  std::vector<uint8_t> held_;
  bool holding_ = false;
  Clock::time_point held_until_{};
  bool eof_ = false;
};

}  // namespace fedwan::testing
