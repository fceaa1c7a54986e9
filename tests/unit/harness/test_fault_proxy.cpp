// The chaos-test harness's fault-injecting proxy over loopback TCP: with a
// raw echo server (hand-built ZMTP streams, garbage) and with a real ZeroMQ
// DEALER/ROUTER pair. The pure parts are in test_fault_lane.cpp.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "harness/fault_proxy.hpp"
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

TEST(FaultSpec, RejectsProbabilitiesThatCannotBeDrawn) {
  FaultSpec s;
  s.drop = 0.6;
  s.duplicate = 0.6;
  EXPECT_FALSE(s.problem().empty());
  s.duplicate = -0.1;
  EXPECT_FALSE(s.problem().empty());
  s.duplicate = 0.4;
  EXPECT_TRUE(s.problem().empty());
  FaultProxy proxy("127.0.0.1", 1);
  FaultSpec bad;
  bad.reset = 2;
  EXPECT_THROW(proxy.set_faults(bad), std::invalid_argument);
}

// ---- sockets ------------------------------------------------------------------

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// Echoes every byte back on every connection. One poll() thread.
class EchoServer {
 public:
  EchoServer() {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_, 16) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("echo server: cannot listen");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~EchoServer() {
    stop_ = true;
    thread_.join();
    for (int fd : conns_) ::close(fd);
    ::close(listen_);
  }
  int port() const { return port_; }

 private:
  void run() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_, POLLIN, 0}};
      for (int fd : conns_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents) conns_.push_back(::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC));
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        uint8_t buf[65536];
        const ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          ::close(fds[i].fd);
          conns_.erase(std::find(conns_.begin(), conns_.end(), fds[i].fd));
          continue;
        }
        for (ssize_t off = 0; off < n;) {
          const ssize_t k =
              ::send(fds[i].fd, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
          if (k <= 0) break;
          off += k;
        }
      }
    }
  }

  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> conns_;  // echo thread only
  std::thread thread_;
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_in a = loopback(port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const Bytes& b) {
  for (size_t off = 0; off < b.size();) {
    const ssize_t k = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    ASSERT_GT(k, 0);
    off += static_cast<size_t>(k);
  }
}

// Reads until `want` bytes, EOF, an error or the timeout. *closed says whether
// the connection ended (EOF or reset).
Bytes read_for(int fd, size_t want, std::chrono::milliseconds timeout, bool* closed = nullptr) {
  Bytes out;
  const auto deadline = Clock::now() + timeout;
  if (closed) *closed = false;
  while (out.size() < want) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    uint8_t buf[65536];
    const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, want - out.size()), 0);
    if (n <= 0) {
      if (closed) *closed = true;
      break;
    }
    out.insert(out.end(), buf, buf + n);
  }
  return out;
}

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = 3000ms) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

TEST(FaultProxy, PassThroughDeliversEveryByteOfANonZmtpStream) {
  EchoServer echo;
  FaultProxy proxy("127.0.0.1", echo.port());
  Bytes data(1 << 20);
  std::mt19937 rng(1);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  data[0] = 0;  // not a ZMTP signature
  const int fd = connect_to(proxy.port());
  ASSERT_GE(fd, 0);
  std::thread writer([&] { send_all(fd, data); });
  const Bytes got = read_for(fd, data.size(), 4000ms);
  writer.join();
  ::close(fd);
  EXPECT_EQ(got, data);
  EXPECT_TRUE(eventually([&] { return proxy.stats().raw_streams == 2; }));
  // The proxy counts bytes after its send() returned, so the client may have
  // read the last of them first: the counters catch up, they are not ahead.
  EXPECT_TRUE(eventually([&] { return proxy.stats().bytes_to_target == data.size(); }))
      << proxy.stats().bytes_to_target;
  EXPECT_TRUE(eventually([&] { return proxy.stats().bytes_to_client == data.size(); }))
      << proxy.stats().bytes_to_client;
  EXPECT_TRUE(proxy.failure().empty());
}

