#include "wire/frame.hpp"

#include <cinttypes>
#include <cmath>
#include <cstring>
#include <string>

#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "wire/byte_order.hpp"
#include "wire/frame_trailers.hpp"

namespace fedwan::wire {

using detail::reject;

namespace {

bool is_data_type(MsgType t) { return t == MsgType::kAnchor || t == MsgType::kDelta; }

uint8_t allowed_flags(MsgType t) {
  switch (t) {
    case MsgType::kAnchor: return kFlagFullAnchor | kFlagClip;
    case MsgType::kDelta: return kFlagNoValues | kFlagExcused | kFlagUnclipped;
    case MsgType::kWelcome: return kFlagNoChange | kFlagKeepsReplicas | kFlagClip;
    case MsgType::kHello: return kFlagSent | kFlagNeedReplica;
    case MsgType::kHeartbeat:
      return kFlagPace | kFlagBusy | kFlagNeedUpdate | kFlagLeaving | kFlagPausing |
             kFlagMembership;
    case MsgType::kCheckpoint: return kFlagReplicaStored | kFlagNoReplica;
    case MsgType::kHandshake: return kFlagNoSession;
    default: return 0;
  }
}

bool has_no_values(const FrameHeader& h) {
  return h.type == MsgType::kDelta && (h.flags & kFlagNoValues) != 0;
}

// The payload size a data frame's codec, element count and flags call for.
size_t data_payload_size(const FrameHeader& h, const Codec& codec) {
  const size_t values = has_no_values(h) ? 0 : codec.encoded_size(h.element_count);
  return values + trailer_size(h);
}

// Checks the fields of kAnchor/kDelta; the payload length already equals the
// bytes present (`payload` holds them). Limits come first so the arithmetic
// below cannot overflow.
ParsedFrame& check_data(ParsedFrame& f, const Codec& codec, const uint8_t* payload,
                        const FrameLimits& lim) {
  const FrameHeader& h = f.header;
  const char* tn = msg_type_name(h.type);
  if (h.chunk_count == 0 || h.chunk_count > lim.max_chunk_count) {
    return reject(f, RejectReason::kBadChunk, "%s chunk_count %" PRIu32 " outside 1..%" PRIu32, tn,
                  h.chunk_count, lim.max_chunk_count);
  }
  if (h.chunk_index >= h.chunk_count) {
    return reject(f, RejectReason::kBadChunk,
                  "%s chunk_index %" PRIu32 " not below chunk_count %" PRIu32, tn, h.chunk_index,
                  h.chunk_count);
  }
  if (h.element_count == 0 || h.element_count > lim.max_chunk_elements) {
    return reject(f, RejectReason::kBadElements, "%s element_count %" PRIu32 " outside 1..%" PRIu32,
                  tn, h.element_count, lim.max_chunk_elements);
  }
  if (h.total_elements > lim.max_total_elements) {
    return reject(f, RejectReason::kBadElements,
                  "%s total_elements %" PRIu64 " over the limit %" PRIu64, tn, h.total_elements,
                  lim.max_total_elements);
  }
  if (h.total_elements < h.element_count) {
    return reject(f, RejectReason::kBadElements,
                  "%s chunk of %" PRIu32 " elements exceeds total_elements %" PRIu64, tn,
                  h.element_count, h.total_elements);
  }
  if (h.chunk_count > h.total_elements) {
    return reject(f, RejectReason::kBadChunk,
                  "%s chunk_count %" PRIu32 " exceeds total_elements %" PRIu64
                  " (every chunk holds at least one element)",
                  tn, h.chunk_count, h.total_elements);
  }
  // The other chunk_count - 1 chunks hold at least one element each.
  uint64_t rest = h.total_elements - h.element_count;
  if (rest < uint64_t{h.chunk_count} - 1 || (h.chunk_count == 1 && rest != 0)) {
    return reject(f, RejectReason::kBadElements,
                  "%s chunk of %" PRIu32 " elements cannot be one of %" PRIu32
                  " chunks totalling %" PRIu64 " elements",
                  tn, h.element_count, h.chunk_count, h.total_elements);
  }
  size_t need = data_payload_size(h, codec);
  if (h.payload_length != need && has_no_values(h)) {
    return reject(f, RejectReason::kBadPayloadSize,
                  "payload %" PRIu32 " bytes, a delta without values carries its %zu bytes"
                  " of trailers alone",
                  h.payload_length, need);
  }
  if (h.payload_length != need) {
    std::string name(codec.name());
    return reject(f, RejectReason::kBadPayloadSize,
                  "payload %" PRIu32 " bytes, %s of %" PRIu32 " elements needs %zu%s",
                  h.payload_length, name.c_str(), h.element_count, need,
                  trailer_size(h) > 0 ? " with its trailers" : "");
  }
  uint64_t wbits = double_bits(h.weight);
  if (has_no_values(h)) {
    if (wbits != 0) {
      return reject(f, RejectReason::kBadWeight,
                    "delta without values carries weight %g; must be 0", h.weight);
    }
  } else if (h.type == MsgType::kDelta && !(std::isfinite(h.weight) && h.weight > 0.0)) {
    return reject(f, RejectReason::kBadWeight, "delta weight %g is not finite and > 0", h.weight);
  }
  if (h.type == MsgType::kAnchor && wbits != 0) {
    return reject(f, RejectReason::kBadWeight, "anchor weight %g must be 0", h.weight);
  }
  return detail::read_trailers(f, payload);
}

// Control messages carry no tensor: chunk, element and weight fields must be
// zero so a sender bug (or a forged header) cannot pass for data. kHello and
// kWelcome alone use total_elements, for the model's element count, so both
// ends can refuse a peer that trains a model of another shape.
ParsedFrame& check_control(ParsedFrame& f, const uint8_t* payload, const FrameLimits& lim) {
  const FrameHeader& h = f.header;
  const char* tn = msg_type_name(h.type);
  if (h.chunk_index != 0 || h.chunk_count != 0) {
    return reject(f, RejectReason::kBadChunk,
                  "%s carries chunk_index %" PRIu32 " chunk_count %" PRIu32 "; must be 0", tn,
                  h.chunk_index, h.chunk_count);
  }
  if (h.element_count != 0) {
    return reject(f, RejectReason::kBadElements, "%s carries element_count %" PRIu32 "; must be 0",
                  tn, h.element_count);
  }
  const bool sizes_model = h.type == MsgType::kHello || h.type == MsgType::kWelcome;
  if (!sizes_model && h.total_elements != 0) {
    return reject(f, RejectReason::kBadElements, "%s carries total_elements %" PRIu64 "; must be 0",
                  tn, h.total_elements);
  }
  if (h.total_elements > lim.max_total_elements) {
    return reject(f, RejectReason::kBadElements,
                  "%s total_elements %" PRIu64 " over the limit %" PRIu64, tn, h.total_elements,
                  lim.max_total_elements);
  }
  if (double_bits(h.weight) != 0) {
    return reject(f, RejectReason::kBadWeight, "%s carries weight %g; must be 0", tn, h.weight);
  }
  if (h.payload_length > lim.max_control_payload) {
    return reject(f, RejectReason::kPayloadTooLarge,
                  "%s payload %" PRIu32 " bytes over the control limit %" PRIu32, tn,
                  h.payload_length, lim.max_control_payload);
  }
  if (h.payload_length < trailer_size(h)) {
    return reject(f, RejectReason::kBadPayloadSize,
                  "%s payload %" PRIu32 " bytes is shorter than its %zu-byte clip trailer", tn,
                  h.payload_length, trailer_size(h));
  }
  return detail::read_trailers(f, payload);
}

// kCheckpoint: a piece of a checkpoint file, or a signal without one.
ParsedFrame& check_checkpoint(ParsedFrame& f, const FrameLimits& lim) {
  const FrameHeader& h = f.header;
  if (double_bits(h.weight) != 0) {
    return reject(f, RejectReason::kBadWeight, "checkpoint carries weight %g; must be 0", h.weight);
  }
  if (h.flags != 0) {
    if (h.flags != kFlagReplicaStored && h.flags != kFlagNoReplica) {
      return reject(f, RejectReason::kBadReserved,
                    "checkpoint signal with flags 0x%02x; exactly one signal bit",
                    unsigned{h.flags});
    }
    if (h.chunk_index != 0 || h.chunk_count != 0) {
      return reject(f, RejectReason::kBadChunk, "checkpoint signal carries chunk fields");
    }
    if (h.element_count != 0 || h.total_elements != 0) {
      return reject(f, RejectReason::kBadElements, "checkpoint signal carries sizes");
    }
    if (h.payload_length != 0) {
      return reject(f, RejectReason::kBadPayloadSize,
                    "checkpoint signal carries %" PRIu32 " payload bytes", h.payload_length);
    }
    return f;
  }
  if (h.chunk_count == 0 || h.chunk_count > lim.max_chunk_count) {
    return reject(f, RejectReason::kBadChunk,
                  "checkpoint chunk_count %" PRIu32 " outside 1..%" PRIu32, h.chunk_count,
                  lim.max_chunk_count);
  }
  if (h.chunk_index >= h.chunk_count) {
    return reject(f, RejectReason::kBadChunk,
                  "checkpoint chunk_index %" PRIu32 " not below chunk_count %" PRIu32,
                  h.chunk_index, h.chunk_count);
  }
  if (h.element_count == 0 || h.element_count > lim.max_piece_bytes) {
    return reject(f, RejectReason::kBadElements,
                  "checkpoint piece of %" PRIu32 " bytes outside 1..%" PRIu32, h.element_count,
                  lim.max_piece_bytes);
  }
  if (h.total_elements < h.element_count || h.total_elements > lim.max_checkpoint_bytes) {
    return reject(f, RejectReason::kBadElements,
                  "checkpoint of %" PRIu64 " bytes: below its piece of %" PRIu32
                  " or over the limit %" PRIu64,
                  h.total_elements, h.element_count, lim.max_checkpoint_bytes);
  }
  if (h.payload_length != h.element_count) {
    return reject(f, RejectReason::kBadPayloadSize,
                  "checkpoint piece says %" PRIu32 " bytes, carries %" PRIu32, h.element_count,
                  h.payload_length);
  }
  return f;
}

// The header fields parse_frame judges but does not hand back.
struct RawEnvelope {
  uint32_t magic = 0;
  uint8_t version = 0;
};

// Decoding the raw fields is harmless; nothing trusts them until the check
// that covers them has passed. On a reject they are kept for the log.
// `data` holds at least kHeaderSize bytes.
RawEnvelope decode_fields(const uint8_t* data, FrameHeader& h) {
  RawEnvelope raw;
  raw.magic = get_u32(data);
  raw.version = data[4];
  h.type = static_cast<MsgType>(data[5]);
  h.codec = data[6];
  h.flags = data[7];
  h.job_id = get_u64(data + 8);
  h.round = get_u64(data + 16);
  h.sender = get_u32(data + 24);
  h.chunk_index = get_u32(data + 28);
  h.chunk_count = get_u32(data + 32);
  h.element_count = get_u32(data + 36);
  h.total_elements = get_u64(data + 40);
  h.weight = bits_double(get_u64(data + 48));
  h.payload_length = get_u32(data + 56);
  return raw;
}

// The codec byte names a registered codec on kAnchor/kDelta (returned in
// *codec), an AEAD on kHandshake, and nothing (0) on other types. The type
// is already known to be valid.
ParsedFrame& check_codec(ParsedFrame& f, const Codec** codec) {
  const FrameHeader& h = f.header;
  const char* tn = msg_type_name(h.type);
  if (is_data_type(h.type)) {
    *codec = codec_by_wire_id(h.codec);
    if (*codec == nullptr) {
      return reject(f, RejectReason::kBadCodec, "%s with unknown codec id %u", tn,
                    unsigned{h.codec});
    }
  } else if (h.type == MsgType::kHandshake) {
    if (h.codec > kMaxAeadId) {
      return reject(f, RejectReason::kBadCodec, "handshake with unknown cipher id %u",
                    unsigned{h.codec});
    }
  } else if (h.codec != 0) {
    return reject(f, RejectReason::kBadCodec, "%s with codec id %u; control messages carry 0", tn,
                  unsigned{h.codec});
  }
  return f;
}

}  // namespace

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kHello: return "hello";
    case MsgType::kWelcome: return "welcome";
    case MsgType::kAnchor: return "anchor";
    case MsgType::kDelta: return "delta";
    case MsgType::kTelemetry: return "telemetry";
    case MsgType::kReject: return "reject";
    case MsgType::kDone: return "done";
    case MsgType::kHandshake: return "handshake";
    case MsgType::kHeartbeat: return "heartbeat";
    case MsgType::kCheckpoint: return "checkpoint";
  }
  return "unknown";
}

