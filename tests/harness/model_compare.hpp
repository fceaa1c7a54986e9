// Comparing flat fp32 models in tests: the federation's guarantees are
// bit-for-bit (a replay, a resumed node, every site's final model).
#pragma once

#include <cstring>
#include <vector>

namespace fedwan::testing {

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace fedwan::testing
