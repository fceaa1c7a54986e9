#include "transport/handshake_guard.hpp"

#include <gtest/gtest.h>

#include <string>

namespace fedwan::transport {
namespace {

using Clock = HandshakeGuard::Clock;
using std::chrono::milliseconds;
using Verdict = HandshakeGuard::Verdict;

HandshakeGuard guard(size_t total, size_t per_source, milliseconds timeout = milliseconds(1000)) {
  HandshakeGuard::Options o;
  o.max_pending = total;
  o.max_per_source = per_source;
  o.timeout = timeout;
  return HandshakeGuard(o);
}

TEST(HandshakeGuard, CapsHandshakesInAllAndPerSource) {
  HandshakeGuard g = guard(4, 2);
  const auto t = Clock::now();
  EXPECT_EQ(g.start("a", "10.0.0.1", t), Verdict::kAdmit);
  EXPECT_EQ(g.start("b", "10.0.0.1", t), Verdict::kAdmit);
  EXPECT_EQ(g.start("c", "10.0.0.1", t), Verdict::kTooManyFromSource);
  EXPECT_EQ(g.start("c", "10.0.0.2", t), Verdict::kAdmit);
  EXPECT_EQ(g.start("d", "10.0.0.3", t), Verdict::kAdmit);
  EXPECT_EQ(g.start("e", "10.0.0.4", t), Verdict::kTooMany);
  EXPECT_EQ(g.pending_count(), 4u);
  g.finish("a");
  EXPECT_EQ(g.from_source("10.0.0.1"), 1u);
  EXPECT_EQ(g.start("e", "10.0.0.1", t), Verdict::kAdmit);
}

TEST(HandshakeGuard, APeerStartingAgainReplacesItsOwnHandshake) {
  HandshakeGuard g = guard(1, 1);
  const auto t = Clock::now();
  EXPECT_EQ(g.start("site-a", "h", t), Verdict::kAdmit);
  EXPECT_EQ(g.start("site-a", "h", t), Verdict::kAdmit);  // not counted twice
  EXPECT_EQ(g.pending_count(), 1u);
  EXPECT_EQ(g.from_source("h"), 1u);
}

TEST(HandshakeGuard, HandshakesTimeOutAndFreeTheirPlaces) {
  HandshakeGuard g = guard(2, 2, milliseconds(100));
  const auto t = Clock::now();
  EXPECT_EQ(g.start("a", "h", t), Verdict::kAdmit);
  EXPECT_EQ(g.start("b", "h", t + milliseconds(60)), Verdict::kAdmit);
  EXPECT_TRUE(g.expire(t + milliseconds(99)).empty());
  EXPECT_EQ(g.expire(t + milliseconds(100)), std::vector<std::string>{"a"});
  EXPECT_FALSE(g.pending("a"));
  EXPECT_EQ(g.start("c", "h", t + milliseconds(100)), Verdict::kAdmit);
  EXPECT_EQ(g.expire(t + milliseconds(1000)).size(), 2u);
  EXPECT_EQ(g.pending_count(), 0u);
  EXPECT_EQ(g.from_source("h"), 0u);
}

}  // namespace
}  // namespace fedwan::transport
