// An array of zeros whose pages are taken as they are written
// (common/zeroed_array.hpp): what an outer optimizer's state lives in.
#include "common/zeroed_array.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fedwan/outer_optimizer.hpp"

namespace fedwan {
namespace {

// How many of the pages under [p, p + bytes) are in memory (mincore).
size_t resident_pages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(p) / page * page;
  const auto last = reinterpret_cast<uintptr_t>(p) + bytes;
  std::vector<unsigned char> in((last - first + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(first), last - first, in.data()) != 0) {
    ADD_FAILURE() << "mincore failed";
    return 0;
  }
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

// The pages one write may take: one, or a transparent huge page's where
// the kernel gives them (2 MiB on x86-64 and arm64 with 4 KiB pages).
size_t most_pages_one_write_takes() {
  return (size_t{2} << 20) / static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(ZeroedArray, HoldsZerosAndTakesNoPageUntilWritten) {
  const size_t n = size_t{16} << 20;  // 64 MiB of floats
  ZeroedArray<float> a(n);
  ASSERT_EQ(a.size(), n);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(resident_pages(a.data(), n * sizeof(float)), 0u);
  a[n / 2] = 3.5f;
  const size_t taken = resident_pages(a.data(), n * sizeof(float));
  EXPECT_GE(taken, 1u);
  EXPECT_LE(taken, most_pages_one_write_takes());
  EXPECT_EQ(a[n / 2], 3.5f);
  // The rest reads as zeros.
  double sum = 0;
  for (size_t i = 0; i < n; i += 1000) sum += a[i];
  EXPECT_EQ(sum, 0.0);
}

TEST(ZeroedArray, MovesItsPagesAndLeavesTheSourceEmpty) {
  ZeroedArray<uint16_t> a(1000);
  a[999] = 7;
  uint16_t* const p = a.data();
  ZeroedArray<uint16_t> b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): its state is specified
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b[999], 7);
  ZeroedArray<uint16_t> c(3);
  c = std::move(b);
  EXPECT_EQ(c.size(), 1000u);
  EXPECT_EQ(c[999], 7);
  EXPECT_EQ(c[0], 0);
  c = ZeroedArray<uint16_t>();
  EXPECT_TRUE(c.empty());
}

TEST(ZeroedArray, AnEmptyArrayMapsNothing) {
  ZeroedArray<float> a(0);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.data(), nullptr);
}

TEST(ZeroedArray, ASizeNoAddressSpaceHoldsIsRefused) {
  EXPECT_THROW(ZeroedArray<float>(static_cast<size_t>(-1) / 2), std::bad_alloc);
}

TEST(ZeroedArray, WarmingTakesEveryPageAndKeepsEveryValue) {
  const size_t n = size_t{24} << 20;  // 96 MiB: two pieces of 64 MiB
  ZeroedArray<float> a(n);
  a[5] = 1.5f;
  a.warm();
  // Written while the helper runs: kept.
  for (size_t i = 0; i < n; i += 4096) a[i + 7] = static_cast<float>(i);
  a.warmer().wait();
  ASSERT_TRUE(a.warmer().done());
  if (a.warmer().warmed() == 0) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE";
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(a.warmer().warmed(), n * sizeof(float));
  EXPECT_EQ(resident_pages(a.data(), n * sizeof(float)), n * sizeof(float) / page);
  EXPECT_EQ(a[5], 1.5f);
  for (size_t i = 0; i < n; i += 4096) {
    ASSERT_EQ(a[i + 7], static_cast<float>(i)) << i;
    ASSERT_EQ(a[i + 8], 0.0f) << i;
  }
}

TEST(ZeroedArray, AnArrayGoesWhileItsPagesAreWarmed) {
  // Destroyed, moved over and moved away mid-way: the helper stops first,
  // and a moved array keeps warming its own pages.
  for (int i = 0; i < 3; ++i) {
    ZeroedArray<float> a(size_t{256} << 20);  // 1 GiB
    a.warm();
    if (i == 1) a = ZeroedArray<float>(16);
    if (i == 2) {
      ZeroedArray<float> b(std::move(a));
      b[0] = 2.0f;
      EXPECT_EQ(b[0], 2.0f);
    }
  }
  ZeroedArray<float> empty;
  empty.warm();
  EXPECT_TRUE(empty.warmer().done());
}

// A root of a large model serves before its optimizer's state is touched:
// making DiLoCo's momentum or FedAdam's moments costs no page.
TEST(ZeroedArray, AnOuterOptimizersStateTakesPagesOnlyAsItSteps) {
  const size_t n = size_t{64} << 20;  // 256 MiB of floats a buffer
  for (const std::string name : {"diloco", "fedadam"}) {
    SCOPED_TRACE(name);
    OuterOptimizerSpec spec;
    spec.name = name;
    auto opt = make_outer_optimizer(spec, n);
    const auto state = opt->state();
    ASSERT_FALSE(state.empty());
    for (const auto& b : state) {
      ASSERT_EQ(b.size, n);
      EXPECT_EQ(resident_pages(b.data, n * sizeof(float)), 0u) << b.name;
    }
    std::vector<float> params(1024, 1.0f), grad(1024, 0.5f);
    opt->begin_round(0);
    opt->step(params.data(), grad.data(), n / 2, params.size());
    for (const auto& b : state) {
      const size_t taken = resident_pages(b.data, n * sizeof(float));
      EXPECT_GE(taken, 1u) << b.name;
      EXPECT_LE(taken, most_pages_one_write_takes()) << b.name;
      EXPECT_NE(b.data[n / 2], 0.0f) << b.name;
      EXPECT_EQ(b.data[0], 0.0f) << b.name;
    }
  }
}

}  // namespace
}  // namespace fedwan
