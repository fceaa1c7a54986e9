// This process's connected loopback TCP sockets on a port, found through
// /proc/self/fd: the kernel's own view of what a transport opened (its
// congestion control, its buffers), whatever the transport reports.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <functional>

namespace fedwan::testing {

// Calls f(fd) for each connected IPv4 socket of this process whose client
// end (peer port == port) or server end (local port == port) is on `port`.
inline void for_each_loopback_socket(int port, bool server_end, const std::function<void(int)>& f) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (const dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == ::dirfd(dir)) continue;
    sockaddr_in local{}, peer{};
    socklen_t llen = sizeof local, plen = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0 ||
        local.sin_family != AF_INET) {
      continue;  // not a connected IPv4 socket
    }
    if (ntohs(server_end ? local.sin_port : peer.sin_port) == port) f(fd);
  }
  ::closedir(dir);
}

}  // namespace fedwan::testing
