// BytePool: buffers given back are taken again (no new allocation, no
// zeroing), within the pool's bounds, from any thread.
#include "common/byte_pool.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

namespace fedwan {
namespace {

BytePool::Options small_pool() {
  BytePool::Options o;
  o.max_buffers = 3;
  o.max_bytes = 1 << 20;
  o.min_size = 1024;
  return o;
}

TEST(BytePool, ABufferGivenBackIsTakenAgainWithoutAFreshAllocation) {
  BytePool pool(small_pool());
  std::vector<uint8_t> a = pool.take(100000);
  ASSERT_EQ(a.size(), 100000u);
  a[0] = 7;
  a[99999] = 9;
  const uint8_t* where = a.data();
  pool.give(std::move(a));
  EXPECT_EQ(pool.kept_buffers(), 1u);
  EXPECT_GE(pool.kept_bytes(), 100000u);
  // Smaller: the same memory, truncated, its bytes as they were.
  std::vector<uint8_t> b = pool.take(50000);
  EXPECT_EQ(b.data(), where);
  EXPECT_EQ(b.size(), 50000u);
  EXPECT_EQ(b[0], 7);
  EXPECT_EQ(pool.kept_buffers(), 0u);
  EXPECT_EQ(pool.kept_bytes(), 0u);
  // Grown back within its capacity: the same memory, the new tail zeroed.
  pool.give(std::move(b));
  std::vector<uint8_t> c = pool.take(100000);
  EXPECT_EQ(c.data(), where);
  EXPECT_EQ(c[0], 7);
  EXPECT_EQ(c[99999], 0);
  // Larger than anything kept: a new zeroed buffer.
  pool.give(std::move(c));
  std::vector<uint8_t> d = pool.take(200000);
  EXPECT_NE(d.data(), where);
  EXPECT_EQ(d.size(), 200000u);
  EXPECT_EQ(d[199999], 0);
  EXPECT_EQ(pool.kept_buffers(), 1u);
}

TEST(BytePool, TakesTheSmallestBufferThatFits) {
  BytePool pool(small_pool());
  std::vector<uint8_t> big(300000), mid(120000), small(20000);
  const uint8_t* mid_at = mid.data();
  pool.give(std::move(big));
  pool.give(std::move(mid));
  pool.give(std::move(small));
  EXPECT_EQ(pool.kept_buffers(), 3u);
  EXPECT_EQ(pool.take(100000).data(), mid_at);
}

TEST(BytePool, KeepsNoMoreThanItsBoundsAndNothingSmall) {
  BytePool pool(small_pool());
  pool.give(std::vector<uint8_t>(512));  // under min_size
  EXPECT_EQ(pool.kept_buffers(), 0u);
  pool.give(std::vector<uint8_t>(600000));
  pool.give(std::vector<uint8_t>(600000));  // over max_bytes together
  EXPECT_EQ(pool.kept_buffers(), 1u);
  pool.give(std::vector<uint8_t>(100000));
  pool.give(std::vector<uint8_t>(100000));
  pool.give(std::vector<uint8_t>(100000));  // a fourth buffer
  EXPECT_EQ(pool.kept_buffers(), 3u);
  EXPECT_LE(pool.kept_bytes(), size_t{1} << 20);
  // A take under min_size never uses a kept buffer.
  EXPECT_EQ(pool.take(100).size(), 100u);
  EXPECT_EQ(pool.kept_buffers(), 3u);
}

TEST(BytePool, KeepsNothingUntilAllowedAndNeverLessAfter) {
  BytePool::Options o = small_pool();
  o.max_buffers = 0;
  o.max_bytes = 0;
  BytePool pool(o);
  pool.give(std::vector<uint8_t>(100000));
  EXPECT_EQ(pool.kept_buffers(), 0u);
  pool.allow(2, 1 << 20);
  pool.allow(1, 1000);  // lower: no effect
  pool.give(std::vector<uint8_t>(100000));
  pool.give(std::vector<uint8_t>(100000));
  pool.give(std::vector<uint8_t>(100000));
  EXPECT_EQ(pool.kept_buffers(), 2u);
}

// A lease lets the pool keep more while it lives; when the last one ends
// the pool frees what it keeps beyond allow()'s bounds, from any thread.
TEST(BytePool, WhatALeaseLetsThePoolKeepIsFreedWhenItEnds) {
  BytePool::Options o = small_pool();
  o.max_buffers = 1;
  o.max_bytes = 1 << 20;
  BytePool pool(o);
  BytePool::Lease big = pool.lease(4, 4 << 20);
  BytePool::Lease small = pool.lease(2, 2 << 20);
  for (int i = 0; i < 5; ++i) pool.give(std::vector<uint8_t>(100000));
  EXPECT_EQ(pool.kept_buffers(), 4u);
  std::thread([&] { big.end(); }).join();  // the largest ends: down to the next
  EXPECT_EQ(pool.kept_buffers(), 2u);
  BytePool::Lease moved = std::move(small);
  small.end();  // moved from: nothing
  EXPECT_EQ(pool.kept_buffers(), 2u);
  { BytePool::Lease gone = std::move(moved); }
  EXPECT_EQ(pool.kept_buffers(), 1u);  // allow()'s bound (the constructor's)
  EXPECT_LE(pool.kept_bytes(), size_t{1} << 20);
  // More buffers but no more bytes than allow()'s: the bytes bound.
  BytePool::Lease wide = pool.lease(20, 0);
  for (int i = 0; i < 15; ++i) pool.give(std::vector<uint8_t>(100000));
  EXPECT_EQ(pool.kept_buffers(), 10u);  // 10 x 100000 within 1 MiB, not 11
  wide.end();
  EXPECT_EQ(pool.kept_buffers(), 1u);
}

TEST(BytePool, ASharedBufferGoesBackWhenItsLastHolderLetsGo) {
  BytePool pool(small_pool());
  auto frame = pool.take_shared(70000);
  ASSERT_EQ(frame->size(), 70000u);
  const uint8_t* where = frame->data();
  auto kept = frame;
  frame.reset();
  EXPECT_EQ(pool.kept_buffers(), 0u);
  kept.reset();
  EXPECT_EQ(pool.kept_buffers(), 1u);
  EXPECT_EQ(pool.take(70000).data(), where);
}

TEST(BytePool, BuffersTakenOnOneThreadAreGivenBackOnAnother) {
  BytePool::Options o = small_pool();
  o.max_buffers = 8;
  o.max_bytes = 8 << 20;
  BytePool pool(o);
  std::thread giver;
  const uint8_t* first = nullptr;
  for (int round = 0; round < 200; ++round) {
    if (giver.joinable()) giver.join();
    std::vector<uint8_t> b = pool.take(65536);
    ASSERT_EQ(b.size(), 65536u);
    if (first == nullptr) first = b.data();
    ASSERT_EQ(b.data(), first) << round;  // one buffer goes round
    b[round] = uint8_t(round);
    giver = std::thread([&pool, bb = std::move(b)]() mutable { pool.give(std::move(bb)); });
  }
  giver.join();
  EXPECT_EQ(pool.kept_buffers(), 1u);
}

}  // namespace
}  // namespace fedwan
