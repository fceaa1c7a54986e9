#include "harness/fault_lane.hpp"

#include "harness/zmtp.hpp"
#include "transport/routing_id.hpp"

namespace fedwan::testing {

std::string FaultSpec::problem() const {
  for (double p : {drop, duplicate, reorder, reset}) {
    if (!(p >= 0 && p <= 1)) return "FaultSpec: probabilities lie in [0, 1]";
  }
  if (drop + duplicate + reorder + reset > 1 + 1e-12) {
    return "FaultSpec: drop + duplicate + reorder + reset must be <= 1";
  }
  return {};
}

void FaultLane::set_faults(const FaultSpec& spec, uint64_t connection_ordinal,
                           Clock::time_point now) {
  spec_ = spec;
  std::seed_seq s{static_cast<uint32_t>(spec.seed), static_cast<uint32_t>(spec.seed >> 32),
                  static_cast<uint32_t>(connection_ordinal),
                  static_cast<uint32_t>(connection_ordinal >> 32), to_target_ ? 1u : 2u};
  rng_.seed(s);
  refresh(now);
}

bool FaultLane::push(const uint8_t* p, size_t n, Clock::time_point now) {
  std::vector<ZmtpSplitter::Piece> pieces;
  const bool was_raw = splitter_.raw();
  splitter_.feed(p, n, pieces);
  if (!was_raw && splitter_.raw()) counters_->raw_streams += 1;
  return take(pieces, now);
}

bool FaultLane::finish(Clock::time_point now) {
  eof_ = true;
  std::vector<ZmtpSplitter::Piece> pieces;
  splitter_.finish(pieces);
  const bool ok = take(pieces, now);
  release_held(now);
  return ok;
}

std::optional<FaultLane::Clock::time_point> FaultLane::next_due(Clock::time_point now) const {
  std::optional<Clock::time_point> due;
  if (!out_.empty() && out_.front().release > now) due = out_.front().release;
  if (holding_ && spec_.reorder_hold_ms > 0 && (!due || held_until_ < *due)) due = held_until_;
  return due;
}

void FaultLane::clear() {
  out_.clear();
  queued_ = 0;
  head_written_ = 0;
  held_.clear();
  holding_ = false;
  splitter_ = ZmtpSplitter(max_message_);
}

void FaultLane::refresh(Clock::time_point now) {
  faulted_ = spec_.any() && (to_target_ ? spec_.to_target : spec_.to_client) &&
             (spec_.peer.empty() || spec_.peer == peer_);
  if (!faulted_) release_held(now);
}

void FaultLane::enqueue(std::vector<uint8_t> bytes, Clock::time_point release) {
  if (bytes.empty()) return;
  release = std::max(release, last_release_);  // delays never reorder
  last_release_ = release;
  queued_ += bytes.size();
  out_.push_back({std::move(bytes), release});
}

void FaultLane::release_held(Clock::time_point now) {
  if (!holding_) return;
  holding_ = false;
  counters_->forwarded += 1;
  enqueue(std::move(held_), now);
  held_.clear();
}

bool FaultLane::take(std::vector<ZmtpSplitter::Piece>& pieces, Clock::time_point now) {
  for (ZmtpSplitter::Piece& p : pieces) {
    switch (p.kind) {
      case ZmtpSplitter::Kind::kMessage:
        if (!on_message(std::move(p.bytes), now)) return false;
        break;
      case ZmtpSplitter::Kind::kCommand:
        counters_->commands += 1;
        if (to_target_ && peer_.empty()) {
          if (auto id = zmtp::ready_identity(p.bytes))
            set_peer(transport::untagged_routing_id(*id), now);
        }
        enqueue(std::move(p.bytes), now);
        break;
      case ZmtpSplitter::Kind::kGreeting: enqueue(std::move(p.bytes), now); break;
      case ZmtpSplitter::Kind::kRaw:
        release_held(now);  // nothing may overtake the bytes that follow
        enqueue(std::move(p.bytes), now);
        break;
    }
  }
  return true;
}

bool FaultLane::on_message(std::vector<uint8_t> msg, Clock::time_point now) {
  if (!faulted_) {
    counters_->forwarded += 1;
    enqueue(std::move(msg), now);
    return true;
  }
  double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // [0, 1)
  const uint64_t delay_ms = spec_.max_delay_ms ? rng_() % (uint64_t{spec_.max_delay_ms} + 1) : 0;
  const Clock::time_point release = now + std::chrono::milliseconds(delay_ms);
  if (u < spec_.reset) {
    counters_->resets += 1;
    return false;
  }
  u -= spec_.reset;
  if (u < spec_.drop) {
    counters_->dropped += 1;
    return true;
  }
  u -= spec_.drop;
  if (u < spec_.duplicate) {
    counters_->forwarded += 1;
    counters_->duplicated += 1;
    enqueue(msg, release);
    enqueue(std::move(msg), release);
    release_held(release);
    return true;
  }
  u -= spec_.duplicate;
  // While one message is held, the next one is "the next message": it goes
  // out, and the held one after it.
  if (u < spec_.reorder && !holding_) {
    counters_->reordered += 1;
    held_ = std::move(msg);
    holding_ = true;
    held_until_ = now + std::chrono::milliseconds(spec_.reorder_hold_ms);
    return true;
  }
  counters_->forwarded += 1;
  enqueue(std::move(msg), release);
  release_held(release);
  return true;
}

}  // namespace fedwan::testing