TEST(FaultProxy, FaultsHitDataMessagesButCommandsPassUntouched) {
  EchoServer echo;
  FaultProxy proxy("127.0.0.1", echo.port());
  FaultSpec spec;
  spec.drop = 1;
  spec.to_client = false;  // the echo comes back unharmed
  proxy.set_faults(spec);
  const int fd = connect_to(proxy.port());
  ASSERT_GE(fd, 0);
  const Bytes in =
      cat({greeting(), command("READY", "x"), frame("a"), frame("b", true),
           frame(std::string(1000, 'c')), command("PING", "ttl"), frame("d", false, false, true)});
  send_all(fd, in);
  const Bytes expected = cat({greeting(), command("READY", "x"), command("PING", "ttl")});
  EXPECT_EQ(read_for(fd, expected.size(), 3000ms), expected);
  EXPECT_TRUE(read_for(fd, 1, 200ms).empty());  // nothing more
  ::close(fd);
  const FaultProxyStats s = proxy.stats();
  EXPECT_EQ(s.messages_dropped, 3u);  // "a", "b"+"ccc...", "d"
  EXPECT_EQ(s.messages_forwarded, 0u);
  EXPECT_EQ(s.commands, 4u);  // two each way
  EXPECT_EQ(s.raw_streams, 0u);
}

TEST(FaultProxy, DuplicatesOnTheWireAndGivesUpParsingOversizeFrames) {
  EchoServer echo;
  FaultProxyOptions o;
  o.target_port = echo.port();
  o.max_message_bytes = 4096;
  FaultProxy proxy(o);
  FaultSpec spec;
  spec.duplicate = 1;
  spec.to_client = false;
  proxy.set_faults(spec);
  const int fd = connect_to(proxy.port());
  ASSERT_GE(fd, 0);
  const Bytes first = cat({greeting(), frame("m")});
  send_all(fd, first);
  const Bytes want = cat({greeting(), frame("m"), frame("m")});
  EXPECT_EQ(read_for(fd, want.size(), 3000ms), want);
  // A frame claiming 2^40 bytes: the rest of the stream passes as bytes.
  Bytes huge{0x02, 0, 0, 0, 1, 0, 0, 0, 0};
  huge.insert(huge.end(), 100, 0xAB);
  const Bytes more = cat({huge, frame("after")});
  send_all(fd, more);
  EXPECT_EQ(read_for(fd, more.size(), 3000ms), more);
  ::close(fd);
  EXPECT_EQ(proxy.stats().messages_duplicated, 1u);
  EXPECT_EQ(proxy.stats().raw_streams, 2u);  // the oversize frame, then its echo
}

