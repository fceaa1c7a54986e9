// Fixed TCP socket buffers (SocketOptions::socket_buffer_bytes, the
// topology's socket_buffer_bytes): set on both ends' connections, checked
// against the kernel's view of this process's sockets; unset, the kernel
// autotunes; a size above the kernel's caps is warned about with the fix.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "fedwan/topology.hpp"
#include "harness/loopback_sockets.hpp"
#include "harness/process.hpp"
#include "node/node_config.hpp"
#include "transport/socket_buffers.hpp"
#include "transport/transport.hpp"

namespace fedwan::transport {
namespace {

using namespace std::chrono_literals;

int64_t proc_value(const char* path) {
  std::ifstream in(path);
  int64_t v = 0;
  in >> v;
  return v;
}

// SO_SNDBUF and SO_RCVBUF of every connection of `port` on one end.
std::vector<std::pair<int, int>> buffers(int port, bool server_end) {
  std::vector<std::pair<int, int>> out;
  fedwan::testing::for_each_loopback_socket(port, server_end, [&](int fd) {
    int snd = 0, rcv = 0;
    socklen_t len = sizeof snd;
    ::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len);
    len = sizeof rcv;
    ::getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len);
    out.emplace_back(snd, rcv);
  });
  return out;
}

// Both ends of a loopback link with `bytes` of socket buffer, once a
// message went each way; {client ends, server ends}.
std::pair<std::vector<std::pair<int, int>>, std::vector<std::pair<int, int>>> link_buffers(
    int bytes) {
  const int port = fedwan::testing::free_tcp_port();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  std::unique_ptr<Transport> t = make_transport(endpoint);
  SocketOptions o;
  o.socket_buffer_bytes = bytes;
  std::unique_ptr<Socket> server = t->bind(endpoint, o);
  std::unique_ptr<Socket> client = t->connect(endpoint, "site-a", o);
  const std::string text = "hello";
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (client->try_send("", reinterpret_cast<const uint8_t*>(text.data()), text.size()) !=
             SendResult::kSent &&
         std::chrono::steady_clock::now() < deadline) {
    (void)t->wait({client.get()}, 20ms);
  }
  Received in;
  while (!server->try_recv(&in) && std::chrono::steady_clock::now() < deadline) {
    (void)t->wait({server.get()}, 20ms);
  }
  EXPECT_EQ(in.peer, "site-a");
  return {buffers(port, false), buffers(port, true)};
}

TEST(SocketBuffers, BothEndsOfALinkHaveTheSizeAskedFor) {
  const int64_t cap = std::min(proc_value("/proc/sys/net/core/wmem_max"),
                               proc_value("/proc/sys/net/core/rmem_max"));
  const int bytes = static_cast<int>(std::min<int64_t>(128 << 10, cap));
  const auto [clients, servers] = link_buffers(bytes);
  ASSERT_EQ(clients.size(), 1u);
  ASSERT_EQ(servers.size(), 1u);
  // Linux reports twice what was set (its bookkeeping overhead).
  for (const auto& [snd, rcv] : {clients[0], servers[0]}) {
    EXPECT_EQ(snd, 2 * bytes);
    EXPECT_EQ(rcv, 2 * bytes);
  }
}

TEST(SocketBuffers, UnsetLeavesTheKernelsAutotuning) {
  const auto [clients, servers] = link_buffers(0);
  ASSERT_EQ(clients.size(), 1u);
  // Autotuned sockets start at net.ipv4.tcp_wmem's middle value and grow
  // up to its maximum as the connection needs: not a fixed size.
  std::ifstream wmem("/proc/sys/net/ipv4/tcp_wmem");
  int64_t lo = 0, mid = 0, hi = 0;
  wmem >> lo >> mid >> hi;
  EXPECT_NE(clients[0].first, 2 * (128 << 10));
  if (hi > 0) EXPECT_LE(clients[0].first, 2 * hi);
}

TEST(SocketBuffers, ASizeAboveTheKernelsCapsIsWarnedAboutWithTheFix) {
  EXPECT_EQ(socket_buffer_warning(4 << 20, 8 << 20, 8 << 20), "");
  EXPECT_EQ(socket_buffer_warning(4 << 20, std::nullopt, std::nullopt), "");
  const std::string w = socket_buffer_warning(4 << 20, 212992, 8 << 20);
  for (const char* part : {"socket_buffer_bytes 4194304 is above net.core.wmem_max 212992",
                           "caps the TCP buffers at 212992 bytes",
                           "sysctl -w net.core.wmem_max=4194304 net.core.rmem_max=4194304",
                           "socket_buffer_bytes: 0"}) {
    EXPECT_NE(w.find(part), std::string::npos) << part << "\n" << w;
  }
  const std::string both = socket_buffer_warning(4 << 20, 212992, 212992);
  EXPECT_NE(both.find("net.core.wmem_max 212992 and net.core.rmem_max 212992"), std::string::npos)
      << both;
}

TEST(SocketBuffers, ANodeTakesItsOwnSizeElseTheFederations) {
  const Topology topo = Topology::parse(
      "job: buffers\n"
      "federation: {socket_buffer_bytes: 4194304}\n"
      "nodes:\n"
      "  - {id: root, role: root, endpoint: \"tcp://127.0.0.1:7000\"}\n"
      "  - {id: eu, role: region, parent: root, endpoint: \"tcp://127.0.0.1:7001\", "
      "socket_buffer_bytes: 0}\n"
      "  - {id: a, role: site, parent: eu, socket_buffer_bytes: 65536}\n"
      "  - {id: b, role: site, parent: eu}\n");
  EXPECT_EQ(node::NodeConfig(topo, topo.root(), {}).link.socket_buffer_bytes, 4 << 20);
  EXPECT_EQ(node::NodeConfig(topo, topo.node("eu"), {}).link.socket_buffer_bytes, 0);
  EXPECT_EQ(node::NodeConfig(topo, topo.node("a"), {}).link.socket_buffer_bytes, 65536);
  EXPECT_EQ(node::NodeConfig(topo, topo.node("b"), {}).link.socket_buffer_bytes, 4 << 20);
}

}  // namespace
}  // namespace fedwan::transport
