// Shared by the codec tests: encode and decode into fresh buffers, largest
// magnitudes overall and per block, bitwise equality, and a little-endian
// field writer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "codec/fp16_codec.hpp"
#include "fedwan/codec.hpp"

namespace fedwan {

using Bytes = std::vector<uint8_t>;
using Floats = std::vector<float>;

inline Bytes encode(const Codec& c, const Floats& in, float* residual = nullptr) {
  Bytes out(c.encoded_size(in.size()));
  c.encode(in.data(), in.size(), residual, out.data());
  return out;
}

inline Floats decode(const Codec& c, const Bytes& b, size_t n) {
  Floats out(n);
  c.decode(b.data(), n, out.data());
  return out;
}

inline float max_abs(const Floats& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Largest |v| of each block of `block` elements (fp16's by default).
inline Floats block_max_abs(const Floats& v, size_t block = Fp16Codec::kBlock) {
  Floats m((v.size() + block - 1) / block, 0.0f);
  for (size_t i = 0; i < v.size(); ++i) m[i / block] = std::max(m[i / block], std::fabs(v[i]));
  return m;
}

inline bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline void put_u16(Bytes& b, size_t off, uint16_t v) {
  b[off] = uint8_t(v);
  b[off + 1] = uint8_t(v >> 8);
}

}  // namespace fedwan
