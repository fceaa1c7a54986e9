// KeepAlive: long work pulses, the innermost scope of the same thread
// beats at most once a period; a file written and a digest taken pulse as
// they go, so a node writing its checkpoint keeps its heartbeats going.
// Periods of zero (every pulse beats) and of an hour (none does): nothing
// here depends on how fast the machine is.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/atomic_file.hpp"
#include "common/keep_alive.hpp"
#include "common/mapped_floats.hpp"
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

TEST(KeepAlive, AScopeBeatsNoMorePastItsLimit) {
  int within = 0, past = 0, later = 0;
  {
    const KeepAlive k(
        0s, [&] { ++within; }, 1h);
    KeepAlive::pulse();
    KeepAlive::pulse();
  }
  {
    // Past its limit from the start: silence, as a node hung in its work.
    const KeepAlive k(
        0s, [&] { ++past; }, -1ns);
    KeepAlive::pulse();
    KeepAlive::pulse();
    EXPECT_EQ(k.beats(), 0u);
  }
  {
    const KeepAlive k(
        0s, [&] { ++later; }, 20ms);
    std::this_thread::sleep_for(30ms);  // the work outlasted the limit
    KeepAlive::pulse();
    // A blocking call beside the beats beats no more either.
    EXPECT_EQ(KeepAlive::during([] { return 7; }), 7);
  }
  EXPECT_EQ(within, 2);
  EXPECT_EQ(past, 0);
  EXPECT_EQ(later, 0);
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

// One blocking call (an fsync) has no pieces: with a scope open it runs on
// another thread while this one beats; without one it runs here.
TEST(KeepAlive, ABlockingCallRunsBesideTheBeatsAndOnItsOwnThreadOnlyInAScope) {
  const std::thread::id here = std::this_thread::get_id();
  std::thread::id ran_on;
  EXPECT_EQ(KeepAlive::during([&] {
              ran_on = std::this_thread::get_id();
              return 7;
            }),
            7);
  EXPECT_EQ(ran_on, here) << "no scope: run in place";

  std::atomic<int> beats{0};
  std::atomic<bool> released{false};
  const KeepAlive k(0s, [&] { ++beats; });
  // The call returns only once this thread beat three times meanwhile:
  // without the beats going on beside it, it would wait forever (the
  // test's own timeout), whatever the machine's speed.
  const int r = KeepAlive::during([&] {
    ran_on = std::this_thread::get_id();
    while (beats.load() < 3) std::this_thread::sleep_for(1ms);
    released = true;
    return 0;
  });
  EXPECT_EQ(r, 0);
  EXPECT_TRUE(released.load());
  EXPECT_NE(ran_on, here) << "in a scope: on a helper thread";
  EXPECT_GE(beats.load(), 3);
}

TEST(KeepAlive, WhatABlockingCallThrowsIsThrownHere) {
  const KeepAlive k(1h, [] {});
  EXPECT_THROW(KeepAlive::during([]() -> int { throw std::runtime_error("disk gone"); }),
               std::runtime_error);
}

// A whole model copied (into a file-backed array: the anchor at a billion
// parameters) pulses between pieces, and copies every byte.
TEST(KeepAlive, AModelCopiedIntoAnArrayPulsesAsItGoes) {
  std::vector<float> model(10u << 20);  // 40 MiB
  std::iota(model.begin(), model.end(), 0.0f);
  int beats = 0;
  const KeepAlive k(0s, [&] { ++beats; });
  MappedFloats anchor;
  anchor.assign(model);
  EXPECT_GE(beats, 2) << "40 MiB copied in one go";
  ASSERT_EQ(anchor.size(), model.size());
  EXPECT_EQ(std::memcmp(anchor.data(), model.data(), model.size() * sizeof(float)), 0);
  std::vector<uint8_t> odd(17u << 20 | 3u);
  for (size_t i = 0; i < odd.size(); ++i) odd[i] = static_cast<uint8_t>(i * 31);
  std::vector<uint8_t> to(odd.size());
  KeepAlive::copy(to.data(), odd.data(), odd.size());
  EXPECT_EQ(to, odd);
}

}  // namespace
}  // namespace fedwan
