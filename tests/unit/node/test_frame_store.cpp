#include "node/frame_store.hpp"

#include <fstream>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "common/byte_pool.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::node {
namespace {

Frame bytes(size_t n, uint8_t seed) {
  auto v = std::make_shared<std::vector<uint8_t>>(n);
  for (size_t i = 0; i < n; ++i) (*v)[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(FrameStore, OffKeepsFramesInMemory) {
  FrameStore store(false, "", "test");
  const Frame f = bytes(100, 1);
  const StoredFrame s = store.keep(f);
  EXPECT_TRUE(s.in_memory());
  EXPECT_EQ(s.load(), f);  // the same frame, not a copy
  EXPECT_EQ(s.size(), 100u);
}

TEST(FrameStore, OnReadsBackEveryFrameAsWritten) {
  testing::TempDir dir;
  FrameStore store(true, dir.path(), "test");
  std::vector<Frame> frames;
  std::vector<StoredFrame> stored;
  for (uint8_t i = 0; i < 20; ++i) {
    frames.push_back(bytes(1000 + i * 333, i));
    stored.push_back(store.keep(frames.back()));
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_FALSE(stored[i].in_memory());
    EXPECT_EQ(stored[i].size(), frames[i]->size());
    EXPECT_EQ(*stored[i].load(), *frames[i]) << i;
  }
  // The file is unnamed: nothing is left in the directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// Bytes the caller goes on using: on disk without a copy kept, in memory as
// a copy of their own.
TEST(FrameStore, KeepsBytesTheCallerStillUses) {
  testing::TempDir dir;
  FrameStore on(true, dir.path(), "test");
  std::vector<uint8_t> frame = *bytes(5000, 4);
  const StoredFrame on_disk = on.keep(frame);
  EXPECT_FALSE(on_disk.in_memory());
  FrameStore off(false, "", "test");
  const StoredFrame in_memory = off.keep(frame);
  EXPECT_TRUE(in_memory.in_memory());
  frame.assign(frame.size(), 0);  // the caller's bytes change (sealed, sent)
  EXPECT_EQ(*on_disk.load(), *bytes(5000, 4));
  EXPECT_EQ(*in_memory.load(), *bytes(5000, 4));
}

TEST(FrameStore, AFrameOutlivesTheRotationAndTheStore) {
  testing::TempDir dir;
  StoredFrame old_round;
  {
    FrameStore store(true, dir.path(), "test");
    old_round = store.keep(bytes(4096, 9));
    store.rotate();
    const StoredFrame next = store.keep(bytes(10, 3));
    EXPECT_EQ(*next.load(), *bytes(10, 3));
  }
  EXPECT_EQ(*old_round.load(), *bytes(4096, 9));
}

// Round after round: a round's file is written over once nothing refers to
// it; frames an outbox still holds from earlier rounds keep their bytes.
TEST(FrameStore, EveryRoundReadsBackAsWrittenWhileOlderFramesAreHeld) {
  testing::TempDir dir;
  FrameStore store(true, dir.path(), "test");
  const size_t size = 300 << 10;  // beyond kHotBytes in a round: read from the file
  std::vector<StoredFrame> held;  // one frame of every other round, held on
  for (uint8_t round = 0; round < 6; ++round) {
    std::vector<StoredFrame> frames;
    for (uint8_t i = 0; i < 10; ++i) frames.push_back(store.keep(bytes(size, round * 16 + i)));
    for (uint8_t i = 0; i < 10; ++i) {
      ASSERT_EQ(*frames[i].load(), *bytes(size, round * 16 + i)) << int(round) << " " << int(i);
    }
    if (round % 2 == 0) held.push_back(frames[3]);
    for (size_t k = 0; k < held.size(); ++k) {
      ASSERT_EQ(*held[k].load(), *bytes(size, uint8_t(k * 2 * 16 + 3))) << int(round) << " " << k;
    }
    store.rotate();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(FrameStore, ADirectoryItCannotWriteLeavesFramesInMemory) {
  // Under a file: no directory can be made there, even by root.
  testing::TempDir dir;
  std::ofstream(dir.path() / "file") << "x";
  FrameStore store(true, dir.path() / "file" / "frames", "test");
  const Frame f = bytes(64, 5);
  const StoredFrame s = store.keep(f);
  EXPECT_TRUE(s.in_memory());
  EXPECT_EQ(*s.load(), *f);
  EXPECT_TRUE(store.keep(bytes(8, 1)).in_memory());  // and stays so for the round
  store.rotate();
  EXPECT_TRUE(store.keep(bytes(8, 1)).in_memory());  // tried again, failed again
}

TEST(FrameStore, MakesItsDirectory) {
  testing::TempDir dir;
  FrameStore store(true, dir.path() / "checkpoints" / "root", "test");
  const StoredFrame s = store.keep(bytes(64, 5));
  EXPECT_FALSE(s.in_memory());
  EXPECT_EQ(*s.load(), *bytes(64, 5));
}

// The newest frames stay in memory besides their copy on disk: a frame sent
// while young is not read back; an older one is, bit for bit.
TEST(FrameStore, YoungFramesAreNotReadBack) {
  testing::TempDir dir;
  FrameStore store(true, dir.path(), "test");
  const size_t size = 512 << 10;
  Frame original = bytes(size, 1);
  const std::weak_ptr<const std::vector<uint8_t>> watch = original;
  const std::vector<uint8_t>* where = original.get();
  const StoredFrame first = store.keep(original);
  original.reset();  // only the store holds it now
  EXPECT_FALSE(first.in_memory());
  EXPECT_EQ(first.load().get(), where);  // young: the same bytes, not a read
  std::vector<uint8_t> scratch;
  const uint8_t* p = first.bytes(scratch);
  EXPECT_EQ(std::vector<uint8_t>(p, p + size), *bytes(size, 1));
  // kHotBytes of newer frames: the first is old now, let go and read back.
  std::vector<StoredFrame> later;
  for (size_t kept = 0; kept <= FrameStore::kHotBytes; kept += size) {
    later.push_back(store.keep(bytes(size, uint8_t(2 + later.size()))));
  }
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(*first.load(), *bytes(size, 1));
  scratch.clear();
  p = first.bytes(scratch);
  EXPECT_EQ(p, scratch.data());
  EXPECT_EQ(std::vector<uint8_t>(p, p + size), *bytes(size, 1));
  // The newest is young until the store rotates.
  const std::weak_ptr<const std::vector<uint8_t>> newest = later.back().load();
  EXPECT_FALSE(newest.expired());
  store.rotate();
  EXPECT_TRUE(newest.expired());
  EXPECT_EQ(*later.back().load(), *bytes(size, uint8_t(2 + later.size() - 1)));
}

// A frame read back is read into a buffer the process's pool kept (its
// old bytes overwritten, every one), and the buffer goes back when the
// last holder lets go.
TEST(FrameStore, ReadsBackIntoBuffersUsedBefore) {
  testing::TempDir dir;
  FrameStore store(true, dir.path(), "test");
  const size_t size = 640 << 10;
  std::vector<StoredFrame> stored;
  for (size_t kept = 0; kept <= 2 * FrameStore::kHotBytes; kept += size) {
    stored.push_back(store.keep(bytes(size, uint8_t(3 + stored.size()))));
  }
  store.rotate();  // none young: every load reads
  BytePool& pool = BytePool::shared();
  const BytePool::Lease lease = pool.lease(4, 4 * size);
  std::vector<std::vector<uint8_t>> others;  // what earlier tests left there
  while (pool.kept_buffers() > 0) others.push_back(pool.take(64 << 10));
  std::vector<uint8_t> used(size + 100, 0xEE);  // a larger buffer, not zeroed
  const uint8_t* where = used.data();
  pool.give(std::move(used));
  ASSERT_EQ(pool.kept_buffers(), 1u);
  {
    const Frame back = stored.front().load();
    EXPECT_EQ(back->data(), where);     // the pool's buffer...
    EXPECT_EQ(*back, *bytes(size, 3));  // ...holding exactly the frame
    EXPECT_EQ(pool.kept_buffers(), 0u);
  }
  EXPECT_EQ(pool.kept_buffers(), 1u);  // given back
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_EQ(*stored[i].load(), *bytes(size, uint8_t(3 + i))) << i;
  }
}

}  // namespace
}  // namespace fedwan::node
