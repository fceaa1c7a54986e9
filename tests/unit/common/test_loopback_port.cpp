// Ports for nodes to listen on (common/loopback_port.hpp): outside the
// kernel's ephemeral range, free when chosen, and never chosen twice while
// this process holds them.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "common/loopback_port.hpp"

namespace fedwan {
namespace {

TEST(LoopbackPort, ChosenBelowTheEphemeralRangeElseAboveIt) {
  EXPECT_EQ(ports_outside_ephemeral(32768, 60999), std::make_pair(10000, 32767));
  EXPECT_EQ(ports_outside_ephemeral(10500, 60999), std::make_pair(61000, 65535));
  EXPECT_EQ(ports_outside_ephemeral(1024, 65000), std::make_pair(0, 0)) << "no room: the kernel's";
}

TEST(LoopbackPort, OutsideTheEphemeralRangeFreeAndNeverTwice) {
  int lo = 32768, hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  std::set<int> ports;
  for (int i = 0; i < 20; ++i) {
    const int port = reserve_loopback_port();
    EXPECT_TRUE(port < lo || port > hi) << port << " is in the ephemeral range " << lo << "-" << hi;
    EXPECT_TRUE(ports.insert(port).second) << port << " chosen twice";
    // Free: a listener can bind it.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << port;
    ::close(fd);
  }
}

}  // namespace
}  // namespace fedwan