const char* reject_reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::kNone: return "none";
    case RejectReason::kTooShort: return "too_short";
    case RejectReason::kBadMagic: return "bad_magic";
    case RejectReason::kBadVersion: return "bad_version";
    case RejectReason::kBadType: return "bad_type";
    case RejectReason::kBadCodec: return "bad_codec";
    case RejectReason::kBadReserved: return "bad_reserved";
    case RejectReason::kLengthMismatch: return "length_mismatch";
    case RejectReason::kBadChunk: return "bad_chunk";
    case RejectReason::kBadElements: return "bad_elements";
    case RejectReason::kBadPayloadSize: return "bad_payload_size";
    case RejectReason::kBadWeight: return "bad_weight";
    case RejectReason::kPayloadTooLarge: return "payload_too_large";
  }
  return "unknown";
}

void encode_header(const FrameHeader& h, uint8_t* out) {
  put_u32(out + 0, kMagic);
  out[4] = kVersion;
  out[5] = static_cast<uint8_t>(h.type);
  out[6] = h.codec;
  out[7] = h.flags;
  put_u64(out + 8, h.job_id);
  put_u64(out + 16, h.round);
  put_u32(out + 24, h.sender);
  put_u32(out + 28, h.chunk_index);
  put_u32(out + 32, h.chunk_count);
  put_u32(out + 36, h.element_count);
  put_u64(out + 40, h.total_elements);
  put_u64(out + 48, double_bits(h.weight));
  put_u32(out + 56, h.payload_length);
  put_u32(out + 60, 0);
}