TEST(FaultProxy, ResetFaultAndResetConnectionsCloseBothSides) {
  EchoServer echo;
  FaultProxy proxy("127.0.0.1", echo.port());
  {
    const int fd = connect_to(proxy.port());
    ASSERT_GE(fd, 0);
    send_all(fd, greeting());
    EXPECT_EQ(read_for(fd, 64, 3000ms).size(), 64u);
    proxy.reset_connections();
    bool closed = false;
    read_for(fd, 1, 3000ms, &closed);
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  FaultSpec spec;
  spec.reset = 1;
  proxy.set_faults(spec);
  const int fd = connect_to(proxy.port());
  ASSERT_GE(fd, 0);
  send_all(fd, cat({greeting(), frame("boom")}));
  bool closed = false;
  read_for(fd, 1000, 3000ms, &closed);
  EXPECT_TRUE(closed);
  ::close(fd);
  EXPECT_EQ(proxy.stats().resets, 2u);
  EXPECT_TRUE(eventually([&] { return proxy.open_connections() == 0; }));
}

// ---- a real ZeroMQ pair -------------------------------------------------------

// A ROUTER bound on loopback, a proxy in front of it, DEALERs connecting
// through the proxy.
class ZmqThroughProxy {
 public:
  explicit ZmqThroughProxy(const FaultSpec* faults = nullptr)
      : router_(ctx_, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:*");
    const std::string ep = router_.get(zmq::sockopt::last_endpoint);
    proxy_ = std::make_unique<FaultProxy>("127.0.0.1", std::stoi(ep.substr(ep.rfind(':') + 1)));
    if (faults) proxy_->set_faults(*faults);
  }

  zmq::socket_t dealer(const std::string& routing_id = "") {
    zmq::socket_t d(ctx_, zmq::socket_type::dealer);
    d.set(zmq::sockopt::linger, 0);
    if (!routing_id.empty()) d.set(zmq::sockopt::routing_id, routing_id);
    d.set(zmq::sockopt::reconnect_ivl, 50);
    d.connect("tcp://127.0.0.1:" + std::to_string(proxy_->port()));
    return d;
  }

  // The next message's frames after the routing id, or empty on timeout.
  std::vector<std::string> receive(std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return {};
    std::vector<std::string> parts;
    zmq::message_t m;
    (void)router_.recv(m);  // routing id
    while (m.more()) {
      (void)router_.recv(m);
      parts.push_back(m.to_string());
    }
    return parts;
  }

  // Every message until none comes for `quiet`.
  std::vector<std::string> receive_all(std::chrono::milliseconds quiet = 400ms) {
    std::vector<std::string> out;
    for (auto p = receive(quiet); !p.empty(); p = receive(quiet)) out.push_back(p.front());
    return out;
  }

  FaultProxy& proxy() { return *proxy_; }

 private:
  zmq::context_t ctx_;
  zmq::socket_t router_;
  std::unique_ptr<FaultProxy> proxy_;
};

void send_numbered(zmq::socket_t& d, int n, const std::string& prefix = "m") {
  for (int i = 0; i < n; ++i) {
    const std::string s = prefix + std::to_string(i);
    ASSERT_TRUE(d.send(zmq::buffer(s), zmq::send_flags::none));
  }
}

int number_of(const std::string& s) { return std::stoi(s.substr(1)); }

TEST(FaultProxyZmq, PassThroughDeliversEveryMessageInOrder) {
  ZmqThroughProxy z;
  zmq::socket_t d = z.dealer();
  ASSERT_TRUE(d.send(zmq::str_buffer("head"), zmq::send_flags::sndmore));
  ASSERT_TRUE(d.send(zmq::str_buffer("tail"), zmq::send_flags::none));
  EXPECT_EQ(z.receive(3000ms), (std::vector<std::string>{"head", "tail"}));
  send_numbered(d, 300);
  const std::vector<std::string> got = z.receive_all();
  ASSERT_EQ(got.size(), 300u);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], "m" + std::to_string(i));
  const FaultProxyStats s = z.proxy().stats();
  EXPECT_EQ(s.messages_forwarded, 301u);
  EXPECT_GE(s.commands, 2u);  // READY each way
  EXPECT_EQ(s.raw_streams, 0u);
}

// Which of 400 numbered messages arrive through a proxy with `spec` faults on
// the way to the ROUTER, and the proxy's counters.
std::pair<std::vector<std::string>, FaultProxyStats> faulty_run(FaultSpec spec) {
  spec.to_client = false;
  ZmqThroughProxy z(&spec);
  zmq::socket_t d = z.dealer();
  send_numbered(d, 400);
  auto got = z.receive_all();
  return {got, z.proxy().stats()};
}

TEST(FaultProxyZmq, DropsAreSeededAndCounted) {
  FaultSpec spec;
  spec.drop = 0.25;
  spec.seed = 7;
  const auto [got, s] = faulty_run(spec);
  EXPECT_EQ(got.size() + s.messages_dropped, 400u);
  EXPECT_GT(s.messages_dropped, 50u);
  EXPECT_LT(s.messages_dropped, 150u);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end(), [](const auto& a, const auto& b) {
    return number_of(a) < number_of(b);
  }));
  EXPECT_EQ(faulty_run(spec).first, got);  // same seed, same losses
}

TEST(FaultProxyZmq, DuplicatesAndReordersAreSeenByTheReceiver) {
  FaultSpec spec;
  spec.duplicate = 0.1;
  spec.reorder = 0.1;
  spec.seed = 3;
  const auto [got, s] = faulty_run(spec);
  EXPECT_GT(s.messages_duplicated, 0u);
  EXPECT_GT(s.messages_reordered, 0u);
  EXPECT_EQ(got.size(), 400u + s.messages_duplicated);
  std::map<int, int> seen;
  size_t inversions = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    seen[number_of(got[i])] += 1;
    if (i > 0 && number_of(got[i]) < number_of(got[i - 1])) ++inversions;
  }
  EXPECT_EQ(seen.size(), 400u);  // none lost
  size_t twice = 0;
  for (const auto& [n, count] : seen) twice += count == 2;
  EXPECT_EQ(twice, s.messages_duplicated);
  // Each held message comes right after its successor; only one held last,
  // with no successor, goes out on its own (hold time) without an inversion.
  EXPECT_LE(inversions, s.messages_reordered);
  EXPECT_GE(inversions + 1, s.messages_reordered);
}

