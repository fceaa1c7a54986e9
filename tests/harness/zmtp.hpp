// ZMTP 3.x (ZeroMQ's wire protocol) as the tests build and read it: the one
// place that knows its greeting and frame layout. The fault-injecting proxy
// parses streams with it (zmtp_splitter.hpp); tests build streams with it.
//
// ZMTP 3.x: a 64-byte greeting (0xFF, 8 padding bytes, 0x7F, major version
// >= 3, minor version, a 20-byte mechanism name, ...), then frames: a flags
// byte (bit 0 MORE, bit 1 LONG, bit 2 COMMAND, the rest reserved), a size
// (8 bytes big-endian when LONG, else one byte), the body. A command's body
// is a 1-byte name length, the name, then its data; READY's data is
// properties (1-byte name length, name, 4-byte big-endian value length,
// value).
//
// Pure functions: no sockets, no state; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fedwan::testing::zmtp {

using Bytes = std::vector<uint8_t>;

inline constexpr size_t kGreetingBytes = 64;
inline constexpr uint8_t kFlagMore = 0x01;
inline constexpr uint8_t kFlagLong = 0x02;
inline constexpr uint8_t kFlagCommand = 0x04;
inline constexpr uint8_t kFlagsReserved = 0xF8;

// ---- reading -------------------------------------------------------------

// Whether byte `index` of a greeting may be `b` (only the signature and the
// major version are checked: the rest varies between peers).
bool greeting_byte_plausible(size_t index, uint8_t b);

struct FrameHeader {
  uint8_t flags = 0;
  size_t header_bytes = 0;  // 2, or 9 for a LONG frame
  uint64_t body_bytes = 0;
  bool more() const { return flags & kFlagMore; }
  bool command() const { return flags & kFlagCommand; }
};

enum class HeaderParse { kOk, kNeedMore, kInvalid };

// The frame header at [p, p + n): kNeedMore when n is too short to tell,
// kInvalid when reserved flag bits are set (not ZMTP 3.x framing).
HeaderParse parse_frame_header(const uint8_t* p, size_t n, FrameHeader* out);

// The routing id a peer announces in its READY command (the "Identity"
// property a DEALER, ROUTER or REQ socket sends), when `frame` is a whole
// READY command frame with a non-empty one. Bounds-checked: any bytes.
std::optional<std::string> ready_identity(const Bytes& frame);

// ---- building ------------------------------------------------------------

// A version 3.1 greeting for `mechanism`, as server = false.
Bytes greeting(const std::string& mechanism = "NULL");

// One frame; LONG when the body needs it or `force_long`.
Bytes frame(const std::string& body, bool more = false, bool command = false,
            bool force_long = false);

// A command frame: `name`, then `data` as it is.
Bytes command(const std::string& name, const std::string& data = "");

// A READY command carrying `properties` (name, value) in order.
Bytes ready(const std::vector<std::pair<std::string, std::string>>& properties);

// `parts` end to end.
Bytes cat(std::initializer_list<Bytes> parts);

}  // namespace fedwan::testing::zmtp
