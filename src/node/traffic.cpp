#include "node/traffic.hpp"

#include <algorithm>

namespace fedwan::node {

uint64_t charged_round(const wire::FrameHeader& h, uint64_t current) {
  switch (h.type) {
    case wire::MsgType::kAnchor:
      // The anchor of round 0 (a full model at join) belongs to round 0.
      return h.round == 0 || (h.flags & wire::kFlagFullAnchor) ? h.round : h.round - 1;
    // kDone comes after the last round: charged to no reported round (64
    // bytes a link).
    case wire::MsgType::kDone:
    case wire::MsgType::kDelta:
    case wire::MsgType::kTelemetry: return h.round;
    default: return current;
  }
}

uint64_t fp32_equivalent(const wire::FrameHeader& h, uint64_t wire_bytes) {
  if (h.type != wire::MsgType::kAnchor && h.type != wire::MsgType::kDelta) return wire_bytes;
  if (h.type == wire::MsgType::kDelta && (h.flags & wire::kFlagNoValues)) return wire_bytes;
  // Trailers travel with or without compression.
  const uint64_t trailers = std::min<uint64_t>(wire::trailer_size(h), h.payload_length);
  const uint64_t values = h.payload_length - trailers;
  return wire_bytes - values + uint64_t{h.element_count} * sizeof(float);
}

void TrafficLedger::charge(uint64_t round, uint64_t wire_bytes, uint64_t fp32_bytes) {
  Traffic& t = rounds_[round];
  t.wan_bytes += wire_bytes;
  t.fp32_bytes += fp32_bytes;
  t.frames += 1;
}

void TrafficLedger::charge_frame(const wire::FrameHeader& h, uint64_t wire_bytes,
                                 uint64_t current_round) {
  charge(charged_round(h, current_round), wire_bytes, fp32_equivalent(h, wire_bytes));
}

void TrafficLedger::add(uint64_t round, const Traffic& t) { rounds_[round] += t; }

Traffic TrafficLedger::take(uint64_t round) {
  auto it = rounds_.find(round);
  if (it == rounds_.end()) return {};
  Traffic t = it->second;
  rounds_.erase(it);
  return t;
}

}  // namespace fedwan::node