TEST(FaultProxyZmq, PartitionBlackholesOpenAndNewConnectionsAndHealRestores) {
  ZmqThroughProxy z;
  zmq::socket_t d = z.dealer();
  ASSERT_TRUE(d.send(zmq::str_buffer("before"), zmq::send_flags::none));
  ASSERT_EQ(z.receive(3000ms), std::vector<std::string>{"before"});

  z.proxy().partition();
  send_numbered(d, 5, "lost-");
  EXPECT_TRUE(z.receive(300ms).empty());
  EXPECT_TRUE(eventually([&] { return z.proxy().stats().bytes_blackholed > 0; }));
  EXPECT_EQ(z.proxy().open_connections(), 1u);  // held open, not closed

  zmq::socket_t late = z.dealer();  // connects during the partition
  ASSERT_TRUE(late.send(zmq::str_buffer("late"), zmq::send_flags::none));
  EXPECT_TRUE(eventually([&] { return z.proxy().open_connections() == 2; }));
  EXPECT_TRUE(z.receive(300ms).empty());

  z.proxy().heal();
  EXPECT_EQ(z.proxy().stats().healed_closes, 2u);
  // Both DEALERs reconnect; "late" never crossed, so it is still queued.
  std::vector<std::string> got;
  const bool recovered = eventually(
      [&] {
        (void)d.send(zmq::str_buffer("after"), zmq::send_flags::dontwait);
        for (auto p = z.receive(50ms); !p.empty(); p = z.receive(50ms)) got.push_back(p.front());
        return std::count(got.begin(), got.end(), "after") > 0 &&
               std::count(got.begin(), got.end(), "late") == 1;
      },
      4000ms);
  EXPECT_TRUE(recovered);
  for (const std::string& m : got) EXPECT_EQ(m.rfind("lost-", 0), std::string::npos) << m;
}

TEST(FaultProxyZmq, PartitionsAndFaultsCanNameOnePeer) {
  ZmqThroughProxy z;
  zmq::socket_t eu = z.dealer("eu");
  zmq::socket_t us = z.dealer("us");
  ASSERT_TRUE(eu.send(zmq::str_buffer("eu-0"), zmq::send_flags::none));
  ASSERT_TRUE(us.send(zmq::str_buffer("us-0"), zmq::send_flags::none));
  std::vector<std::string> got = z.receive_all(300ms);
  std::sort(got.begin(), got.end());
  ASSERT_EQ(got, (std::vector<std::string>{"eu-0", "us-0"}));
  EXPECT_EQ(z.proxy().peers(), (std::vector<std::string>{"eu", "us"}));

  z.proxy().partition("eu");
  EXPECT_TRUE(z.proxy().partitioned("eu"));
  EXPECT_FALSE(z.proxy().partitioned("us"));
  ASSERT_TRUE(eu.send(zmq::str_buffer("eu-lost"), zmq::send_flags::none));
  ASSERT_TRUE(us.send(zmq::str_buffer("us-1"), zmq::send_flags::none));
  EXPECT_EQ(z.receive_all(300ms), std::vector<std::string>{"us-1"});

  // Faults for "us" only, while eu heals.
  FaultSpec drop_us;
  drop_us.drop = 1;
  drop_us.peer = "us";
  z.proxy().set_faults(drop_us);
  z.proxy().heal("eu");
  EXPECT_EQ(z.proxy().stats().healed_closes, 1u);
  got.clear();
  const bool eu_back = eventually(
      [&] {
        (void)eu.send(zmq::str_buffer("eu-2"), zmq::send_flags::dontwait);
        (void)us.send(zmq::str_buffer("us-2"), zmq::send_flags::dontwait);
        for (auto p = z.receive(50ms); !p.empty(); p = z.receive(50ms)) got.push_back(p.front());
        return std::count(got.begin(), got.end(), "eu-2") > 0;
      },
      4000ms);
  EXPECT_TRUE(eu_back);
  EXPECT_EQ(std::count(got.begin(), got.end(), "us-2"), 0);
  EXPECT_EQ(std::count(got.begin(), got.end(), "eu-lost"), 0);
  EXPECT_GT(z.proxy().stats().messages_dropped, 0u);
}

}  // namespace
}  // namespace fedwan::testing
