#include "harness/zmtp.hpp"

#include <algorithm>
#include <cctype>

namespace fedwan::testing::zmtp {

bool greeting_byte_plausible(size_t index, uint8_t b) {
  if (index == 0) return b == 0xFF;
  if (index == 9) return b == 0x7F;
  if (index == 10) return b >= 3;
  return true;
}

HeaderParse parse_frame_header(const uint8_t* p, size_t n, FrameHeader* out) {
  if (n < 1) return HeaderParse::kNeedMore;
  const uint8_t flags = p[0];
  if (flags & kFlagsReserved) return HeaderParse::kInvalid;
  const bool long_size = flags & kFlagLong;
  const size_t header = long_size ? 9 : 2;
  if (n < header) return HeaderParse::kNeedMore;
  uint64_t size = 0;
  if (long_size) {
    for (int i = 1; i <= 8; ++i) size = (size << 8) | p[i];
  } else {
    size = p[1];
  }
  out->flags = flags;
  out->header_bytes = header;
  out->body_bytes = size;
  return HeaderParse::kOk;
}

std::optional<std::string> ready_identity(const Bytes& frame) {
  if (frame.size() < 2 || !(frame[0] & kFlagCommand)) return std::nullopt;
  size_t pos = (frame[0] & kFlagLong) ? 9 : 2;
  static const char kReady[] = "\x05READY";
  if (frame.size() < pos + 6 || !std::equal(kReady, kReady + 6, frame.begin() + pos)) {
    return std::nullopt;
  }
  pos += 6;
  while (pos < frame.size()) {
    const size_t name_len = frame[pos++];
    if (frame.size() - pos < name_len + 4) return std::nullopt;
    std::string name(frame.begin() + pos, frame.begin() + pos + name_len);
    pos += name_len;
    uint64_t value_len = 0;
    for (int i = 0; i < 4; ++i) value_len = (value_len << 8) | frame[pos++];
    if (frame.size() - pos < value_len) return std::nullopt;
    // Property names are case-insensitive (ZMTP 3.0, RFC 23).
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (name == "identity") {
      if (value_len == 0) return std::nullopt;
      return std::string(frame.begin() + pos, frame.begin() + pos + value_len);
    }
    pos += value_len;
  }
  return std::nullopt;
}

Bytes greeting(const std::string& mechanism) {
  Bytes g(kGreetingBytes, 0);
  g[0] = 0xFF;
  g[9] = 0x7F;
  g[10] = 3;  // major
  g[11] = 1;  // minor
  std::copy_n(mechanism.begin(), std::min<size_t>(mechanism.size(), 20), g.begin() + 12);
  return g;
}

Bytes frame(const std::string& body, bool more, bool command, bool force_long) {
  Bytes f;
  const bool long_size = force_long || body.size() > 255;
  f.push_back(static_cast<uint8_t>((more ? kFlagMore : 0) | (long_size ? kFlagLong : 0) |
                                   (command ? kFlagCommand : 0)));
  if (long_size) {
    for (int i = 7; i >= 0; --i) {
      f.push_back(static_cast<uint8_t>(uint64_t{body.size()} >> (8 * i)));
    }
  } else {
    f.push_back(static_cast<uint8_t>(body.size()));
  }
  f.insert(f.end(), body.begin(), body.end());
  return f;
}

Bytes command(const std::string& name, const std::string& data) {
  std::string body(1, static_cast<char>(name.size()));
  body += name + data;
  return frame(body, false, true);
}

Bytes ready(const std::vector<std::pair<std::string, std::string>>& properties) {
  std::string data;
  for (const auto& [name, value] : properties) {
    data += static_cast<char>(name.size());
    data += name;
    for (int i = 3; i >= 0; --i) data += static_cast<char>((value.size() >> (8 * i)) & 0xFF);
    data += value;
  }
  return command("READY", data);
}

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace fedwan::testing::zmtp
