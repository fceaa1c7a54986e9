#include "common/loopback_port.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "fedwan/error.hpp"

namespace fedwan {
namespace {

constexpr int kLowest = 10000;  // below: well-known and registered services
constexpr int kRoom = 1000;     // the least span worth choosing from

std::pair<int, int> ephemeral_range() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 32768, hi = 60999;  // Linux's default
  int a = 0, b = 0;
  if (f >> a >> b && a > 0 && b >= a && b <= 65535) lo = a, hi = b;
  return {lo, hi};
}

bool bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// The kernel's choice (inside the ephemeral range): the fallback when
// there is no room outside it.
int any_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("cannot create a socket to find a free loopback port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw Error("cannot find a free loopback port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

std::pair<int, int> ports_outside_ephemeral(int lo, int hi) {
  if (lo - kLowest >= kRoom) return {kLowest, lo - 1};
  if (65535 - hi >= kRoom) return {hi + 1, 65535};
  return {0, 0};
}

int reserve_loopback_port() {
  static std::mutex mu;
  static std::vector<int> held;  // lock files, open until the process exits
  const std::lock_guard<std::mutex> lock(mu);
  const auto [lo, hi] = ephemeral_range();
  const auto [first, last] = ports_outside_ephemeral(lo, hi);
  if (first == 0) return any_free_port();
  std::error_code ec;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path(ec) / ("fedwan-ports-" + std::to_string(::getuid()));
  std::filesystem::create_directories(dir, ec);
  ::chmod(dir.c_str(), 0700);
  std::random_device seed;
  std::mt19937 rng(seed() ^ static_cast<unsigned>(::getpid()));
  std::uniform_int_distribution<int> pick(first, last);
  for (int tries = 0; tries < 2000; ++tries) {
    const int port = pick(rng);
    const std::string path = (dir / std::to_string(port)).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      // No lock possible here (a read-only temporary directory): the bind
      // check alone.
      if (bindable(port)) return port;
      continue;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // another process holds it
      ::close(fd);
      continue;
    }
    if (!bindable(port)) {
      ::close(fd);
      continue;
    }
    held.push_back(fd);
    return port;
  }
  throw Error("cannot find a free loopback port between " + std::to_string(first) + " and " +
              std::to_string(last));
}

}  // namespace fedwan
