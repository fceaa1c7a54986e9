// The fault-injecting transport decorator (harness/faulty_transport.hpp)
// over the in-process transport: each rule does what it says, to the
// messages it covers and to no other, and the counters show it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "harness/faulty_transport.hpp"
#include "transport/transport.hpp"
#include "wire/frame.hpp"

namespace fedwan::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using transport::Received;
using transport::SendResult;
using transport::Socket;
using transport::SocketOptions;

std::string fresh_endpoint() {
  static std::atomic<int> n{0};
  return "mem://faulty-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

std::string text_of(const Received& r) {
  return std::string(reinterpret_cast<const char*>(r.message.data()), r.message.size());
}

// A frame header of `type` and `round`, as a node sends it (no payload).
std::vector<uint8_t> frame_of(wire::MsgType type, uint64_t round = 0) {
  wire::FrameHeader h;
  h.type = type;
  h.round = round;
  return wire::encode_frame(h, nullptr, 0);
}

// A server and two clients ("a", "b") on one mem:// endpoint, all through
// one FaultyTransport.
class FaultyTransportTest : public ::testing::Test {
 protected:
  SendResult send(Socket& s, const std::string& text, const std::string& peer = "") {
    return s.try_send(peer, reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }
  SendResult send(Socket& s, const std::vector<uint8_t>& bytes, const std::string& peer = "") {
    return s.try_send(peer, bytes.data(), bytes.size());
  }

  // Every message `s` receives within `within`, in order.
  std::vector<std::string> drain(Socket& s, Millis within = 200ms) {
    std::vector<std::string> out;
    const auto deadline = Clock::now() + within;
    while (Clock::now() < deadline) {
      Received r;
      if (s.try_recv(&r)) {
        out.push_back(r.peer + ":" + text_of(r));
        continue;
      }
      (void)transport_.wait({&s}, 10ms);
    }
    return out;
  }

  std::string endpoint_ = fresh_endpoint();
  std::shared_ptr<FaultInjector> faults_ = std::make_shared<FaultInjector>();
  FaultyTransport transport_{transport::make_transport(endpoint_), faults_};
  std::unique_ptr<Socket> server_ = transport_.bind(endpoint_, SocketOptions{});
  std::unique_ptr<Socket> a_ = transport_.connect(endpoint_, "a", SocketOptions{});
  std::unique_ptr<Socket> b_ = transport_.connect(endpoint_, "b", SocketOptions{});
};

TEST_F(FaultyTransportTest, WithoutFaultsEverythingPassesBothWays) {
  ASSERT_EQ(send(*a_, "up"), SendResult::kSent);
  EXPECT_EQ(drain(*server_), std::vector<std::string>{"a:up"});
  ASSERT_EQ(send(*server_, "down", "a"), SendResult::kSent);
  EXPECT_EQ(drain(*a_), std::vector<std::string>{endpoint_ + ":down"});
  const FaultStats st = faults_->stats();
  EXPECT_EQ(st.received, 2u);
  EXPECT_EQ(st.dropped + st.partitioned + st.delayed + st.corrupted + st.duplicated, 0u);
}

TEST_F(FaultyTransportTest, DropCoversOnlyItsConnection) {
  const auto rule = faults_->add(FaultRule::drop().on(endpoint_, "a"));
  ASSERT_EQ(send(*a_, "lost"), SendResult::kSent);  // the sender cannot tell
  ASSERT_EQ(send(*b_, "kept"), SendResult::kSent);
  EXPECT_EQ(drain(*server_), std::vector<std::string>{"b:kept"});
  ASSERT_EQ(send(*server_, "lost too", "a"), SendResult::kSent);
  EXPECT_TRUE(drain(*a_).empty());
  EXPECT_EQ(faults_->hits(rule), 2u);
  EXPECT_EQ(faults_->stats().dropped, 2u);
}

TEST_F(FaultyTransportTest, DropTheFirstNThenLetThroughAndOnlyOneWay) {
  const auto rule = faults_->add(FaultRule::drop().up().first(2));
  ASSERT_EQ(send(*server_, "down", "a"), SendResult::kSent);
  EXPECT_EQ(drain(*a_).size(), 1u);  // the rule covers client -> server only
  for (const char* m : {"1", "2", "3", "4"}) ASSERT_EQ(send(*a_, m), SendResult::kSent);
  EXPECT_EQ(drain(*server_), (std::vector<std::string>{"a:3", "a:4"}));
  EXPECT_EQ(faults_->hits(rule), 2u);
}

TEST_F(FaultyTransportTest, DropByMessageTypePlainOrSealed) {
  faults_->add(FaultRule::drop().of_type(wire::MsgType::kAnchor));
  std::vector<uint8_t> sealed_anchor = frame_of(wire::MsgType::kAnchor, 3);
  sealed_anchor[7] |= 0x80;  // the sealed flag: the header stays readable
  ASSERT_EQ(send(*a_, frame_of(wire::MsgType::kAnchor)), SendResult::kSent);
  ASSERT_EQ(send(*a_, sealed_anchor), SendResult::kSent);
  ASSERT_EQ(send(*a_, frame_of(wire::MsgType::kHeartbeat, 4)), SendResult::kSent);
  ASSERT_EQ(send(*a_, "not a frame"), SendResult::kSent);
  const std::vector<std::string> got = drain(*server_);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1], "a:not a frame");
  EXPECT_EQ(faults_->stats().dropped, 2u);
}

