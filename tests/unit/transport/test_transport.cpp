// The semantics transport.hpp promises, checked on every implementation
// (ZeroMQ over tcp:// on loopback, in-process over mem://): what the links above rely on.
// The tests' fault-injecting decorator, with no fault set, keeps them too
// ("faulty": over mem://).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/error.hpp"
#include "harness/faulty_transport.hpp"
#include "harness/process.hpp"
#include "transport/transport.hpp"

namespace fedwan::transport {
namespace {

using namespace std::chrono_literals;

// A loopback port nothing listens on right now.
int free_port() { return fedwan::testing::free_tcp_port(); }

std::string fresh_endpoint(const std::string& kind) {
  static std::atomic<int> n{0};
  if (kind == "mem" || kind == "faulty") {
    return "mem://transport-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  }
  return "tcp://127.0.0.1:" + std::to_string(free_port());
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const Message& m) {
  return std::string(reinterpret_cast<const char*>(m.data()), m.size());
}

SendResult send(Socket& s, const std::string& peer, const std::string& text) {
  return s.try_send(peer, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// Waits for one message, at most 2 s.
bool receive(Transport& t, Socket& s, Received* out) {
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (s.try_recv(out)) return true;
    (void)t.wait({&s}, 50ms);
  }
  return false;
}

std::unique_ptr<Transport> transport_for(const std::string& kind, const std::string& endpoint) {
  if (kind != "faulty") return make_transport(endpoint);
  return std::make_unique<testing::FaultyTransport>(make_transport(endpoint),
                                                    std::make_shared<testing::FaultInjector>());
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string endpoint_ = fresh_endpoint(GetParam());
  std::unique_ptr<Transport> transport_ = transport_for(GetParam(), endpoint_);
  SocketOptions options_;
};

TEST_P(TransportTest, MessagesGoBothWaysUnderTheClientsRoutingId) {
  auto server = transport_->bind(endpoint_, options_);
  auto client = transport_->connect(endpoint_, "site-a", options_);
  ASSERT_EQ(send(*client, "", "hello"), SendResult::kSent);
  Received in;
  ASSERT_TRUE(receive(*transport_, *server, &in));
  EXPECT_EQ(in.peer, "site-a");
  EXPECT_EQ(text_of(in.message), "hello");
  EXPECT_FALSE(in.malformed);
  ASSERT_EQ(send(*server, "site-a", "welcome"), SendResult::kSent);
  Received back;
  ASSERT_TRUE(receive(*transport_, *client, &back));
  EXPECT_EQ(text_of(back.message), "welcome");
}

TEST_P(TransportTest, AClientMayConnectBeforeTheServerBinds) {
  auto client = transport_->connect(endpoint_, "early", options_);
  ASSERT_EQ(send(*client, "", "waited"), SendResult::kSent);
  auto server = transport_->bind(endpoint_, options_);
  Received in;
  ASSERT_TRUE(receive(*transport_, *server, &in));
  EXPECT_EQ(in.peer, "early");
  EXPECT_EQ(text_of(in.message), "waited");
}

TEST_P(TransportTest, MessagesOfOnePeerArriveInOrder) {
  auto server = transport_->bind(endpoint_, options_);
  auto client = transport_->connect(endpoint_, "c", options_);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(send(*client, "", std::to_string(i)), SendResult::kSent);
  for (int i = 0; i < 5; ++i) {
    Received in;
    ASSERT_TRUE(receive(*transport_, *server, &in));
    EXPECT_EQ(text_of(in.message), std::to_string(i));
  }
}

TEST_P(TransportTest, ASendToNoConnectedPeerSaysSo) {
  auto server = transport_->bind(endpoint_, options_);
  EXPECT_EQ(send(*server, "nobody", "x"), SendResult::kNoPeer);
}

TEST_P(TransportTest, ASendBeyondTheWindowIsRefusedNotQueued) {
  options_.window = 2;
  auto server = transport_->bind(endpoint_, options_);
  auto client = transport_->connect(endpoint_, "c", options_);
  const std::string big(64 << 10, 'x');
  int sent = 0;
  // ZeroMQ counts its window per pipe on both ends and the kernel buffers
  // some more, so only the in-process window is exact.
  while (sent < 10000 && send(*client, "", big) == SendResult::kSent) ++sent;
  EXPECT_LT(sent, 10000);
  if (GetParam() != "zmq") {
    EXPECT_EQ(sent, 2);
    EXPECT_FALSE(client->writable());
  }
  Received in;
  ASSERT_TRUE(receive(*transport_, *server, &in));
  EXPECT_TRUE(transport_->wait({client.get()}, 2s, /*for_send=*/true));
}

TEST_P(TransportTest, AReconnectingClientTakesItsRoutingIdOver) {
  auto server = transport_->bind(endpoint_, options_);
  auto first = transport_->connect(endpoint_, "site", options_);
  ASSERT_EQ(send(*first, "", "one"), SendResult::kSent);
  Received in;
  ASSERT_TRUE(receive(*transport_, *server, &in));
  auto second = transport_->connect(endpoint_, "site", options_);
  ASSERT_EQ(send(*second, "", "two"), SendResult::kSent);
  ASSERT_TRUE(receive(*transport_, *server, &in));
  EXPECT_EQ(text_of(in.message), "two");
  ASSERT_EQ(send(*server, "site", "to the new one"), SendResult::kSent);
  Received back;
  ASSERT_TRUE(receive(*transport_, *second, &back));
  EXPECT_EQ(text_of(back.message), "to the new one");
}

// A frame whose producer throws (sealing for a child whose session is not
// up, say) must not leave half a message behind: the next message, sent to
// another child, must reach that child and nothing of it the first one.
// (Over ZeroMQ the routing frame went out before the producer ran, and the
// next message became its body: a handshake reply meant for one child
// reached another, whose TLS then failed with "invalid session id".)
TEST_P(TransportTest, AProducerThatThrowsLeavesTheNextMessageToItsOwnPeer) {
  auto server = transport_->bind(endpoint_, options_);
  auto a = transport_->connect(endpoint_, "site-a", options_);
  auto b = transport_->connect(endpoint_, "site-b", options_);
  Received in;
  ASSERT_EQ(send(*a, "", "a here"), SendResult::kSent);
  ASSERT_TRUE(receive(*transport_, *server, &in));
  ASSERT_EQ(send(*b, "", "b here"), SendResult::kSent);
  ASSERT_TRUE(receive(*transport_, *server, &in));
  EXPECT_THROW((void)server->try_send_with(
                   "site-a", []() -> std::vector<uint8_t> { throw std::runtime_error("no"); }),
               std::runtime_error);
  ASSERT_EQ(send(*server, "site-b", "for b"), SendResult::kSent);
  ASSERT_EQ(send(*server, "site-a", "for a"), SendResult::kSent);
  Received at_b;
  ASSERT_TRUE(receive(*transport_, *b, &at_b));
  EXPECT_EQ(text_of(at_b.message), "for b");
  EXPECT_FALSE(at_b.malformed);
  // site-a gets at most an empty message that ended the broken one, then its own.
  Received at_a;
  ASSERT_TRUE(receive(*transport_, *a, &at_a));
  if (at_a.message.size() == 0) ASSERT_TRUE(receive(*transport_, *a, &at_a));
  EXPECT_EQ(text_of(at_a.message), "for a");
  EXPECT_FALSE(at_a.malformed);
}

TEST_P(TransportTest, WaitTimesOutAndWakesForAMessageFromAnotherThread) {
  auto server = transport_->bind(endpoint_, options_);
  EXPECT_FALSE(transport_->wait({server.get()}, 20ms));
  std::thread sender([&] {
    auto client = make_transport(endpoint_)->connect(endpoint_, "t", options_);
    std::this_thread::sleep_for(50ms);
    ASSERT_EQ(send(*client, "", "wake"), SendResult::kSent);
    // Keep the client until the message is read (ZeroMQ's linger covers it).
    std::this_thread::sleep_for(200ms);
  });
  EXPECT_TRUE(transport_->wait({server.get()}, 5s));
  Received in;
  EXPECT_TRUE(receive(*transport_, *server, &in));
  sender.join();
}

TEST_P(TransportTest, BindingAnEndpointInUseFails) {
  auto server = transport_->bind(endpoint_, options_);
  EXPECT_THROW(transport_->bind(endpoint_, options_), TransportError);
}

INSTANTIATE_TEST_SUITE_P(Each, TransportTest, ::testing::Values("zmq", "mem", "faulty"),
                         [](const auto& info) { return info.param; });

TEST(MemTransport, AMessageOverTheLimitIsDroppedOnReceipt) {
  const std::string ep = fresh_endpoint("mem");
  auto t = make_transport(ep);
  SocketOptions o;
  o.max_message_bytes = 16;
  auto server = t->bind(ep, o);
  auto client = t->connect(ep, "c", SocketOptions{});
  ASSERT_EQ(send(*client, "", std::string(17, 'x')), SendResult::kSent);
  Received in;
  ASSERT_TRUE(receive(*t, *server, &in));
  EXPECT_TRUE(in.malformed);
  EXPECT_EQ(in.message.size(), 0u);
}

TEST(MemTransport, RefusesEndpointsOfOtherSchemes) {
  auto t = make_transport("mem://x");
  EXPECT_THROW(t->bind("tcp://127.0.0.1:1", SocketOptions{}), TransportError);
  EXPECT_THROW(t->connect("mem://", "c", SocketOptions{}), TransportError);
}

}  // namespace
}  // namespace fedwan::transport
