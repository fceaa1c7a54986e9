// TCP congestion control per socket (SocketOptions::tcp_congestion) over
// ZeroMQ on loopback TCP: set on both ends' connections, reconnections
// included; left alone when none is asked for ("system" in a topology); a
// name the kernel lacks falls back to the host's default, with one warning
// per socket, and never fails the link. What a socket reports is checked
// against the kernel's own view of this process's connections.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/error.hpp"
#include "harness/loopback_sockets.hpp"
#include "harness/process.hpp"
#include "transport/transport.hpp"

namespace fedwan::transport {
namespace {

using namespace std::chrono_literals;

// A loopback port nothing listens on right now.
int free_port() { return fedwan::testing::free_tcp_port(); }

// A /proc file's first line.
std::string proc_words(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string host_default() { return proc_words("/proc/sys/net/ipv4/tcp_congestion_control"); }

// The congestion control the kernel reports for this process's connected
// loopback TCP sockets on `port`: the client ends (peer port == port) or the
// server ends (local port == port). One entry per connection.
std::vector<std::string> kernel_view(int port, bool server_end) {
  std::vector<std::string> out;
  fedwan::testing::for_each_loopback_socket(port, server_end, [&](int fd) {
    char name[16] = {};
    socklen_t nlen = sizeof name;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &nlen) == 0) {
      out.emplace_back(name, ::strnlen(name, nlen));
    }
  });
  return out;
}

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

// A client and a server on one loopback port, both with `congestion`.
struct Link {
  explicit Link(const std::string& congestion, uint32_t long_rtt_us = 5000) {
    options.tcp_congestion = congestion;
    options.long_link_rtt_us = long_rtt_us;
    server = transport->bind(endpoint, options);
    client = transport->connect(endpoint, "site-a", options);
  }

  // A message each way; the link works.
  void exchange(const std::string& tag) {
    ASSERT_EQ(send(*client, "", "up " + tag), SendResult::kSent);
    Received in;
    ASSERT_TRUE(receive(*transport, *server, &in));
    EXPECT_EQ(in.peer, "site-a");
    EXPECT_EQ(text_of(in.message), "up " + tag);
    ASSERT_EQ(send(*server, "site-a", "down " + tag), SendResult::kSent);
    Received back;
    ASSERT_TRUE(receive(*transport, *client, &back));
    EXPECT_EQ(text_of(back.message), "down " + tag);
  }

  // Uses `s` (as a node's loop does) until it reports `want`, at most 2 s;
  // what it reports then.
  std::string settle(Socket& s, const std::string& want) {
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (s.congestion_control() != want && std::chrono::steady_clock::now() < deadline) {
      Received ignored;
      (void)s.try_recv(&ignored);
      (void)transport->wait({&s}, 20ms);
    }
    return s.congestion_control();
  }

  int port = free_port();
  std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  std::unique_ptr<Transport> transport = make_transport(endpoint);
  SocketOptions options;
  std::unique_ptr<Socket> server;
  std::unique_ptr<Socket> client;
};

TEST(TcpCongestion, BothEndsOfALinkUseTheOneAskedFor) {
  // reno is built into every kernel and allowed to every process.
  Link link("reno");
  link.exchange("1");
  EXPECT_EQ(link.settle(*link.client, "reno"), "reno");
  EXPECT_EQ(link.settle(*link.server, "reno"), "reno");
  // What the sockets report is what the kernel has for the connection.
  EXPECT_EQ(kernel_view(link.port, false), std::vector<std::string>{"reno"});
  EXPECT_EQ(kernel_view(link.port, true), std::vector<std::string>{"reno"});
}

// TCP_NOTSENT_LOWAT of this process's loopback connections on `port`.
std::vector<int> unsent_caps(int port, bool server_end) {
  std::vector<int> out;
  fedwan::testing::for_each_loopback_socket(port, server_end, [&](int fd) {
    int cap = -1;
    socklen_t len = sizeof cap;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &cap, &len) == 0) out.push_back(cap);
  });
  return out;
}

// A server tells which messages came from a host with a long connection
// there (its handshake's round trip at or over long_link_rtt_us): a child's
// parent sends in pieces to it then (links.hpp).
TEST(TcpCongestion, AServerSaysWhichMessagesCameOverALongConnection) {
  for (const uint32_t long_rtt_us : {0u, 5000u}) {
    Link link("", long_rtt_us);
    ASSERT_EQ(send(*link.client, "", "hello"), SendResult::kSent);
    Received in;
    ASSERT_TRUE(receive(*link.transport, *link.server, &in));
    EXPECT_EQ(in.long_link, long_rtt_us == 0) << "loopback is short, unless 0 us is long";
  }
}

TEST(TcpCongestion, OnlyLongConnectionsKeepTheirUnsentBytesCapped) {
  // Loopback is short (tens of microseconds there and back): no cap.
  Link short_link("reno");
  short_link.exchange("short");
  EXPECT_EQ(short_link.settle(*short_link.client, "reno"), "reno");
  EXPECT_EQ(short_link.settle(*short_link.server, "reno"), "reno");
  EXPECT_EQ(unsent_caps(short_link.port, false), std::vector<int>{0});
  EXPECT_EQ(unsent_caps(short_link.port, true), std::vector<int>{0});
  // Taken as long (from 0 us there and back): both ends keep at most 32 KiB
  // unsent.
  Link long_link("reno", 0);
  long_link.exchange("long");
  EXPECT_EQ(long_link.settle(*long_link.client, "reno"), "reno");
  EXPECT_EQ(long_link.settle(*long_link.server, "reno"), "reno");
  EXPECT_EQ(unsent_caps(long_link.port, false), std::vector<int>{32 << 10});
  EXPECT_EQ(unsent_caps(long_link.port, true), std::vector<int>{32 << 10});
}

