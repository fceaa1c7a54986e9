// Unnamed files a node appends to and reads back (common/spill_file.hpp),
// and the round-by-round reuse of them (SpillFiles).
#include "common/spill_file.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan {
namespace {

using testing::TempDir;

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
  return v;
}

std::vector<uint8_t> read_back(const SpillFile& f, uint64_t offset, size_t n) {
  std::vector<uint8_t> out(n);
  f.read(offset, out.data(), n);
  return out;
}

TEST(SpillFile, AppendsAndReadsBackAtOffsets) {
  TempDir dir;
  std::string why;
  const std::shared_ptr<SpillFile> f = SpillFile::make(dir.path(), &why);
  ASSERT_NE(f, nullptr) << why;
  uint64_t a = 1;
  uint64_t b = 1;
  ASSERT_TRUE(f->append(pattern(1000, 1).data(), 1000, &a));
  ASSERT_TRUE(f->append(pattern(300, 2).data(), 300, &b));
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 1000u);
  EXPECT_EQ(f->size(), 1300u);
  EXPECT_EQ(read_back(*f, b, 300), pattern(300, 2));
  EXPECT_EQ(read_back(*f, a, 1000), pattern(1000, 1));
  EXPECT_THROW(read_back(*f, 1200, 200), TransportError);  // past the end
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SpillFiles, ARetiredFileIsUsedAgainOnlyOnceNothingHoldsIt) {
  TempDir dir;
  SpillFiles files;
  std::string why;
  std::shared_ptr<SpillFile> first = files.next(dir.path(), &why);
  ASSERT_NE(first, nullptr) << why;
  uint64_t at = 0;
  ASSERT_TRUE(first->append(pattern(5000, 3).data(), 5000, &at));
  SpillFile* const first_file = first.get();

  // A reader of the last round still holds it: the next round gets a new
  // file, and the reader's bytes stay as they were written.
  std::shared_ptr<const SpillFile> reader = first;
  files.retire(std::move(first));
  std::shared_ptr<SpillFile> second = files.next(dir.path(), &why);
  ASSERT_NE(second, nullptr) << why;
  EXPECT_NE(second.get(), first_file);
  ASSERT_TRUE(second->append(pattern(7000, 4).data(), 7000, &at));
  EXPECT_EQ(at, 0u);
  EXPECT_EQ(read_back(*reader, 0, 5000), pattern(5000, 3));

  // Retiring the second drops the first (one is kept), which its reader
  // still reads; the second, once free, is written over from its start.
  SpillFile* const second_file = second.get();
  files.retire(std::move(second));
  EXPECT_EQ(read_back(*reader, 0, 5000), pattern(5000, 3));
  std::shared_ptr<SpillFile> third = files.next(dir.path(), &why);
  ASSERT_EQ(third.get(), second_file);
  EXPECT_EQ(third->size(), 0u);
  ASSERT_TRUE(third->append(pattern(100, 5).data(), 100, &at));
  EXPECT_EQ(at, 0u);
  EXPECT_EQ(third->size(), 100u);
  EXPECT_EQ(read_back(*third, 0, 100), pattern(100, 5));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SpillFiles, NothingRetiredMeansANewFile) {
  TempDir dir;
  SpillFiles files;
  std::string why;
  std::shared_ptr<SpillFile> a = files.next(dir.path(), &why);
  std::shared_ptr<SpillFile> b = files.next(dir.path(), &why);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a.get(), b.get());
  files.retire(nullptr);  // a store whose round wrote nothing
  std::shared_ptr<SpillFile> c = files.next(dir.path(), &why);
  EXPECT_NE(c.get(), a.get());
  EXPECT_NE(c.get(), b.get());
}

}  // namespace
}  // namespace fedwan
