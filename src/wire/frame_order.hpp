// The order a frame keeps on a link striped over several connections
// (docs/protocol.md, "Striped links"). Chunks are independent units: a
// receiver takes them in whatever order they arrive, so that one
// connection's loss recovery does not stall the others. What must not be
// overtaken is told by the frame's type and flags (its order class) and by
// the header's `order` field (offset 60), which the sealer fills with the
// count of barrier frames and of checkpoint pieces it sealed before this
// one in the session (each modulo 2^16). The field is authenticated with
// the header.
//
//   kBarrier  hello, welcome, reject, done, handshake, checkpoint signals,
//             heartbeats with membership flags: delivered after every frame
//             sealed before it; every later frame waits for it.
//   kFollow   plain heartbeats: delivered after every frame sealed before it
//             (a parent's heartbeat speaks of the anchor chunks before it);
//             later frames do not wait for it.
//   kChunk    delta and anchor chunks, telemetry: delivered once every
//             barrier sealed before it has been.
//   kPiece    checkpoint pieces: delivered once every barrier and every
//             piece sealed before it has been (a file is written in order).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fedwan::wire {

enum class OrderClass : uint8_t { kBarrier = 0, kFollow = 1, kChunk = 2, kPiece = 3 };

inline constexpr size_t kOrderOffset = 60;

// The class of a frame of `type` with `flags` (the sealed bit ignored).
// An unknown type is a barrier.
OrderClass order_class(uint8_t type, uint8_t flags);
const char* order_class_name(OrderClass c);

// The `order` field: barriers and pieces sealed before the frame, each
// modulo 2^16.
struct OrderTag {
  uint16_t barriers = 0;
  uint16_t pieces = 0;
};
inline uint32_t pack_order(OrderTag t) { return uint32_t{t.barriers} | (uint32_t{t.pieces} << 16); }
inline OrderTag unpack_order(uint32_t v) {
  return OrderTag{static_cast<uint16_t>(v & 0xFFFF), static_cast<uint16_t>(v >> 16)};
}

// What a sender counts as it seals frames in order: the tag the next frame
// gets, then the count moved past it.
class OrderCounter {
 public:
  OrderTag next(OrderClass c) {
    const OrderTag t = tag_;
    if (c == OrderClass::kBarrier) tag_.barriers = static_cast<uint16_t>(tag_.barriers + 1);
    if (c == OrderClass::kPiece) tag_.pieces = static_cast<uint16_t>(tag_.pieces + 1);
    return t;
  }

 private:
  OrderTag tag_;
};

}  // namespace fedwan::wire