TEST(TcpCongestion, AReconnectedLinkUsesItToo) {
  Link link("reno");
  link.exchange("before");
  // The server goes and comes back on the same port: the client's new
  // connection, and the new server's, get it as the first ones did.
  link.server.reset();
  // ZeroMQ closes the old listener in its own thread: bind once it has.
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (!link.server) {
    try {
      link.server = link.transport->bind(link.endpoint, link.options);
    } catch (const TransportError&) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "port still in use";
      std::this_thread::sleep_for(10ms);
    }
  }
  ASSERT_EQ(link.settle(*link.server, "reno"), "reno");
  link.exchange("after");
  EXPECT_EQ(link.settle(*link.client, "reno"), "reno");
  EXPECT_EQ(kernel_view(link.port, false), std::vector<std::string>{"reno"});
  EXPECT_EQ(kernel_view(link.port, true), std::vector<std::string>{"reno"});
}

TEST(TcpCongestion, NoneAskedForLeavesTheHostsDefault) {
  const std::string host = host_default();
  ASSERT_FALSE(host.empty());
  Link link("");  // what a topology's "system" becomes
  link.exchange("1");
  EXPECT_EQ(link.client->congestion_control(), "");
  EXPECT_EQ(link.server->congestion_control(), "");
  EXPECT_EQ(kernel_view(link.port, false), std::vector<std::string>{host});
  EXPECT_EQ(kernel_view(link.port, true), std::vector<std::string>{host});
}

TEST(TcpCongestion, AnUnknownOneWarnsOncePerSocketAndKeepsTheHostsDefault) {
  const std::string host = host_default();
  ASSERT_FALSE(host.empty());
  ::testing::internal::CaptureStderr();
  std::string log;
  {
    Link link("nosuchcc");
    link.exchange("1");
    EXPECT_EQ(link.settle(*link.client, host), host);
    EXPECT_EQ(link.settle(*link.server, host), host);
    EXPECT_EQ(kernel_view(link.port, false), std::vector<std::string>{host});
    EXPECT_EQ(kernel_view(link.port, true), std::vector<std::string>{host});
    // A second connection from the same kind of client to the server (as
    // a site's reconnect makes): no further warning for either link.
    auto second = link.transport->connect(link.endpoint, "site-b", link.options);
    ASSERT_EQ(send(*second, "", "hi"), SendResult::kSent);
    Received in;
    ASSERT_TRUE(receive(*link.transport, *link.server, &in));
    EXPECT_EQ(in.peer, "site-b");
    EXPECT_EQ(link.settle(*second, host), host);
  }
  log = ::testing::internal::GetCapturedStderr();
  size_t warnings = 0;
  for (size_t at = log.find("'nosuchcc' could not be set"); at != std::string::npos;
       at = log.find("'nosuchcc' could not be set", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 2u) << log;  // the server's link and the clients' link, once each
  EXPECT_NE(log.find("use the host's default '" + host + "' instead"), std::string::npos) << log;
  EXPECT_NE(log.find("ENOENT"), std::string::npos) << log;
  EXPECT_NE(log.find("modprobe tcp_nosuchcc"), std::string::npos) << log;
  EXPECT_NE(log.find("tcp_allowed_congestion_control"), std::string::npos) << log;
}

// Needs an algorithm the kernel has but does not allow to this process: run
// unprivileged (without CAP_NET_ADMIN) on a host that has one.
TEST(TcpCongestion, ANotAllowedOneSaysHowToAllowIt) {
  const std::string available = proc_words("/proc/sys/net/ipv4/tcp_available_congestion_control");
  const std::string allowed = proc_words("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
  std::string refused;
  for (size_t at = 0; at < available.size();) {
    const size_t end = available.find(' ', at);
    const std::string name = available.substr(at, end - at);
    if ((" " + allowed + " ").find(" " + name + " ") == std::string::npos) refused = name;
    at = end == std::string::npos ? available.size() : end + 1;
  }
  if (refused.empty() || ::geteuid() == 0) {
    GTEST_SKIP() << "every available algorithm is allowed here, or the process is privileged";
  }
  const std::string host = host_default();
  ::testing::internal::CaptureStderr();
  {
    Link link(refused);
    link.exchange("1");
    EXPECT_EQ(link.settle(*link.client, host), host);
    EXPECT_EQ(link.settle(*link.server, host), host);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("'" + refused + "' could not be set (EPERM"), std::string::npos) << log;
  EXPECT_NE(log.find("sysctl -w net.ipv4.tcp_allowed_congestion_control=\"" + allowed + " " +
                     refused + "\""),
            std::string::npos)
      << log;
}

TEST(TcpCongestion, TheInProcessTransportIgnoresIt) {
  const std::string endpoint = "mem://tcp-congestion-test-" + std::to_string(::getpid());
  auto transport = make_transport(endpoint);
  SocketOptions options;
  options.tcp_congestion = "reno";
  auto server = transport->bind(endpoint, options);
  auto client = transport->connect(endpoint, "site-a", options);
  ASSERT_EQ(send(*client, "", "hello"), SendResult::kSent);
  Received in;
  ASSERT_TRUE(receive(*transport, *server, &in));
  EXPECT_EQ(text_of(in.message), "hello");
  EXPECT_EQ(client->congestion_control(), "");
  EXPECT_EQ(server->congestion_control(), "");
}

}  // namespace
}  // namespace fedwan::transport
