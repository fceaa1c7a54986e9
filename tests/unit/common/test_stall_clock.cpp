// common/stall_clock.hpp: how long a node's own loop was away, told by
// its late ticks; its peers are not blamed for it.
#include "common/stall_clock.hpp"

#include <gtest/gtest.h>

namespace fedwan {
namespace {

using namespace std::chrono_literals;
using Clock = StallClock::Clock;

TEST(StallClock, OnTimeTicksAndTheFirstAreNeverAway) {
  StallClock c(100ms);
  const Clock::time_point t0{};
  EXPECT_EQ(c.tick(t0 + 5s), Clock::duration::zero());  // the first
  EXPECT_EQ(c.tick(t0 + 5s + 100ms), Clock::duration::zero());
  EXPECT_EQ(c.tick(t0 + 5s + 290ms), Clock::duration::zero());  // late by under a period
  EXPECT_EQ(c.tick(t0 + 5s + 290ms), Clock::duration::zero());  // the same instant
}

TEST(StallClock, ALateTickIsAwayByAllButThePeriodItOwed) {
  StallClock c(100ms);
  const Clock::time_point t0{};
  (void)c.tick(t0);
  EXPECT_EQ(c.tick(t0 + 30s), 30s - 100ms);
  EXPECT_EQ(c.tick(t0 + 30s + 100ms), Clock::duration::zero());  // and on time again
  EXPECT_EQ(c.tick(t0 + 30s + 301ms), 101ms);
}

TEST(StallClock, TimeAccountedForOtherwiseIsNotCountedAgain) {
  StallClock c(100ms);
  const Clock::time_point t0{};
  (void)c.tick(t0);
  c.reset(t0 + 20s);  // a checkpoint of 20 s, credited by its writer
  EXPECT_EQ(c.tick(t0 + 20s + 100ms), Clock::duration::zero());
  c.reset(t0 + 40s);
  EXPECT_EQ(c.tick(t0 + 45s), 5s - 100ms);  // only what came after
}

TEST(StallClock, APeerIsCreditedUpToNowAndANeverHeardPeerIsNot) {
  const Clock::time_point t0 = Clock::time_point{} + 1h;
  Clock::time_point heard = t0;
  StallClock::credit(heard, 3s, t0 + 10s);
  EXPECT_EQ(heard, t0 + 3s);
  StallClock::credit(heard, 30s, t0 + 10s);
  EXPECT_EQ(heard, t0 + 10s);  // never heard in the future
  StallClock::credit(heard, 5s, t0 + 10s);
  EXPECT_EQ(heard, t0 + 10s);  // heard at `now` already: nothing to credit
  Clock::time_point never{};
  StallClock::credit(never, 5s, t0);
  EXPECT_EQ(never, Clock::time_point{});
}

TEST(StallClock, WithoutAPeriodItIsNeverAway) {
  StallClock c;
  const Clock::time_point t0{};
  (void)c.tick(t0);
  EXPECT_EQ(c.tick(t0 + 1h), Clock::duration::zero());
}

}  // namespace
}  // namespace fedwan
