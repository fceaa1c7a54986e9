// EventTimers, the timers of a node's event loop: handlers run only inside
// poll(), never before their time, periodic ones again and again, one-shot
// ones once; re-arming replaces, cancelling and destroying prevent.
//
// Waits are tens of milliseconds and the assertions are "at least" and "not
// before", never exact counts or upper bounds that a loaded machine could
// break; a loop that waits for a handler gives up after kPatience.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "node/event_timers.hpp"

namespace fedwan::node {
namespace {

using Clock = EventTimers::Clock;
using std::chrono::milliseconds;

constexpr milliseconds kPatience{5000};

// Polls every few milliseconds until `done` or kPatience; returns `done()`.
bool poll_until(EventTimers& timers, const std::function<bool()>& done) {
  const auto give_up = Clock::now() + kPatience;
  while (!done() && Clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(2));
    timers.poll();
  }
  return done();
}

// Polls for `d`, however many handlers run meanwhile.
void poll_for(EventTimers& timers, milliseconds d) {
  const auto end = Clock::now() + d;
  while (Clock::now() < end) {
    std::this_thread::sleep_for(milliseconds(2));
    timers.poll();
  }
}

TEST(EventTimers, EveryFiresRepeatedlyAndNeverBeforeItsPeriod) {
  EventTimers timers;
  const milliseconds period(10);
  std::vector<Clock::time_point> fired;
  const auto start = Clock::now();
  timers.every(period, [&] { fired.push_back(Clock::now()); });
  ASSERT_TRUE(poll_until(timers, [&] { return fired.size() >= 3; }))
      << "fired " << fired.size() << " times in " << kPatience.count() << " ms";
  // Each run is armed one period after the previous one ran.
  EXPECT_GE(fired[0] - start, period);
  for (size_t i = 1; i < fired.size(); ++i) EXPECT_GE(fired[i] - fired[i - 1], period) << i;
}

TEST(EventTimers, HandlersRunOnlyInsidePoll) {
  EventTimers timers;
  int every = 0, once = 0;
  timers.every(milliseconds(5), [&] { ++every; });
  auto t = timers.make_timer();
  timers.at(*t, Clock::now() + milliseconds(5), [&] { ++once; });
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_EQ(every, 0);  // both are due, but nobody polled
  EXPECT_EQ(once, 0);
  timers.poll();
  EXPECT_GE(every, 1);
  EXPECT_EQ(once, 1);
}

TEST(EventTimers, PollDoesNotWaitForATimerThatIsNotDue) {
  EventTimers timers;
  bool ran = false;
  timers.every(std::chrono::hours(1), [&] { ran = true; });
  auto t = timers.make_timer();
  timers.at(*t, Clock::now() + std::chrono::hours(1), [&] { ran = true; });
  const auto before = Clock::now();
  for (int i = 0; i < 10; ++i) timers.poll();
  // "Never blocks": far less than the hour it would otherwise wait.
  EXPECT_LT(Clock::now() - before, kPatience);
  EXPECT_FALSE(ran);
}

TEST(EventTimers, AtFiresOnceAndNotBeforeItsTime) {
  EventTimers timers;
  auto t = timers.make_timer();
  std::vector<Clock::time_point> fired;
  const auto when = Clock::now() + milliseconds(20);
  timers.at(*t, when, [&] { fired.push_back(Clock::now()); });
  ASSERT_TRUE(poll_until(timers, [&] { return !fired.empty(); }));
  EXPECT_GE(fired[0], when);
  poll_for(timers, milliseconds(50));
  EXPECT_EQ(fired.size(), 1u);
  // The timer can be armed again after it fired.
  timers.at(*t, Clock::now() + milliseconds(5), [&] { fired.push_back(Clock::now()); });
  ASSERT_TRUE(poll_until(timers, [&] { return fired.size() == 2; }));
}

TEST(EventTimers, ReArmingReplacesTheEarlierDeadline) {
  EventTimers timers;
  auto t = timers.make_timer();
  int first = 0;
  std::vector<Clock::time_point> second;
  // Later: the earlier deadline passes without its handler.
  timers.at(*t, Clock::now() + milliseconds(10), [&] { ++first; });
  const auto later = Clock::now() + milliseconds(60);
  timers.at(*t, later, [&] { second.push_back(Clock::now()); });
  ASSERT_TRUE(poll_until(timers, [&] { return !second.empty(); }));
  EXPECT_GE(second[0], later);
  // Earlier: the handler armed first (for an hour from now) never runs.
  int hour = 0, soon = 0;
  timers.at(*t, Clock::now() + std::chrono::hours(1), [&] { ++hour; });
  timers.at(*t, Clock::now() + milliseconds(10), [&] { ++soon; });
  ASSERT_TRUE(poll_until(timers, [&] { return soon == 1; }));
  poll_for(timers, milliseconds(30));
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second.size(), 1u);
  EXPECT_EQ(hour, 0);
  EXPECT_EQ(soon, 1);
}

