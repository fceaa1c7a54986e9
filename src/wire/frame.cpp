#include "wire/frame.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "common/node_id.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"

namespace fedwan::wire {
namespace {

// Byte-wise so the layout is little-endian on any host and no load is ever
// unaligned, whatever offset the transport hands us.
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t double_bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}
double bits_double(uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof(d));
  return d;
}

bool is_data_type(MsgType t) { return t == MsgType::kAnchor || t == MsgType::kDelta; }

uint8_t allowed_flags(MsgType t) {
  switch (t) {
    case MsgType::kAnchor: return kFlagFullAnchor;
    case MsgType::kWelcome: return kFlagNoChange | kFlagKeepsReplicas;
    case MsgType::kHello: return kFlagSent | kFlagNeedReplica;
    case MsgType::kHeartbeat:
      return kFlagNeedUpdate | kFlagLeaving | kFlagPausing | kFlagMembership;
    case MsgType::kCheckpoint: return kFlagReplicaStored | kFlagNoReplica;
    default: return 0;
  }
}

__attribute__((format(printf, 3, 4))) ParsedFrame& reject(ParsedFrame& f, RejectReason r,
                                                          const char* fmt, ...) {
  char buf[256];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  f.reject = r;
  f.detail = buf;
  f.payload = nullptr;
  f.payload_size = 0;
  return f;
}

// Checks the fields of kAnchor/kDelta; the payload length already equals the
// bytes present. Limits come first so the arithmetic below cannot overflow.
ParsedFrame& check_data(ParsedFrame& f, const Codec& codec, const FrameLimits& lim) {
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
  size_t need = codec.encoded_size(h.element_count);
  if (h.payload_length != need) {
    std::string name(codec.name());
    return reject(f, RejectReason::kBadPayloadSize,
                  "payload %" PRIu32 " bytes, %s of %" PRIu32 " elements needs %zu",
                  h.payload_length, name.c_str(), h.element_count, need);
  }
  uint64_t wbits = double_bits(h.weight);
  if (h.type == MsgType::kDelta && !(std::isfinite(h.weight) && h.weight > 0.0)) {
    return reject(f, RejectReason::kBadWeight, "delta weight %g is not finite and > 0", h.weight);
  }
  if (h.type == MsgType::kAnchor && wbits != 0) {
    return reject(f, RejectReason::kBadWeight, "anchor weight %g must be 0", h.weight);
  }
  return f;
}

