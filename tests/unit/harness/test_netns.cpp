// The chaos-test harness's network namespaces: the probes, and a
// VethPartition cut and healed under a live TCP connection. Needs root;
// skips otherwise.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "harness/netns.hpp"

namespace fedwan::testing {
namespace {

sockaddr_in address(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

int port_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A non-blocking TCP socket in namespace `ns` (made on a thread that joins
// it: a socket stays in the namespace it was made in), or on the host when
// `ns` is empty. Listening on ip:0 when `ip` is not empty.
int make_socket(const std::string& ns, const std::string& listen_ip = "") {
  int fd = -1;
  std::thread t([&] {
    if (!ns.empty()) {
      const int nsfd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
      if (nsfd < 0 || ::setns(nsfd, CLONE_NEWNET) != 0) return;
      ::close(nsfd);
    }
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (!listen_ip.empty()) {
      const sockaddr_in a = address(listen_ip, 0);
      if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
          ::listen(fd, 8) != 0) {
        ::close(fd);
        fd = -1;
      }
    }
  });
  t.join();
  return fd;
}

bool wait_for(int fd, short events, int ms) {
  pollfd p{fd, events, 0};
  return ::poll(&p, 1, ms) > 0 && (p.revents & events);
}

enum class Connect { kConnected, kFailed, kPending };

// Starts a non-blocking connect and waits up to `ms` for it to finish.
Connect connect_within(int fd, const std::string& ip, int port, int ms) {
  const sockaddr_in a = address(ip, port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0)
    return Connect::kConnected;
  if (errno != EINPROGRESS) return Connect::kFailed;
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, ms) <= 0) return Connect::kPending;
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  return err == 0 ? Connect::kConnected : Connect::kFailed;
}

TEST(Netns, ProbesGiveAReasonWhenUnavailable) {
  EXPECT_EQ(netns_available(), netns_unavailable_reason().empty());
  EXPECT_EQ(netem_available(), netem_unavailable_reason().empty());
  EXPECT_TRUE(!netem_available() || netns_available());
  EXPECT_EQ(netns_available(), netns_available());  // cached, stable
}

TEST(VethPartition, CutIsASilentPartitionBothWaysAndHealResumes) {
  if (!netns_available()) GTEST_SKIP() << "no network namespaces: " << netns_unavailable_reason();
  std::string name;
  {
    VethPartition p;
    name = p.name();
    std::string out;
    ASSERT_EQ(p.exec({p.exec_prefix()[0], "-4", "addr", "show", "dev", p.namespace_device()}, &out),
              0)
        << out;
    EXPECT_NE(out.find(p.namespace_address()), std::string::npos) << out;

    const int inside = make_socket(p.name(), p.namespace_address());
    const int outside = make_socket("", p.host_address());
    ASSERT_GE(inside, 0);
    ASSERT_GE(outside, 0);
    const int client = make_socket("");
    ASSERT_EQ(connect_within(client, p.namespace_address(), port_of(inside), 2000),
              Connect::kConnected);
    ASSERT_TRUE(wait_for(inside, POLLIN, 2000));
    const int served = ::accept4(inside, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(served, 0);
    ASSERT_EQ(::send(client, "a", 1, MSG_NOSIGNAL), 1);
    char c = 0;
    ASSERT_TRUE(wait_for(served, POLLIN, 2000));
    ASSERT_EQ(::recv(served, &c, 1, 0), 1);

    p.cut();
    EXPECT_TRUE(p.is_cut());
    ASSERT_EQ(::send(client, "b", 1, MSG_NOSIGNAL), 1);
    EXPECT_FALSE(wait_for(served, POLLIN, 400)) << "a byte crossed the cut link";
    const int host_new = make_socket("");
    // A partition hangs a connect (SYNs vanish); it neither completes nor fails fast.
    EXPECT_EQ(connect_within(host_new, p.namespace_address(), port_of(inside), 300),
              Connect::kPending);
    const int ns_new = make_socket(p.name());
    EXPECT_EQ(connect_within(ns_new, p.host_address(), port_of(outside), 300), Connect::kPending);

    p.heal();
    EXPECT_FALSE(p.is_cut());
    ASSERT_TRUE(wait_for(served, POLLIN, 4000)) << "the open connection did not resume";
    ASSERT_EQ(::recv(served, &c, 1, 0), 1);
    EXPECT_EQ(c, 'b');
    for (int fd : {inside, outside, client, served, host_new, ns_new}) ::close(fd);
  }
  std::string list;
  netns_detail::run({netns_detail::ip_tool(), "netns", "list"}, &list);
  EXPECT_EQ(list.find(name), std::string::npos) << "namespace left behind";
}

TEST(VethPartition, ParallelPartitionsGetDistinctNamesAndSubnets) {
  if (!netns_available()) GTEST_SKIP() << "no network namespaces: " << netns_unavailable_reason();
  VethPartition a;
  VethPartition b;
  EXPECT_NE(a.name(), b.name());
  EXPECT_NE(a.host_address(), b.host_address());
  EXPECT_EQ(a.run_in_namespace({"/bin/true"}).back(), "/bin/true");
  EXPECT_EQ(a.run_in_namespace({"/bin/true"})[3], a.name());
}

}  // namespace
}  // namespace fedwan::testing
