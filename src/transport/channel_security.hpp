// The slot between framing and the socket where a security mechanism sits
// (handshake, then seal/open of every frame). One instance per peer of a
// link; not thread safe (owned by the thread that owns the socket).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fedwan {

class ChannelSecurity {
 public:
  virtual ~ChannelSecurity() = default;
  virtual std::string_view name() const = 0;

  // Turns an encoded frame (header + payload) into the bytes to send; the
  // header must stay authenticated. May grow the buffer.
  virtual void seal(std::vector<uint8_t>& bytes) = 0;

  // Verifies (and decrypts) received bytes in place. On success returns true
  // and sets *frame_size to the frame's length inside `data`; on failure
  // returns false with the reason in *why (the caller drops and counts it).
  virtual bool open(uint8_t* data, size_t size, size_t* frame_size, std::string* why) = 0;
};

// No protection: frames travel as encoded. For loopback tests and the
// plaintext mode that a deployment must ask for explicitly.
class PlaintextSecurity final : public ChannelSecurity {
 public:
  std::string_view name() const override { return "plaintext"; }
  void seal(std::vector<uint8_t>&) override {}
  bool open(uint8_t*, size_t size, size_t* frame_size, std::string*) override {
    *frame_size = size;
    return true;
  }
};

}  // namespace fedwan
