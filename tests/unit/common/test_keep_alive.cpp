// KeepAlive: long work pulses, the innermost scope of the same thread
// beats at most once a period; a file written and a digest taken pulse as
// they go, so a node writing its checkpoint keeps its heartbeats going.
// Periods of zero (every pulse beats) and of an hour (none does): nothing
// here depends on how fast the machine is.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/atomic_file.hpp"
#include "common/keep_alive.hpp"
#include "common/sha256.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;

TEST(KeepAlive, APulseWithoutAScopeDoesNothing) {
  KeepAlive::pulse();  // no scope on this thread: nothing to run, nothing thrown
  int beats = 0;
  {
    const KeepAlive k(0s, [&] { ++beats; });
    KeepAlive::pulse();
  }
  KeepAlive::pulse();  // the scope is closed
  EXPECT_EQ(beats, 1);
}

TEST(KeepAlive, BeatsOnlyOnceAPeriodPassed) {
  int beats = 0;
  const KeepAlive k(1h, [&] { ++beats; });
  for (int i = 0; i < 100; ++i) KeepAlive::pulse();
  EXPECT_EQ(beats, 0) << "beat before its period";
  EXPECT_EQ(k.beats(), 0u);
}

TEST(KeepAlive, TheInnermostScopeBeatsAndTheOuterAgainOnceItCloses) {
  int outer = 0, inner = 0;
  const KeepAlive a(0s, [&] { ++outer; });
  {
    const KeepAlive b(0s, [&] { ++inner; });
    KeepAlive::pulse();
    KeepAlive::pulse();
  }
  KeepAlive::pulse();
  EXPECT_EQ(inner, 2);
  EXPECT_EQ(outer, 1);
}

TEST(KeepAlive, ABeatThatThrowsDoesNotStopTheWorkNorTheNextBeat) {
  int beats = 0;
  const KeepAlive k(0s, [&] {
    ++beats;
    throw std::runtime_error("socket gone");
  });
  EXPECT_NO_THROW(KeepAlive::pulse());
  EXPECT_NO_THROW(KeepAlive::pulse());
  EXPECT_EQ(beats, 2);
}

TEST(KeepAlive, ABeatThatPulsesDoesNotBeatWithinItself) {
  int beats = 0;
  const KeepAlive k(0s, [&] {
    ++beats;
    KeepAlive::pulse();  // a beat that writes, and so pulses
  });
  KeepAlive::pulse();
  EXPECT_EQ(beats, 1);
}

TEST(KeepAlive, AnotherThreadsPulsesDoNotRunThisThreadsBeat) {
  int beats = 0;
  const KeepAlive k(0s, [&] { ++beats; });
  std::thread other([] {
    for (int i = 0; i < 10; ++i) KeepAlive::pulse();
  });
  other.join();
  EXPECT_EQ(beats, 0);
}

// What a checkpoint's writing goes through: a file written a MiB at a time
// past the page cache, or in pieces through it, and a model's digest.
TEST(KeepAlive, AFileWrittenAndADigestTakenPulseAsTheyGo) {
  testing::TempDir dir;
  const std::vector<uint8_t> bytes(40u << 20, 0x5a);
  for (const PageCache cache : {PageCache::kBypass, PageCache::kKeep}) {
    int beats = 0;
    const KeepAlive k(0s, [&] { ++beats; });
    AtomicFileWriter out(dir / "file", 0600, {}, cache);
    out.write(bytes.data(), bytes.size());
    out.commit();
    // 40 MiB: 40 stages of a MiB past the cache, 5 pieces of 8 MiB through it.
    EXPECT_GE(beats, 5) << "cache bypassed: " << out.bypassing_cache();
  }
  int beats = 0;
  const KeepAlive k(0s, [&] { ++beats; });
  const Sha256Digest whole = sha256(bytes.data(), bytes.size());
  EXPECT_GE(beats, 2) << "40 MiB hashed in one go";
  // The pieces change nothing of the digest.
  Sha256 h;
  for (size_t i = 0; i < bytes.size(); i += 3u << 20) {
    h.update(bytes.data() + i, std::min<size_t>(3u << 20, bytes.size() - i));
  }
  EXPECT_EQ(h.finish(), whole);
}

}  // namespace
}  // namespace fedwan
