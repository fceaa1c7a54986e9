// The trailers a payload may end with, in this order: a delta's excused
// weight (kFlagExcused, f64), a delta's unclipped-site count
// (kFlagUnclipped, u64), a parent's clip (kFlagClip on an anchor update or a
// welcome, f64). Each is 8 bytes; the header's flags say which are there.
#include "wire/frame_trailers.hpp"

#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "fedwan/error.hpp"
#include "wire/byte_order.hpp"

namespace fedwan::wire {
namespace {

bool has(const FrameHeader& h, MsgType t, uint8_t flag) {
  return h.type == t && (h.flags & flag) != 0;
}
bool has_excused(const FrameHeader& h) { return has(h, MsgType::kDelta, kFlagExcused); }
bool has_unclipped(const FrameHeader& h) { return has(h, MsgType::kDelta, kFlagUnclipped); }
bool has_clip(const FrameHeader& h) {
  return has(h, MsgType::kAnchor, kFlagClip) || has(h, MsgType::kWelcome, kFlagClip);
}

constexpr uint64_t kMaxUnclipped = uint64_t{1} << 32;

}  // namespace

size_t trailer_size(const FrameHeader& h) {
  return kTrailerSize *
         ((has_excused(h) ? 1 : 0) + (has_unclipped(h) ? 1 : 0) + (has_clip(h) ? 1 : 0));
}

namespace detail {

ParsedFrame& reject(ParsedFrame& f, RejectReason r, const char* fmt, ...) {
  char buf[256];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  f.reject = r;
  f.detail = buf;
  f.payload = nullptr;
  f.payload_size = 0;
  f.excused_weight = 0;
  f.unclipped_sites.reset();
  f.clip = 0;
  return f;
}

ParsedFrame& read_trailers(ParsedFrame& f, const uint8_t* payload) {
  const FrameHeader& h = f.header;
  const uint8_t* at = payload + h.payload_length - trailer_size(h);
  if (has_excused(h)) {
    const double excused = bits_double(get_u64(at));
    if (!(std::isfinite(excused) && excused > 0.0)) {
      return reject(f, RejectReason::kBadWeight, "delta excused weight %g is not finite and > 0",
                    excused);
    }
    f.excused_weight = excused;
    at += kTrailerSize;
  }
  if (has_unclipped(h)) {
    const uint64_t sites = get_u64(at);
    if (sites >= kMaxUnclipped) {
      return reject(f, RejectReason::kBadWeight,
                    "delta counts %" PRIu64 " unclipped sites; at most 2^32 - 1", sites);
    }
    f.unclipped_sites = sites;
    at += kTrailerSize;
  }
  if (has_clip(h)) {
    const double clip = bits_double(get_u64(at));
    if (!(std::isfinite(clip) && clip > 0.0)) {
      return reject(f, RejectReason::kBadWeight, "%s clip %g is not finite and > 0",
                    msg_type_name(h.type), clip);
    }
    f.clip = clip;
  }
  return f;
}

}  // namespace detail

std::vector<uint8_t> encode_delta_frame(FrameHeader h, const uint8_t* values, size_t size,
                                        double excused, std::optional<uint64_t> unclipped) {
  if (h.type != MsgType::kDelta) {
    FEDWAN_THROW(ProtocolError, std::string("encode_delta_frame given a ") + msg_type_name(h.type) +
                                    " header; it writes kDelta frames");
  }
  h.flags &= static_cast<uint8_t>(~(kFlagNoValues | kFlagExcused | kFlagUnclipped));
  if (!(std::isfinite(excused) && excused >= 0.0)) {
    FEDWAN_THROW(ProtocolError, "delta excused weight " + std::to_string(excused) +
                                    " is not finite and > 0; pass 0 when nothing was refused");
  }
  if (unclipped && *unclipped >= kMaxUnclipped) {
    FEDWAN_THROW(ProtocolError, "delta counts " + std::to_string(*unclipped) +
                                    " unclipped sites; at most 2^32 - 1");
  }
  if (excused > 0.0) {
    h.flags |= kFlagExcused;
    if (size == 0) {
      h.flags |= kFlagNoValues;
      h.weight = 0.0;  // +0.0: no values, nothing stands behind them
    }
  }
  if (unclipped) h.flags |= kFlagUnclipped;
  const size_t trailers = trailer_size(h);
  if (size > UINT32_MAX - trailers) {
    FEDWAN_THROW(ProtocolError, "delta payload of " + std::to_string(size) +
                                    " bytes and its trailers do not fit the 32-bit length field");
  }
  h.payload_length = static_cast<uint32_t>(size + trailers);
  std::vector<uint8_t> out(kHeaderSize + h.payload_length);
  encode_header(h, out.data());
  if (size != 0) std::memcpy(out.data() + kHeaderSize, values, size);
  uint8_t* at = out.data() + kHeaderSize + size;
  if (excused > 0.0) {
    put_u64(at, double_bits(excused));
    at += kTrailerSize;
  }
  if (unclipped) put_u64(at, *unclipped);
  return out;
}

std::vector<uint8_t> with_clip(const std::vector<uint8_t>& frame, double clip) {
  if (frame.size() < kHeaderSize) {
    FEDWAN_THROW(ProtocolError, "with_clip given " + std::to_string(frame.size()) +
                                    " bytes, shorter than a header");
  }
  const auto type = static_cast<MsgType>(frame[5]);
  const uint8_t flags = frame[7];
  if ((type != MsgType::kAnchor && type != MsgType::kWelcome) ||
      (type == MsgType::kAnchor && (flags & kFlagFullAnchor) != 0) || (flags & kFlagClip) != 0) {
    FEDWAN_THROW(ProtocolError, std::string("with_clip given a ") + msg_type_name(type) +
                                    " frame with flags " + std::to_string(flags) +
                                    "; a clip rides on an anchor update or a welcome, once");
  }
  if (!(std::isfinite(clip) && clip > 0.0)) {
    FEDWAN_THROW(ProtocolError, "clip " + std::to_string(clip) + " is not finite and > 0");
  }
  const uint32_t length = get_u32(frame.data() + 56);
  if (length != frame.size() - kHeaderSize || length > UINT32_MAX - kTrailerSize) {
    FEDWAN_THROW(ProtocolError, "with_clip given a frame whose payload_length disagrees with it");
  }
  std::vector<uint8_t> out(frame.size() + kTrailerSize);
  std::memcpy(out.data(), frame.data(), frame.size());
  out[7] = static_cast<uint8_t>(flags | kFlagClip);
  put_u32(out.data() + 56, static_cast<uint32_t>(length + kTrailerSize));
  put_u64(out.data() + frame.size(), double_bits(clip));
  return out;
}

}  // namespace fedwan::wire
