// Shared by the frame tests: header offsets, message types, little-endian
// field writers, and control frames built and parsed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire/frame.hpp"

namespace fedwan::wire {

using Bytes = std::vector<uint8_t>;

// Header offsets, as documented in frame.hpp.
constexpr size_t kOffVersion = 4, kOffType = 5, kOffCodec = 6, kOffFlags = 7;
constexpr size_t kOffChunkIndex = 28, kOffChunkCount = 32, kOffElements = 36;
constexpr size_t kOffTotal = 40, kOffWeight = 48, kOffPayloadLen = 56, kOffReserved = 60;

inline const MsgType kAllTypes[] = {MsgType::kHello, MsgType::kWelcome,   MsgType::kAnchor,
                                    MsgType::kDelta, MsgType::kTelemetry, MsgType::kReject,
                                    MsgType::kDone};
inline const MsgType kControlTypes[] = {MsgType::kHello, MsgType::kWelcome, MsgType::kTelemetry,
                                        MsgType::kReject, MsgType::kDone};

inline void set_u32(Bytes& b, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void set_u64(Bytes& b, size_t off, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}

inline Bytes control_frame(MsgType type, const Bytes& payload = {'o', 'k'}) {
  FrameHeader h;
  h.type = type;
  h.flags = type == MsgType::kWelcome ? kFlagNoChange : 0;
  h.job_id = 99;
  h.round = 3;
  h.sender = 1;
  if (type == MsgType::kHello || type == MsgType::kWelcome) h.total_elements = 1500;
  return encode_frame(h, payload.data(), payload.size());
}

inline RejectReason reason(const Bytes& b, const FrameLimits& lim = {}) {
  return parse_frame(b.data(), b.size(), lim).reject;
}

}  // namespace fedwan::wire
