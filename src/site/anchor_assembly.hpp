// The anchors coming down to a site, chunk by chunk: the model in full after
// a welcome (a join or a resync), and the next round's anchor, whose chunks
// may come before the site computed its delta of them (kept, and applied
// once it has: a chunk closed without this site by quorum or deadline).
// Decides what each arriving chunk is and keeps count; the caller decodes
// and applies. Pure: no sockets, no clocks of its own, no floats. Not thread
// safe (unit-tested: tests/unit/site/test_anchor_assembly.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace fedwan::site {

class AnchorAssembly {
 public:
  using Clock = std::chrono::steady_clock;

  enum class Step {
    kIgnored,       // not asked for, of another round, or already in
    kFull,          // a piece of the model in full: decode it into the anchor
    kFullComplete,  // its last piece: decode it, and the model is in
    kEarly,         // of the next anchor, before its delta: kept (take_early)
    kApply,         // of the next anchor: apply it now
  };
  struct Taken {
    Step step = Step::kIgnored;
    // It opened the next anchor's assembly (the site had not begun its
    // sync): no delta chunk of that round is computed yet.
    bool opened = false;
  };
  // A chunk of the next anchor kept until its delta chunk is computed.
  struct EarlyChunk {
    uint32_t chunk = 0;
    uint8_t codec = 0;
    std::vector<uint8_t> payload;
  };

  explicit AnchorAssembly(uint32_t chunks) : chunks_(chunks) {}

  // ---- the model in full, after a welcome
  // The model of `round` follows in full (replacing one being assembled).
  void expect_full(uint64_t round);
  // Gives it up (a hello asks for it again).
  void forget_full() { full_.reset(); }
  bool full_pending() const { return full_.has_value(); }
  uint64_t full_round() const { return full_ ? full_->round : 0; }

  // ---- the next round's anchor
  // Awaits the anchor of `round` (a sync begins): what came for that round
  // already stays, an assembly of another round is replaced.
  void expect_next(uint64_t round);
  void forget_next() { next_.reset(); }
  bool next_pending() const { return next_.has_value(); }
  uint64_t next_round() const { return next_ ? next_->round : 0; }
  uint32_t next_received() const { return next_ ? next_->received : 0; }
  // Every chunk of it is in.
  bool next_complete() const { return next_ && next_->received == chunks_; }
  // Awaited and not all in. (The end of the federation does not settle it:
  // a site whose anchor came short rejoins for the final model in full.)
  bool next_incomplete() const { return next_ && next_->received < chunks_; }
  // When a chunk of the next anchor last came (or the caller last said the
  // round made progress: its update went out).
  Clock::time_point progress_at() const { return progress_at_; }
  void progressed(Clock::time_point now) { progress_at_ = now; }

  // An anchor chunk of `chunk_round` from the parent, in full or an update,
  // at the site's `round` with `encoded_upto` delta chunks computed.
  // Validated by the caller (its size fits the plan). An early chunk is
  // kept with its payload.
  Taken take(uint64_t chunk_round, uint32_t chunk, bool full, uint64_t round, uint32_t encoded_upto,
             uint8_t codec, const uint8_t* payload, size_t payload_size, Clock::time_point now);
  // The kept chunks whose delta chunk is now computed (below
  // `encoded_upto`), in the order they came; the others stay.
  std::vector<EarlyChunk> take_early(uint32_t encoded_upto);

 private:
  struct Assembly {
    Assembly() {}  // NOLINT(modernize-use-equals-default): std::optional needs it declared
    uint64_t round = 0;
    std::vector<bool> got;
    uint32_t received = 0;
  };

  uint32_t chunks_;
  std::optional<Assembly> full_;
  std::optional<Assembly> next_;
  std::vector<EarlyChunk> early_;
  Clock::time_point progress_at_;
};

}  // namespace fedwan::site
