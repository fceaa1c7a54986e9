// The wire's integer and double fields: little-endian on any host, read and
// written byte by byte so that no load is ever unaligned, whatever offset the
// transport hands us. Shared by the frame header and the control payloads.
#pragma once

#include <cstdint>
#include <cstring>

namespace fedwan::wire {

inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
// A double travels as its IEEE-754 bit pattern in a u64 field.
inline uint64_t double_bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}
inline double bits_double(uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof(d));
  return d;
}

}  // namespace fedwan::wire
