// Shared by the frame tests: header offsets, message types, little-endian
// field writers, and control and data frames built and parsed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fedwan/codec.hpp"
#include "wire/frame.hpp"

namespace fedwan::wire {

using Bytes = std::vector<uint8_t>;

// Header offsets, as documented in frame.hpp.
constexpr size_t kOffVersion = 4, kOffType = 5, kOffCodec = 6, kOffFlags = 7;
constexpr size_t kOffChunkIndex = 28, kOffChunkCount = 32, kOffElements = 36;
constexpr size_t kOffTotal = 40, kOffWeight = 48, kOffPayloadLen = 56, kOffOrder = 60;

inline const MsgType kAllTypes[] = {MsgType::kHello, MsgType::kWelcome,   MsgType::kAnchor,
                                    MsgType::kDelta, MsgType::kTelemetry, MsgType::kReject,
                                    MsgType::kDone};
inline const MsgType kControlTypes[] = {MsgType::kHello, MsgType::kWelcome, MsgType::kTelemetry,
                                        MsgType::kReject, MsgType::kDone};

inline void set_u32(Bytes& b, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32(const Bytes& b, size_t off) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{b[off + i]} << (8 * i);
  return v;
}
inline void set_u64(Bytes& b, size_t off, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}

inline void set_f64(Bytes& b, size_t off, double d) {
  uint64_t v;
  std::memcpy(&v, &d, sizeof(v));
  set_u64(b, off, v);
}

inline std::vector<const Codec*> all_codecs() {
  std::vector<const Codec*> out;
  for (const std::string& name : codec_names()) out.push_back(&codec_by_name(name));
  return out;
}

inline const Codec& fp16() { return codec_by_name("fp16"); }

inline FrameHeader data_header(MsgType type, const Codec& codec, uint32_t n, uint64_t total,
                               uint32_t index, uint32_t count) {
  FrameHeader h;
  h.type = type;
  h.codec = static_cast<uint8_t>(codec.id());
  h.flags = type == MsgType::kAnchor ? kFlagFullAnchor : 0;
  h.job_id = 0x0123456789abcdefull;
  h.round = 42;
  h.sender = 7;
  h.chunk_index = index;
  h.chunk_count = count;
  h.element_count = n;
  h.total_elements = total;
  h.weight = type == MsgType::kDelta ? 6000.0 : 0.0;
  return h;
}

// `codec`'s bytes for n elements, a recognisable pattern (not valid values).
inline Bytes codec_bytes(const Codec& codec, uint32_t n) {
  Bytes payload(codec.encoded_size(n));
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 31);
  return payload;
}

inline Bytes data_frame(MsgType type, const Codec& codec, uint32_t n = 600, uint64_t total = 1500,
                        uint32_t index = 1, uint32_t count = 3) {
  const Bytes payload = codec_bytes(codec, n);
  return encode_frame(data_header(type, codec, n, total, index, count), payload.data(),
                      payload.size());
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