TEST(EventTimers, CancelPreventsTheHandler) {
  EventTimers timers;
  auto t = timers.make_timer();
  int ran = 0;
  timers.at(*t, Clock::now() + milliseconds(20), [&] { ++ran; });
  t->cancel();
  poll_for(timers, milliseconds(60));
  EXPECT_EQ(ran, 0);
  // Even when the deadline has passed, as long as poll() has not run it yet
  // (the aggregator cancels its round deadline when a round closes in the
  // same turn of the loop that the deadline fell in).
  timers.at(*t, Clock::now() + milliseconds(1), [&] { ++ran; });
  std::this_thread::sleep_for(milliseconds(20));
  t->cancel();
  poll_for(timers, milliseconds(30));
  EXPECT_EQ(ran, 0);
  // A cancelled timer can be armed again.
  timers.at(*t, Clock::now() + milliseconds(5), [&] { ++ran; });
  ASSERT_TRUE(poll_until(timers, [&] { return ran == 1; }));
}

TEST(EventTimers, CancellingOneTimerLeavesTheOthers) {
  EventTimers timers;
  auto a = timers.make_timer();
  auto b = timers.make_timer();
  int ran_a = 0, ran_b = 0, periodic = 0;
  timers.every(milliseconds(5), [&] { ++periodic; });
  timers.at(*a, Clock::now() + milliseconds(10), [&] { ++ran_a; });
  timers.at(*b, Clock::now() + milliseconds(10), [&] { ++ran_b; });
  a->cancel();
  ASSERT_TRUE(poll_until(timers, [&] { return ran_b == 1 && periodic >= 2; }));
  EXPECT_EQ(ran_a, 0);
}

TEST(EventTimers, DestroyingATimerBeforeItFiresPreventsTheHandler) {
  EventTimers timers;
  int ran = 0;
  auto t = timers.make_timer();
  timers.at(*t, Clock::now() + milliseconds(10), [&] { ++ran; });
  t.reset();
  poll_for(timers, milliseconds(40));
  EXPECT_EQ(ran, 0);
}

TEST(EventTimers, HandlersMayArmTimersFromInsidePoll) {
  EventTimers timers;
  auto t = timers.make_timer();
  int deadlines = 0, beats = 0;
  // As the aggregator does: a heartbeat handler arms a deadline.
  timers.every(milliseconds(5), [&] {
    if (++beats == 1) timers.at(*t, Clock::now() + milliseconds(5), [&] { ++deadlines; });
  });
  ASSERT_TRUE(poll_until(timers, [&] { return deadlines == 1 && beats >= 3; }));
}

TEST(EventTimers, DestructionWithArmedTimersIsSafeAndReleasesTheHandlers) {
  // Each handler holds a token; once the timers are gone, so are the handlers.
  auto token = std::make_shared<int>(0);
  {
    auto timers = std::make_unique<EventTimers>();
    auto t = timers->make_timer();
    timers->every(milliseconds(5), [token] { ++*token; });
    timers->every(std::chrono::hours(1), [token] { ++*token; });
    timers->at(*t, Clock::now() + std::chrono::hours(1), [token] { ++*token; });
    ASSERT_TRUE(poll_until(*timers, [&] { return *token >= 1; }));
    EXPECT_GT(token.use_count(), 1);
    // A timer made by EventTimers must not outlive it: it goes first.
    t.reset();
    timers.reset();
  }
  EXPECT_EQ(token.use_count(), 1);
  {
    // Never polled at all.
    auto timers = std::make_unique<EventTimers>();
    auto t = timers->make_timer();
    timers->every(milliseconds(1), [token] { ++*token; });
    timers->at(*t, Clock::now(), [token] { ++*token; });
    std::this_thread::sleep_for(milliseconds(10));  // both due, neither run
    t.reset();
    timers.reset();
  }
  EXPECT_EQ(token.use_count(), 1);
}

}  // namespace
}  // namespace fedwan::node

namespace fedwan::node {
namespace {

// A period of zero (or one so short the timer is always due) must not keep
// poll() from returning: the loop still reads its sockets, its stop flag
// and its deadlines (a heartbeat of 0.1 ms once spun an aggregator forever).
TEST(EventTimers, AnAlwaysDueTimerCannotHoldPollForever) {
  EventTimers timers;
  int fired = 0;
  timers.every(milliseconds(0), [&] { ++fired; });
  std::this_thread::sleep_for(milliseconds(5));
  for (int i = 0; i < 3; ++i) timers.poll();  // each returns
  EXPECT_GE(fired, 1);
  EXPECT_LE(fired, 3 * EventTimers::kMaxHandlersPerPoll);
}

}  // namespace
}  // namespace fedwan::node
