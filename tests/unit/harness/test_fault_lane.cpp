// The chaos-test harness's fault logic as pure code, without sockets: the
// ZMTP splitter and one faulty direction (FaultLane) on a fake clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/fault_lane.hpp"
#include "harness/zmtp.hpp"

namespace fedwan::testing {
namespace {

using Bytes = std::vector<uint8_t>;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ZMTP 3.x streams built by hand (harness/zmtp.hpp).
using zmtp::cat;
using zmtp::command;
using zmtp::frame;
using zmtp::greeting;

// ---- ZmtpSplitter -------------------------------------------------------------

TEST(ZmtpSplitter, SplitsGreetingCommandsAndWholeMessagesWithoutChangingBytes) {
  const Bytes multipart = cat({frame("part-1", true), frame(std::string(300, 'x'), false)});
  const Bytes stream = cat({greeting(), command("READY", "props"), frame("one"), multipart,
                            command("PING"), frame("long-encoded", false, false, true)});
  for (size_t step : {stream.size(), size_t{1}, size_t{7}}) {
    ZmtpSplitter s(1 << 20);
    std::vector<ZmtpSplitter::Piece> pieces;
    for (size_t i = 0; i < stream.size(); i += step) {
      s.feed(stream.data() + i, std::min(step, stream.size() - i), pieces);
    }
    Bytes joined;
    std::vector<ZmtpSplitter::Kind> kinds;
    for (const auto& p : pieces) {
      joined.insert(joined.end(), p.bytes.begin(), p.bytes.end());
      if (p.kind != ZmtpSplitter::Kind::kGreeting) kinds.push_back(p.kind);
    }
    EXPECT_EQ(joined, stream) << "step " << step;
    using K = ZmtpSplitter::Kind;
    EXPECT_EQ(kinds,
              (std::vector<K>{K::kCommand, K::kMessage, K::kMessage, K::kCommand, K::kMessage}))
        << "step " << step;
    EXPECT_FALSE(s.raw());
    EXPECT_EQ(s.buffered(), 0u);
  }
}

TEST(ZmtpSplitter, GreetingBytesLeaveAsTheyComeBecauseLibzmqWaitsForThePeers) {
  ZmtpSplitter s(1 << 20);
  std::vector<ZmtpSplitter::Piece> pieces;
  const Bytes g = greeting();
  s.feed(g.data(), 11, pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].kind, ZmtpSplitter::Kind::kGreeting);
  EXPECT_EQ(pieces[0].bytes.size(), 11u);
}

TEST(ZmtpSplitter, GarbageReservedBitsAndOversizeFramesTurnRawAndKeepEveryByte) {
  std::mt19937 rng(5);
  Bytes garbage(5000);
  for (auto& b : garbage) b = static_cast<uint8_t>(rng());
  garbage[0] = 0x12;  // not the signature
  const Bytes reserved = cat({greeting(), frame("ok"), Bytes{0x40, 3, 'a', 'b', 'c'}, garbage});
  Bytes oversize = cat({greeting(), Bytes{0x02, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}});
  oversize.insert(oversize.end(), garbage.begin(), garbage.end());
  const Bytes old_version = [] {
    Bytes g = greeting();
    g[10] = 2;
    return cat({g, frame("x")});
  }();
  for (const Bytes& stream : {garbage, reserved, oversize, old_version}) {
    ZmtpSplitter s(4096);
    std::vector<ZmtpSplitter::Piece> pieces;
    s.feed(stream.data(), stream.size() / 2, pieces);
    s.feed(stream.data() + stream.size() / 2, stream.size() - stream.size() / 2, pieces);
    s.finish(pieces);
    Bytes joined;
    for (const auto& p : pieces) joined.insert(joined.end(), p.bytes.begin(), p.bytes.end());
    EXPECT_EQ(joined, stream);
    EXPECT_TRUE(s.raw());
  }
}

TEST(ZmtpSplitter, FindsThePeersRoutingIdInItsReadyCommand) {
  EXPECT_EQ(zmtp::ready_identity(zmtp::ready({{"Socket-Type", "DEALER"}, {"Identity", "eu"}})),
            std::optional<std::string>("eu"));
  EXPECT_EQ(zmtp::ready_identity(zmtp::ready({{"identity", "us"}})),
            std::optional<std::string>("us"));
  EXPECT_FALSE(zmtp::ready_identity(zmtp::ready({{"Socket-Type", "ROUTER"}})));
  EXPECT_FALSE(zmtp::ready_identity(zmtp::ready({{"Identity", ""}})));
  EXPECT_FALSE(zmtp::ready_identity(command("PING", "xxxxxxxxxxxx")));
  Bytes truncated = zmtp::ready({{"Identity", "eu"}});
  truncated.pop_back();
  EXPECT_FALSE(zmtp::ready_identity(truncated));
  EXPECT_FALSE(zmtp::ready_identity(frame("\x05READY")));  // a data frame
}

// ---- FaultLane (fake clock) ---------------------------------------------------

// Everything `lane` releases by `now`, concatenated.
Bytes drain(FaultLane& lane, Clock::time_point now) {
  Bytes out;
  for (auto [p, n] = lane.head(now); n > 0; std::tie(p, n) = lane.head(now)) {
    out.insert(out.end(), p, p + n);
    lane.advance(n);
  }
  return out;
}

// A greeting and READY, then `n` one-frame messages "m<i>".
Bytes numbered_stream(int n) {
  Bytes s = cat({greeting(), command("READY")});
  for (int i = 0; i < n; ++i) s = cat({s, frame("m" + std::to_string(i))});
  return s;
}

TEST(FaultLane, DropsOnlyDataMessagesAndCountsThem) {
  FaultCounters k;
  FaultLane lane(true, 1 << 20, &k);
  FaultSpec spec;
  spec.drop = 1;
  const auto t0 = Clock::now();
  lane.set_faults(spec, 0, t0);
  const Bytes in = cat({numbered_stream(3), command("PING")});
  ASSERT_TRUE(lane.push(in.data(), in.size(), t0));
  EXPECT_EQ(drain(lane, t0), cat({greeting(), command("READY"), command("PING")}));
  EXPECT_EQ(k.dropped.load(), 3u);
  EXPECT_EQ(k.forwarded.load(), 0u);
  EXPECT_EQ(k.commands.load(), 2u);
}

TEST(FaultLane, DuplicatesReordersAndDelaysWithoutReorderingDelayedMessages) {
  const auto t0 = Clock::now();
  {
    FaultCounters k;
    FaultLane lane(true, 1 << 20, &k);
    FaultSpec spec;
    spec.duplicate = 1;
    lane.set_faults(spec, 0, t0);
    const Bytes in = numbered_stream(2);
    ASSERT_TRUE(lane.push(in.data(), in.size(), t0));
    EXPECT_EQ(drain(lane, t0), cat({greeting(), command("READY"), frame("m0"), frame("m0"),
                                    frame("m1"), frame("m1")}));
    EXPECT_EQ(k.duplicated.load(), 2u);
  }
  {
    FaultCounters k;
    FaultLane lane(true, 1 << 20, &k);
    FaultSpec spec;
    spec.reorder = 1;
    spec.reorder_hold_ms = 100;
    lane.set_faults(spec, 0, t0);
    const Bytes in = numbered_stream(3);
    ASSERT_TRUE(lane.push(in.data(), in.size(), t0));
    // m0 held, m1 goes and releases it, m2 held until its hold time runs out.
    EXPECT_EQ(drain(lane, t0), cat({greeting(), command("READY"), frame("m1"), frame("m0")}));
    ASSERT_TRUE(lane.next_due(t0).has_value());
    EXPECT_EQ(*lane.next_due(t0), t0 + 100ms);
    lane.tick(t0 + 100ms);
    EXPECT_EQ(drain(lane, t0 + 100ms), frame("m2"));
    EXPECT_EQ(k.reordered.load(), 2u);
    EXPECT_EQ(k.forwarded.load(), 3u);
  }
  {
    FaultCounters k;
    FaultLane lane(true, 1 << 20, &k);
    FaultSpec spec;
    spec.max_delay_ms = 50;
    lane.set_faults(spec, 0, t0);
    const Bytes in = numbered_stream(20);
    ASSERT_TRUE(lane.push(in.data(), in.size(), t0));
    Bytes got = drain(lane, t0);
    EXPECT_LT(got.size(), in.size());  // some message waits
    got = cat({got, drain(lane, t0 + 50ms)});
    EXPECT_EQ(got, in);  // all of it, in order
  }
}

TEST(FaultLane, SameSeedSameFaults) {
  const auto t0 = Clock::now();
  auto run = [&](uint64_t seed, uint64_t ordinal) {
    FaultCounters k;
    FaultLane lane(true, 1 << 20, &k);
    FaultSpec spec;
    spec.drop = 0.3;
    spec.seed = seed;
    lane.set_faults(spec, ordinal, t0);
    const Bytes in = numbered_stream(1000);
    EXPECT_TRUE(lane.push(in.data(), in.size(), t0));
    return std::make_pair(drain(lane, t0), k.dropped.load());
  };
  const auto a = run(42, 0);
  EXPECT_EQ(a, run(42, 0));
  EXPECT_NE(a.first, run(43, 0).first);
  EXPECT_NE(a.first, run(42, 1).first);
  EXPECT_GT(a.second, 200u);  // ~300 of 1000
  EXPECT_LT(a.second, 400u);
}

TEST(FaultLane, ResetIsReportedToTheCaller) {
  FaultCounters k;
  FaultLane lane(true, 1 << 20, &k);
  FaultSpec spec;
  spec.reset = 1;
  const auto t0 = Clock::now();
  lane.set_faults(spec, 0, t0);
  const Bytes in = numbered_stream(1);
  EXPECT_FALSE(lane.push(in.data(), in.size(), t0));
  EXPECT_EQ(k.resets.load(), 1u);
}

}  // namespace
}  // namespace fedwan::testing