TEST_F(FaultyTransportTest, WherePredicatesAddUp) {
  faults_->add(
      FaultRule::drop().of_type(wire::MsgType::kDelta).where([](const uint8_t* d, size_t n) {
        return frame_header(d, n)->round == 2;
      }));
  for (uint64_t round : {1, 2, 3}) {
    ASSERT_EQ(send(*a_, frame_of(wire::MsgType::kDelta, round)), SendResult::kSent);
  }
  ASSERT_EQ(send(*a_, frame_of(wire::MsgType::kHeartbeat, 2)), SendResult::kSent);
  EXPECT_EQ(drain(*server_).size(), 3u);
  EXPECT_EQ(faults_->stats().dropped, 1u);
}

TEST_F(FaultyTransportTest, ObserveCountsAndChangesNothing) {
  const auto seen = faults_->add(FaultRule::observe().of_type(wire::MsgType::kHello));
  ASSERT_EQ(send(*a_, frame_of(wire::MsgType::kHello)), SendResult::kSent);
  ASSERT_EQ(send(*a_, "other"), SendResult::kSent);
  EXPECT_EQ(drain(*server_).size(), 2u);
  EXPECT_EQ(faults_->hits(seen), 1u);
  const FaultStats st = faults_->stats();
  EXPECT_EQ(st.dropped + st.delayed + st.corrupted + st.duplicated, 0u);
}

TEST(FrameHeader, ReadsPlainAndSealedFramesAndNothingElse) {
  std::vector<uint8_t> f = frame_of(wire::MsgType::kTelemetry, 9);
  ASSERT_TRUE(frame_header(f.data(), f.size()).has_value());
  EXPECT_EQ(frame_header(f.data(), f.size())->type, wire::MsgType::kTelemetry);
  f[7] |= 0x80;
  ASSERT_TRUE(frame_header(f.data(), f.size()).has_value());
  EXPECT_EQ(frame_header(f.data(), f.size())->round, 9u);
  EXPECT_FALSE(frame_header(f.data(), 63).has_value());
  f[0] ^= 1;
  EXPECT_FALSE(frame_header(f.data(), f.size()).has_value());
}