void frame_to_fill(const FrameHeader& h, size_t size, std::vector<uint8_t>& frame) {
  if (size > UINT32_MAX) {
    FEDWAN_THROW(ProtocolError, "frame payload of " + std::to_string(size) +
                                    " bytes does not fit the 32-bit length field");
  }
  FrameHeader hh = h;
  hh.payload_length = static_cast<uint32_t>(size);
  frame.resize(kHeaderSize + size);
  encode_header(hh, frame.data());
}

std::vector<uint8_t> encode_frame(const FrameHeader& h, const uint8_t* payload, size_t size) {
  std::vector<uint8_t> out;
  frame_to_fill(h, size, out);
  if (size != 0 && payload != nullptr) std::memcpy(out.data() + kHeaderSize, payload, size);
  return out;
}

std::vector<uint8_t> frame_to_fill(const FrameHeader& h, size_t size) {
  return encode_frame(h, nullptr, size);
}

ParsedFrame parse_frame(const uint8_t* data, size_t size, const FrameLimits& limits) {
  ParsedFrame f;
  if (data == nullptr) size = 0;
  if (size < kHeaderSize) {
    return reject(f, RejectReason::kTooShort,
                  "frame of %zu bytes is shorter than the %zu-byte header", size, kHeaderSize);
  }
  FrameHeader& h = f.header;
  const RawEnvelope raw = decode_fields(data, h);
  if (raw.magic != kMagic) {
    return reject(f, RejectReason::kBadMagic, "magic 0x%08" PRIx32 ", expected 0x%08" PRIx32,
                  raw.magic, kMagic);
  }
  if (raw.version != kVersion) {
    return reject(f, RejectReason::kBadVersion, "protocol version %u, this build speaks %u",
                  unsigned{raw.version}, unsigned{kVersion});
  }
  uint8_t type = data[5];
  if (type < static_cast<uint8_t>(MsgType::kHello) ||
      type > static_cast<uint8_t>(MsgType::kCheckpoint)) {
    return reject(f, RejectReason::kBadType, "unknown message type %u", unsigned{type});
  }
  const Codec* codec = nullptr;
  if (!check_codec(f, &codec).ok()) return f;
  uint8_t bad_flags = h.flags & static_cast<uint8_t>(~allowed_flags(h.type));
  if (bad_flags != 0) {
    return reject(f, RejectReason::kBadReserved, "%s with flags 0x%02x; bits 0x%02x are reserved",
                  msg_type_name(h.type), unsigned{h.flags}, unsigned{bad_flags});
  }
  if (h.type == MsgType::kAnchor && (h.flags & kFlagFullAnchor) && (h.flags & kFlagClip)) {
    return reject(f, RejectReason::kBadReserved,
                  "anchor with flags 0x%02x: a clip (0x%02x) rides on an update, not on the "
                  "model in full (0x%02x)",
                  unsigned{h.flags}, unsigned{kFlagClip}, unsigned{kFlagFullAnchor});
  }
  if (h.type == MsgType::kHeartbeat && (h.flags & kFlagPace) && h.flags != kFlagPace) {
    return reject(f, RejectReason::kBadReserved,
                  "heartbeat with flags 0x%02x: pace (0x%02x) goes alone", unsigned{h.flags},
                  unsigned{kFlagPace});
  }
  if (h.type == MsgType::kHeartbeat && (h.flags & kFlagBusy) && h.flags != kFlagBusy) {
    return reject(f, RejectReason::kBadReserved,
                  "heartbeat with flags 0x%02x: busy (0x%02x) goes alone", unsigned{h.flags},
                  unsigned{kFlagBusy});
  }
  if (has_no_values(h) && (h.flags & kFlagExcused) == 0) {
    return reject(f, RejectReason::kBadReserved,
                  "delta with flags 0x%02x: no values (0x%02x) without excused weight (0x%02x)",
                  unsigned{h.flags}, unsigned{kFlagNoValues}, unsigned{kFlagExcused});
  }
  size_t carried = size - kHeaderSize;
  if (h.payload_length != carried) {
    return reject(f, RejectReason::kLengthMismatch,
                  "header says %" PRIu32 " payload bytes, frame carries %zu", h.payload_length,
                  carried);
  }
  if (codec != nullptr) {
    check_data(f, *codec, data + kHeaderSize, limits);
  } else if (h.type == MsgType::kCheckpoint) {
    check_checkpoint(f, limits);
  } else {
    check_control(f, data + kHeaderSize, limits);
  }
  if (f.ok()) {
    f.payload = data + kHeaderSize;
    f.payload_size = carried - trailer_size(h);
  }
  return f;
}

}  // namespace fedwan::wire
