// Per-round accounting of the bytes a node puts on and takes off its child
// links, so the root can report exact WAN traffic per round. A frame is
// charged to the round whose work it carries: a delta or telemetry frame to
// its own round, the anchor that opens round r+1 to round r (it carries r's
// result), joins to the round they happen in.
#pragma once

#include <cstdint>
#include <map>

#include "wire/frame.hpp"

namespace fedwan::node {

struct Traffic {
  uint64_t wan_bytes = 0;
  uint64_t fp32_bytes = 0;
  uint64_t frames = 0;
  // Saturating: counts a child reports are bounded, not trusted to add up.
  Traffic& operator+=(const Traffic& o) {
    const auto add = [](uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; };
    wan_bytes = add(wan_bytes, o.wan_bytes);
    fp32_bytes = add(fp32_bytes, o.fp32_bytes);
    frames = add(frames, o.frames);
    return *this;
  }
};

// The round a frame is charged to (see above); `current` for joins.
uint64_t charged_round(const wire::FrameHeader& h, uint64_t current);

// Bytes the same frame would take with fp32 values (wire overhead kept).
uint64_t fp32_equivalent(const wire::FrameHeader& h, uint64_t wire_bytes);

class TrafficLedger {
 public:
  void charge(uint64_t round, uint64_t wire_bytes, uint64_t fp32_bytes);
  void charge_frame(const wire::FrameHeader& h, uint64_t wire_bytes, uint64_t current_round);
  void add(uint64_t round, const Traffic& t);
  // Removes and returns what was charged to `round`.
  Traffic take(uint64_t round);

 private:
  std::map<uint64_t, Traffic> rounds_;
};

}  // namespace fedwan::node
