// Reading a checkpoint's float sections back (checkpoint/node_checkpoint.hpp):
// floats_of into a new vector, copy_floats into the caller's buffer (an
// outer optimizer's state at a restore). A section that is missing or of
// another length is refused, and the buffer is left as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/node_checkpoint.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

Checkpoint with_section(const std::vector<float>& v, size_t extra_bytes = 0) {
  Checkpoint c;
  c.node_id = "root";
  std::vector<uint8_t> bytes(v.size() * sizeof(float) + extra_bytes, 0xAB);
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), v.size() * sizeof(float));
  c.sections.push_back(checkpoint::bytes_section("outer.momentum", std::move(bytes)));
  return c;
}

TEST(FloatSections, CopyFloatsFillsTheBufferWithTheSectionsValues) {
  const std::vector<float> v{1.5f, -2.0f, 0.25f};
  const Checkpoint c = with_section(v);
  std::vector<float> out(3, 9.0f);
  checkpoint::copy_floats(c, "outer.momentum", out.data(), out.size());
  EXPECT_EQ(out, v);
  EXPECT_EQ(checkpoint::floats_of(c, "outer.momentum", 3), v);
}

TEST(FloatSections, AMissingOrMisSizedSectionIsRefusedAndTheBufferKept) {
  const Checkpoint c = with_section({1.0f, 2.0f, 3.0f});
  std::vector<float> out(4, 9.0f);
  EXPECT_THROW(checkpoint::copy_floats(c, "outer.other", out.data(), 3), CryptoError);
  EXPECT_THROW(checkpoint::copy_floats(c, "outer.momentum", out.data(), 4), CryptoError);
  EXPECT_THROW(checkpoint::copy_floats(c, "outer.momentum", out.data(), 2), CryptoError);
  // Unlike floats_of, 0 is a count, not "any".
  EXPECT_THROW(checkpoint::copy_floats(c, "outer.momentum", out.data(), 0), CryptoError);
  EXPECT_EQ(out, std::vector<float>(4, 9.0f));
  EXPECT_EQ(checkpoint::floats_of(c, "outer.momentum", 0).size(), 3u);
  // Bytes that are not whole floats.
  const Checkpoint ragged = with_section({1.0f}, 2);
  EXPECT_THROW(checkpoint::copy_floats(ragged, "outer.momentum", out.data(), 1), CryptoError);
  EXPECT_THROW((void)checkpoint::floats_of(ragged, "outer.momentum", 0), CryptoError);
}

TEST(FloatSections, AnEmptySectionFitsAnEmptyBuffer) {
  const Checkpoint c = with_section({});
  EXPECT_NO_THROW(checkpoint::copy_floats(c, "outer.momentum", nullptr, 0));
}

}  // namespace
}  // namespace fedwan