TEST_F(FaultyTransportTest, DelayHoldsAMessageAndWaitWakesWhenItIsDue) {
  faults_->add(FaultRule::delay_by(300ms));
  const auto sent_at = Clock::now();
  ASSERT_EQ(send(*a_, "late"), SendResult::kSent);
  ASSERT_TRUE(transport_.wait({server_.get()}, 2s));  // the inner socket has it
  Received r;
  EXPECT_FALSE(server_->try_recv(&r));  // now held by the decorator
  // Nothing is left in the inner socket: only the delay can end this wait.
  ASSERT_TRUE(transport_.wait({server_.get()}, 5s));
  const auto waited = Clock::now() - sent_at;
  ASSERT_TRUE(server_->try_recv(&r));
  EXPECT_EQ(text_of(r), "late");
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 3s);
  EXPECT_EQ(faults_->stats().delayed, 1u);
}

TEST_F(FaultyTransportTest, WaitStillTimesOutWithADelayedMessagePastTheTimeout) {
  faults_->add(FaultRule::delay_by(2s));
  ASSERT_EQ(send(*a_, "much later"), SendResult::kSent);
  Received r;
  ASSERT_TRUE(transport_.wait({server_.get()}, 2s));
  EXPECT_FALSE(server_->try_recv(&r));
  const auto t0 = Clock::now();
  EXPECT_FALSE(transport_.wait({server_.get()}, 50ms));
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST_F(FaultyTransportTest, DelayKeepsEachPeersOrderButNotOthersWaiting) {
  faults_->add(FaultRule::delay_by(300ms).on(endpoint_, "a").first(1));
  ASSERT_EQ(send(*a_, "a1"), SendResult::kSent);  // delayed
  ASSERT_EQ(send(*a_, "a2"), SendResult::kSent);  // not delayed, but behind a1
  ASSERT_EQ(send(*b_, "b1"), SendResult::kSent);
  EXPECT_EQ(drain(*server_, 150ms), std::vector<std::string>{"b:b1"});
  EXPECT_EQ(drain(*server_, 500ms), (std::vector<std::string>{"a:a1", "a:a2"}));
}

TEST_F(FaultyTransportTest, CorruptFlipsTheChosenByte) {
  faults_->add(FaultRule::corrupt(1, 0x20).first(1));
  faults_->add(FaultRule::corrupt().on(endpoint_, "b"));  // the last byte, low bit
  ASSERT_EQ(send(*a_, "abc"), SendResult::kSent);
  ASSERT_EQ(send(*a_, "abc"), SendResult::kSent);
  ASSERT_EQ(send(*b_, "abc"), SendResult::kSent);
  std::vector<std::string> got = drain(*server_);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"a:aBc", "a:abc", "b:abb"}));
  EXPECT_EQ(faults_->stats().corrupted, 2u);
}

TEST_F(FaultyTransportTest, DuplicateDeliversAnIndependentCopyRightAfter) {
  faults_->add(FaultRule::duplicate().first(1));
  ASSERT_EQ(send(*server_, "twice", "a"), SendResult::kSent);
  ASSERT_EQ(send(*server_, "once", "a"), SendResult::kSent);
  Received first;
  ASSERT_TRUE(transport_.wait({a_.get()}, 2s));
  ASSERT_TRUE(a_->try_recv(&first));
  first.message.data()[0] = 'T';  // as a decrypt in place would
  EXPECT_EQ(text_of(first), "Twice");
  EXPECT_EQ(drain(*a_), (std::vector<std::string>{endpoint_ + ":twice", endpoint_ + ":once"}));
  EXPECT_EQ(faults_->stats().duplicated, 1u);
}

TEST_F(FaultyTransportTest, PartitionCutsBothWaysUntilHealed) {
  faults_->partition(endpoint_, "a");
  EXPECT_TRUE(faults_->partitioned({endpoint_, "a", Way::kUp}));
  EXPECT_FALSE(faults_->partitioned({endpoint_, "b", Way::kUp}));
  ASSERT_EQ(send(*a_, "cut"), SendResult::kSent);
  ASSERT_EQ(send(*b_, "fine"), SendResult::kSent);
  ASSERT_EQ(send(*server_, "cut", "a"), SendResult::kSent);
  EXPECT_EQ(drain(*server_), std::vector<std::string>{"b:fine"});
  EXPECT_TRUE(drain(*a_).empty());
  EXPECT_EQ(faults_->stats().partitioned, 2u);
  faults_->heal(endpoint_, "a");
  ASSERT_EQ(send(*a_, "back"), SendResult::kSent);
  EXPECT_EQ(drain(*server_), std::vector<std::string>{"a:back"});
}

