// Splits one direction of a ZMTP 3.x byte stream (ZeroMQ's wire protocol)
// into its greeting, command frames and whole data messages, without
// changing a byte: the pieces, concatenated in order, give the input back.
// The fault-injecting proxy decides the fate of each data message.
//
// ZMTP 3.x: a 64-byte greeting (0xFF, 8 padding bytes, 0x7F, major version
// >= 3, ...), then frames: a flags byte (bit 0 MORE, bit 1 LONG, bit 2
// COMMAND, the rest reserved), a size (8 bytes big-endian when LONG, else
// one byte), the body. A message is the frames up to one without MORE.
//
// Anything else (a bad greeting byte, reserved flag bits, a frame or message
// over max_message_bytes) turns the splitter raw: the rest of the stream
// leaves as kRaw pieces, so garbage is forwarded as it came, never parsed
// past. Memory stays bounded by max_message_bytes plus the last feed.
//
// Pure: no sockets, no clocks. Not thread safe: one owner.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fedwan::testing {

class ZmtpSplitter {
 public:
  enum class Kind { kGreeting, kCommand, kMessage, kRaw };
  struct Piece {
    Kind kind;
    std::vector<uint8_t> bytes;
  };

  static constexpr size_t kGreetingBytes = 64;

  explicit ZmtpSplitter(size_t max_message_bytes) : max_message_(max_message_bytes) {}

  // Appends the pieces completed by [p, p + n) to `out`, in stream order.
  // Greeting bytes leave at once, as they come: libzmq sends the first part
  // of its greeting and waits for the peer's before sending the rest.
  void feed(const uint8_t* p, size_t n, std::vector<Piece>& out) {
    if (state_ == State::kRaw) {
      if (n > 0) out.push_back({Kind::kRaw, std::vector<uint8_t>(p, p + n)});
      return;
    }
    if (state_ == State::kGreeting) {
      size_t ok = 0;  // bytes of [p, p + n) that belong to a plausible greeting
      while (ok < n && greeting_seen_ < kGreetingBytes) {
        if (!greeting_byte_plausible(greeting_seen_, p[ok])) break;
        ++ok;
        ++greeting_seen_;
      }
      if (ok > 0) out.push_back({Kind::kGreeting, std::vector<uint8_t>(p, p + ok)});
      p += ok;
      n -= ok;
      if (greeting_seen_ < kGreetingBytes) {
        if (n > 0) {  // an implausible byte: not ZMTP 3.x
          state_ = State::kRaw;
          feed(p, n, out);
        }
        return;
      }
      state_ = State::kFrames;
    }
    in_.insert(in_.end(), p, p + n);
    parse(out);
  }

  // End of stream: whatever is buffered leaves as one raw piece.
  void finish(std::vector<Piece>& out) {
    if (state_ != State::kRaw) go_raw(out);
  }

  // The routing id a peer announces in its READY command (the "Identity"
  // property a DEALER, ROUTER or REQ socket sends), when `frame` is a whole
  // READY command frame with a non-empty one. Bounds-checked: any bytes.
  static std::optional<std::string> ready_identity(const std::vector<uint8_t>& frame) {
    if (frame.size() < 2 || !(frame[0] & 0x04)) return std::nullopt;
    size_t pos = (frame[0] & 0x02) ? 9 : 2;
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
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (name == "identity") {
        if (value_len == 0) return std::nullopt;
        return std::string(frame.begin() + pos, frame.begin() + pos + value_len);
      }
      pos += value_len;
    }
    return std::nullopt;
  }

  // Parsing was given up: every piece from now on is kRaw.
  bool raw() const { return state_ == State::kRaw; }
  // Bytes held waiting for the rest of a frame or message.
  size_t buffered() const { return (in_.size() - pos_) + message_.size(); }

 private:
  enum class State { kGreeting, kFrames, kRaw };

  // Signature 0xFF, 8 padding bytes, 0x7F, then major version 3 or later.
  static bool greeting_byte_plausible(size_t index, uint8_t b) {
    if (index == 0) return b == 0xFF;
    if (index == 9) return b == 0x7F;
    if (index == 10) return b >= 3;
    return true;
  }

  void go_raw(std::vector<Piece>& out) {
    std::vector<uint8_t> rest = std::move(message_);
    rest.insert(rest.end(), in_.begin() + static_cast<std::ptrdiff_t>(pos_), in_.end());
    message_.clear();
    in_.clear();
    pos_ = 0;
    state_ = State::kRaw;
    if (!rest.empty()) out.push_back({Kind::kRaw, std::move(rest)});
  }

  void parse(std::vector<Piece>& out) {
    for (;;) {
      const size_t avail = in_.size() - pos_;
      if (avail < 1) break;
      const uint8_t* f = in_.data() + pos_;
      const uint8_t flags = f[0];
      if (flags & 0xF8) return go_raw(out);  // reserved bits: not ZMTP 3.x framing
      const bool more = flags & 0x01;
      const bool long_size = flags & 0x02;
      const bool command = flags & 0x04;
      const size_t header = long_size ? 9 : 2;
      if (avail < header) break;
      uint64_t size = 0;
      if (long_size) {
        for (int i = 1; i <= 8; ++i) size = (size << 8) | f[i];
      } else {
        size = f[1];
      }
      // A frame or message over the limit cannot be held whole: stop parsing.
      const size_t used = command ? 0 : message_.size();
      if (size > max_message_ || header + size > max_message_ - std::min(max_message_, used)) {
        return go_raw(out);
      }
      if (avail < header + size) break;
      const size_t frame = header + static_cast<size_t>(size);
      if (command) {
        // A command may arrive between the frames of a message: it passes at once.
        out.push_back({Kind::kCommand, std::vector<uint8_t>(f, f + frame)});
      } else {
        message_.insert(message_.end(), f, f + frame);
        if (!more) {
          out.push_back({Kind::kMessage, std::move(message_)});
          message_.clear();
        }
      }
      pos_ += frame;
    }
    if (pos_ == in_.size()) {
      in_.clear();
      pos_ = 0;
    } else if (pos_ > in_.size() / 2) {
      in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(pos_));
      pos_ = 0;
    }
  }

  size_t max_message_;
  State state_ = State::kGreeting;
  size_t greeting_seen_ = 0;
  std::vector<uint8_t> in_;  // unparsed bytes from pos_
  size_t pos_ = 0;
  std::vector<uint8_t> message_;  // frames of the data message being assembled
};

}  // namespace fedwan::testing