// Control messages carry no tensor: chunk, element and weight fields must be
// zero so a sender bug (or a forged header) cannot pass for data. kHello and
// kWelcome alone use total_elements, for the model's element count, so both
// ends can refuse a peer that trains a model of another shape.
ParsedFrame& check_control(ParsedFrame& f, const FrameLimits& lim) {
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
  return f;
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

std::vector<uint8_t> encode_frame(const FrameHeader& h, const uint8_t* payload, size_t size) {
  if (size > UINT32_MAX) {
    FEDWAN_THROW(ProtocolError, "frame payload of " + std::to_string(size) +
                                    " bytes does not fit the 32-bit length field");
  }
  FrameHeader hh = h;
  hh.payload_length = static_cast<uint32_t>(size);
  std::vector<uint8_t> out(kHeaderSize + size);
  encode_header(hh, out.data());
  if (size != 0) std::memcpy(out.data() + kHeaderSize, payload, size);
  return out;
}

ParsedFrame parse_frame(const uint8_t* data, size_t size, const FrameLimits& limits) {
  ParsedFrame f;
  if (data == nullptr) size = 0;
  if (size < kHeaderSize) {
    return reject(f, RejectReason::kTooShort,
                  "frame of %zu bytes is shorter than the %zu-byte header", size, kHeaderSize);
  }
  // Decoding the raw fields is harmless; nothing below trusts them until the
  // check that covers them has passed. On a reject they are kept for the log.
  FrameHeader& h = f.header;
  uint32_t magic = get_u32(data);
  uint8_t version = data[4];
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
  uint32_t reserved = get_u32(data + 60);

  if (magic != kMagic) {
    return reject(f, RejectReason::kBadMagic, "magic 0x%08" PRIx32 ", expected 0x%08" PRIx32, magic,
                  kMagic);
  }
  if (version != kVersion) {
    return reject(f, RejectReason::kBadVersion, "protocol version %u, this build speaks %u",
                  unsigned{version}, unsigned{kVersion});
  }
  uint8_t type = data[5];
  if (type < static_cast<uint8_t>(MsgType::kHello) ||
      type > static_cast<uint8_t>(MsgType::kCheckpoint)) {
    return reject(f, RejectReason::kBadType, "unknown message type %u", unsigned{type});
  }
  const char* tn = msg_type_name(h.type);
  const Codec* codec = nullptr;
  if (is_data_type(h.type)) {
    codec = codec_by_wire_id(h.codec);
    if (codec == nullptr) {
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
  if (reserved != 0) {
    return reject(f, RejectReason::kBadReserved, "reserved field 0x%08" PRIx32 ", must be 0",
                  reserved);
  }
  uint8_t bad_flags = h.flags & static_cast<uint8_t>(~allowed_flags(h.type));
  if (bad_flags != 0) {
    return reject(f, RejectReason::kBadReserved, "%s with flags 0x%02x; bits 0x%02x are reserved",
                  tn, unsigned{h.flags}, unsigned{bad_flags});
  }
  size_t carried = size - kHeaderSize;
  if (h.payload_length != carried) {
    return reject(f, RejectReason::kLengthMismatch,
                  "header says %" PRIu32 " payload bytes, frame carries %zu", h.payload_length,
                  carried);
  }
  if (codec != nullptr) {
    check_data(f, *codec, limits);
  } else if (h.type == MsgType::kCheckpoint) {
    check_checkpoint(f, limits);
  } else {
    check_control(f, limits);
  }
  if (f.ok()) {
    f.payload = data + kHeaderSize;
    f.payload_size = carried;
  }
  return f;
}

// ---- payloads --------------------------------------------------------------
// kHello:     u8 id_length (1..64) | id | 32 topology digest | 32 model digest
// kTelemetry: u8 field_count (3) | u64 wan_bytes | u64 fp32_bytes | u64 frames
// Decoders demand the exact size: a longer payload is as suspect as a short one.

namespace {
constexpr size_t kTelemetryFields = 3;
constexpr size_t kTelemetrySize = 1 + 8 * kTelemetryFields;
constexpr uint8_t kMembershipFields = 2;
constexpr size_t kMembershipSize = 1 + 8 + 4;
}  // namespace

std::vector<uint8_t> encode_hello(const HelloPayload& p) {
  if (!is_valid_node_id(p.node_id)) {
    FEDWAN_THROW(ConfigError,
                 "node id '" + p.node_id + "' is invalid: use 1..64 characters of [A-Za-z0-9._-]");
  }
  std::vector<uint8_t> out;
  out.reserve(1 + p.node_id.size() + 64);
  out.push_back(static_cast<uint8_t>(p.node_id.size()));
  out.insert(out.end(), p.node_id.begin(), p.node_id.end());
  out.insert(out.end(), p.topology_digest.begin(), p.topology_digest.end());
  out.insert(out.end(), p.model_digest.begin(), p.model_digest.end());
  return out;
}

bool decode_hello(const uint8_t* data, size_t size, HelloPayload* out) {
  if (data == nullptr || out == nullptr || size < 1) return false;
  size_t len = data[0];
  if (len == 0 || len > kMaxNodeIdLength || size != 1 + len + 64) return false;
  std::string_view id(reinterpret_cast<const char*>(data + 1), len);
  if (!is_valid_node_id(id)) return false;
  out->node_id.assign(id);
  std::memcpy(out->topology_digest.data(), data + 1 + len, 32);
  std::memcpy(out->model_digest.data(), data + 1 + len + 32, 32);
  return true;
}

std::vector<uint8_t> encode_telemetry(const TelemetryPayload& p) {
  std::vector<uint8_t> out(kTelemetrySize);
  out[0] = static_cast<uint8_t>(kTelemetryFields);
  put_u64(out.data() + 1, p.wan_bytes);
  put_u64(out.data() + 9, p.fp32_bytes);
  put_u64(out.data() + 17, p.frames);
  return out;
}

bool decode_telemetry(const uint8_t* data, size_t size, TelemetryPayload* out) {
  if (data == nullptr || out == nullptr || size != kTelemetrySize) return false;
  if (data[0] != kTelemetryFields) return false;
  out->wan_bytes = get_u64(data + 1);
  out->fp32_bytes = get_u64(data + 9);
  out->frames = get_u64(data + 17);
  return true;
}

std::vector<uint8_t> encode_membership(const MembershipPayload& p) {
  std::vector<uint8_t> out(kMembershipSize);
  out[0] = static_cast<uint8_t>(kMembershipFields);
  put_u64(out.data() + 1, double_bits(p.weight));
  put_u32(out.data() + 9, p.sites);
  return out;
}

bool decode_membership(const uint8_t* data, size_t size, MembershipPayload* out) {
  if (data == nullptr || out == nullptr || size != kMembershipSize) return false;
  if (data[0] != kMembershipFields) return false;
  const double w = bits_double(get_u64(data + 1));
  if (!std::isfinite(w) || w < 0) return false;
  out->weight = w;
  out->sites = get_u32(data + 9);
  return true;
}

std::vector<uint8_t> encode_need_update(uint32_t delivered, const std::vector<uint32_t>& missing) {
  const uint32_t first = missing.empty() ? 0 : missing.front();
  size_t bitmap = 0;
  for (uint32_t c : missing) {
    const uint64_t bit = uint64_t{c} - first;
    if (c < first || bit >= kNeedUpdateBitmapBytes * 8) continue;
    bitmap = std::max<size_t>(bitmap, static_cast<size_t>(bit / 8 + 1));
  }
  std::vector<uint8_t> out(8 + bitmap, 0);
  put_u32(out.data(), delivered);
  put_u32(out.data() + 4, first);
  for (uint32_t c : missing) {
    const uint64_t bit = uint64_t{c} - first;
    if (c < first || bit >= kNeedUpdateBitmapBytes * 8) continue;
    out[8 + bit / 8] = static_cast<uint8_t>(out[8 + bit / 8] | (1u << (bit % 8)));
  }
  return out;
}

bool decode_need_update(const uint8_t* data, size_t size, uint32_t chunk_count,
                        NeedUpdatePayload* out) {
  if (out == nullptr) return false;
  *out = NeedUpdatePayload{};
  if (size == 0) {
    for (uint32_t c = 0; c < chunk_count; ++c) out->missing.push_back(c);
    return true;
  }
  if (data == nullptr || size < 8 || size > 8 + kNeedUpdateBitmapBytes) return false;
  out->delivered = get_u32(data);
  out->progress_known = true;
  const uint32_t first = get_u32(data + 4);
  if (out->delivered > chunk_count) return false;
  for (size_t i = 0; i < (size - 8) * 8; ++i) {
    if ((data[8 + i / 8] >> (i % 8) & 1u) == 0) continue;
    const uint64_t c = uint64_t{first} + i;
    if (c >= chunk_count) return false;
    out->missing.push_back(static_cast<uint32_t>(c));
  }
  return true;
}

}  // namespace fedwan::wire
