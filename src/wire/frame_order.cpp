#include "wire/frame_order.hpp"

#include "wire/frame.hpp"

namespace fedwan::wire {

OrderClass order_class(uint8_t type, uint8_t flags) {
  flags = static_cast<uint8_t>(flags & 0x7F);  // the sealed bit is the link's, not the frame's
  switch (static_cast<MsgType>(type)) {
    case MsgType::kDelta:
    case MsgType::kAnchor:
    case MsgType::kTelemetry: return OrderClass::kChunk;
    case MsgType::kHeartbeat:
      return (flags & (kFlagLeaving | kFlagPausing | kFlagMembership)) != 0 ? OrderClass::kBarrier
                                                                            : OrderClass::kFollow;
    case MsgType::kCheckpoint: return flags == 0 ? OrderClass::kPiece : OrderClass::kBarrier;
    default: return OrderClass::kBarrier;
  }
}

const char* order_class_name(OrderClass c) {
  switch (c) {
    case OrderClass::kBarrier: return "barrier";
    case OrderClass::kFollow: return "follow";
    case OrderClass::kChunk: return "chunk";
    case OrderClass::kPiece: return "piece";
  }
  return "unknown";
}

}  // namespace fedwan::wire
