// What the channel security layer reads of a message before it opens it:
// whether it is a fedwan frame at all, sealed or not, its type and flags,
// and the order field a sealer filled. The header is read where it lies;
// nothing is trusted that the frame's own check has not judged.
#pragma once

#include <cstddef>
#include <cstdint>

#include "security/frame_protector.hpp"
#include "wire/frame.hpp"

namespace fedwan::transport::peek {

inline constexpr size_t kTypeOffset = 5;
inline constexpr size_t kFlagsOffset = 7;

inline bool looks_like_frame(const uint8_t* data, size_t size) {
  return size >= wire::kHeaderSize &&
         (uint32_t{data[0]} | uint32_t{data[1]} << 8 | uint32_t{data[2]} << 16 |
          uint32_t{data[3]} << 24) == wire::kMagic;
}

inline bool is_sealed(const uint8_t* data) {
  return (data[kFlagsOffset] & security::kFlagSealed) != 0;
}

inline wire::MsgType type_of(const uint8_t* data) {
  return static_cast<wire::MsgType>(data[kTypeOffset]);
}

inline uint32_t load_order(const uint8_t* data) {
  const uint8_t* p = data + wire::kOrderOffset;
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

}  // namespace fedwan::transport::peek
