// Splits one direction of a ZMTP 3.x byte stream (ZeroMQ's wire protocol,
// see zmtp.hpp) into its greeting, command frames and whole data messages,
// without changing a byte: the pieces, concatenated in order, give the input
// back. The fault-injecting proxy decides the fate of each data message.
// A message is the frames up to one without MORE.
//
// Anything else (a bad greeting byte, reserved flag bits, a frame or message
// over max_message_bytes) turns the splitter raw: the rest of the stream
// leaves as kRaw pieces, so garbage is forwarded as it came, never parsed
// past. Memory stays bounded by max_message_bytes plus the last feed.
//
// Pure: no sockets, no clocks. Not thread safe: one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fedwan::testing {

class ZmtpSplitter {
 public:
  enum class Kind { kGreeting, kCommand, kMessage, kRaw };
  struct Piece {
    Kind kind;
    std::vector<uint8_t> bytes;
  };

  explicit ZmtpSplitter(size_t max_message_bytes) : max_message_(max_message_bytes) {}

  // Appends the pieces completed by [p, p + n) to `out`, in stream order.
  // Greeting bytes leave at once, as they come: libzmq sends the first part
  // of its greeting and waits for the peer's before sending the rest.
  void feed(const uint8_t* p, size_t n, std::vector<Piece>& out);

  // End of stream: whatever is buffered leaves as one raw piece.
  void finish(std::vector<Piece>& out) {
    if (state_ != State::kRaw) go_raw(out);
  }

  // Parsing was given up: every piece from now on is kRaw.
  bool raw() const { return state_ == State::kRaw; }
  // Bytes held waiting for the rest of a frame or message.
  size_t buffered() const { return (in_.size() - pos_) + message_.size(); }

 private:
  enum class State { kGreeting, kFrames, kRaw };

  void go_raw(std::vector<Piece>& out);
  void parse(std::vector<Piece>& out);

  size_t max_message_;
  State state_ = State::kGreeting;
  size_t greeting_seen_ = 0;
  std::vector<uint8_t> in_;  // unparsed bytes from pos_
  size_t pos_ = 0;
  std::vector<uint8_t> message_;  // frames of the data message being assembled
};

}  // namespace fedwan::testing
