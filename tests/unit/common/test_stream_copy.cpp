// stream_copy: memcpy's bits for every length and alignment, the streamed
// stores starting wherever dst first meets a 32-byte boundary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/stream_copy.hpp"

namespace fedwan {
namespace {

TEST(StreamCopy, CopiesTheSameBitsAtEveryLengthAndAlignment) {
  std::vector<float> src(4099);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(static_cast<float>(i)) * 1e3f;
  src[5] = -0.0f;
  src[70] = std::numeric_limits<float>::quiet_NaN();
  src[71] = std::numeric_limits<float>::infinity();
  src[72] = std::numeric_limits<float>::denorm_min();
  for (size_t n : {0, 1, 7, 8, 63, 64, 65, 71, 72, 1000, 4096}) {
    for (size_t src_shift = 0; src_shift < 3; ++src_shift) {
      for (size_t dst_shift = 0; dst_shift < 9; ++dst_shift) {
        std::vector<float> dst(n + 16, 42.0f);
        stream_copy(dst.data() + dst_shift, src.data() + src_shift, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_shift, src.data() + src_shift, n * sizeof(float)), 0)
            << "n " << n << " src_shift " << src_shift << " dst_shift " << dst_shift;
        for (size_t i = 0; i < dst_shift; ++i) ASSERT_EQ(dst[i], 42.0f);
        for (size_t i = dst_shift + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 42.0f);
      }
    }
  }
}

}  // namespace
}  // namespace fedwan
