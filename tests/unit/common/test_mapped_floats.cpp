// A float array in memory or in a mapped unnamed file (common/mapped_floats.hpp):
// what a site's anchor of a large model lives in.
#include "common/mapped_floats.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "harness/temp_dir.hpp"

namespace fedwan {
namespace {

using testing::TempDir;

std::vector<float> ramp(size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(MappedFloats, LargeArraysGoToAFileAndHoldTheirValues) {
  TempDir dir;
  MappedFloats a;
  a.place(dir.path(), 4096);
  const std::vector<float> big = ramp(100000, 1.0f);
  a.assign(big);
  ASSERT_TRUE(a.in_file()) << a.why();
  EXPECT_TRUE(a.why().empty());
  ASSERT_EQ(a.size(), big.size());
  EXPECT_EQ(std::vector<float>(a.data(), a.data() + a.size()), big);
  // Written through the mapping and read back, like an anchor chunk.
  a[99999] = -3.5f;
  a.cool();
  EXPECT_EQ(a[99999], -3.5f);
  // The file is unnamed: nothing is left in the directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  // The same size again keeps the mapping and takes the new values.
  const float* before = a.data();
  const std::vector<float> other = ramp(100000, -7.0f);
  a.assign(other);
  EXPECT_EQ(a.data(), before);
  EXPECT_EQ(std::vector<float>(a.data(), a.data() + a.size()), other);
}

TEST(MappedFloats, SmallArraysStayInMemory) {
  TempDir dir;
  MappedFloats a;
  a.place(dir.path(), 4096);
  const std::vector<float> small = ramp(1000, 0.5f);  // 4000 bytes
  a.assign(small);
  EXPECT_FALSE(a.in_file());
  EXPECT_TRUE(a.why().empty());
  EXPECT_EQ(std::vector<float>(a.data(), a.data() + a.size()), small);

  // Growing past the threshold moves it to a file, shrinking back to memory.
  a.assign(ramp(2000, 2.0f));
  EXPECT_TRUE(a.in_file()) << a.why();
  EXPECT_EQ(a[1999], 2001.0f);
  a.assign(small);
  EXPECT_FALSE(a.in_file());
  EXPECT_EQ(a[999], 999.5f);
}

TEST(MappedFloats, NeverWithoutPlacementOrWithSizeMax) {
  MappedFloats unplaced;
  unplaced.assign(ramp(100000, 0.0f));
  EXPECT_FALSE(unplaced.in_file());
  MappedFloats never;
  never.place({}, SIZE_MAX);
  never.assign(ramp(100000, 0.0f));
  EXPECT_FALSE(never.in_file());
  EXPECT_EQ(never[12345], 12345.0f);
}

TEST(MappedFloats, ADirectoryThatCannotHoldTheFileKeepsTheArrayInMemory) {
  TempDir dir;
  const std::filesystem::path not_a_dir = dir / "a-file";
  std::ofstream(not_a_dir) << "x";
  MappedFloats a;
  a.place(not_a_dir, 0);
  const std::vector<float> v = ramp(5000, 3.0f);
  a.assign(v);
  EXPECT_FALSE(a.in_file());
  EXPECT_NE(a.why().find(not_a_dir.string()), std::string::npos) << a.why();
  EXPECT_EQ(std::vector<float>(a.data(), a.data() + a.size()), v);
}

TEST(MappedFloats, ClearEmptiesIt) {
  TempDir dir;
  MappedFloats a;
  a.place(dir.path(), 0);
  a.assign(ramp(10, 0.0f));
  EXPECT_TRUE(a.in_file()) << a.why();
  a.clear();
  EXPECT_TRUE(a.empty());
  EXPECT_FALSE(a.in_file());
  a.assign(ramp(3, 1.0f));
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a[2], 3.0f);
}

}  // namespace
}  // namespace fedwan