TEST_F(FaultyTransportTest, PartitionOfAnEndpointCutsItsLaterClientsToo) {
  faults_->partition(endpoint_);
  auto late = transport_.connect(endpoint_, "late", SocketOptions{});
  ASSERT_EQ(send(*late, "x"), SendResult::kSent);
  ASSERT_EQ(send(*b_, "y"), SendResult::kSent);
  EXPECT_TRUE(drain(*server_).empty());
  faults_->heal_all();
  ASSERT_EQ(send(*late, "z"), SendResult::kSent);
  EXPECT_EQ(drain(*server_), std::vector<std::string>{"late:z"});
}

TEST_F(FaultyTransportTest, ClearedRulesStopButKeepTheirCounts) {
  const auto rule = faults_->add(FaultRule::drop());
  ASSERT_EQ(send(*a_, "1"), SendResult::kSent);
  EXPECT_TRUE(drain(*server_).empty());
  faults_->clear_rules();
  ASSERT_EQ(send(*a_, "2"), SendResult::kSent);
  EXPECT_EQ(drain(*server_), std::vector<std::string>{"a:2"});
  EXPECT_EQ(faults_->hits(rule), 1u);
  EXPECT_EQ(faults_->stats().dropped, 1u);
}

TEST_F(FaultyTransportTest, WaitRefusesSocketsOfAnotherTransport) {
  auto plain = transport::make_transport(endpoint_);
  auto other = plain->connect(endpoint_, "c", SocketOptions{});
  EXPECT_THROW(transport_.wait({other.get()}, 10ms), TransportError);
}

TEST(TransportDecorator, WrapsWhatMakeTransportMakesWhileItIsSet) {
  {
    ScopedTransportFaults faults;
    auto t = transport::make_transport("mem://x");
    EXPECT_NE(dynamic_cast<FaultyTransport*>(t.get()), nullptr);
  }
  auto t = transport::make_transport("mem://x");
  EXPECT_EQ(dynamic_cast<FaultyTransport*>(t.get()), nullptr);

  std::vector<std::string> seen;
  transport::set_transport_decorator(
      [&seen](std::unique_ptr<transport::Transport> inner, const std::string& endpoint) {
        seen.push_back(endpoint);
        return inner;
      });
  (void)transport::make_transport("mem://y");
  transport::set_transport_decorator({});
  (void)transport::make_transport("mem://z");
  EXPECT_EQ(seen, std::vector<std::string>{"mem://y"});
}

TEST(TransportDecorator, FaultsReachNodesThatOnlyCallMakeTransport) {
  ScopedTransportFaults faults;
  faults->add(FaultRule::drop().first(1));
  const std::string ep = fresh_endpoint();
  auto server_side = transport::make_transport(ep);
  auto client_side = transport::make_transport(ep);
  auto server = server_side->bind(ep, SocketOptions{});
  auto client = client_side->connect(ep, "c", SocketOptions{});
  for (const std::string& m : std::vector<std::string>{"first", "second"}) {
    ASSERT_EQ(client->try_send("", bytes_of(m).data(), m.size()), SendResult::kSent);
  }
  Received r;
  ASSERT_TRUE(server_side->wait({server.get()}, 2s));
  const auto deadline = Clock::now() + 2s;
  while (!server->try_recv(&r) && Clock::now() < deadline) {
    (void)server_side->wait({server.get()}, 10ms);
  }
  EXPECT_EQ(text_of(r), "second");
  EXPECT_EQ(faults->stats().dropped, 1u);
}

}  // namespace
}  // namespace fedwan::testing
