#include "harness/tcp_relay.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace fedwan::testing {

TcpRelay::TcpRelay(int target_port) : target_port_(target_port) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) fail_errno("pipe2");
  wake_read_ = p[0];
  wake_write_ = p[1];
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) fail_errno("socket");
  sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail_errno("bind");
  if (::listen(listen_fd_, 64) != 0) fail_errno("listen");
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    fail_errno("getsockname");
  }
  port_ = ntohs(a.sin_port);
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (const std::system_error& e) {
    fail("starting the relay thread", e.what());
  }
}

TcpRelay::~TcpRelay() {
  stop();
  close_fd(listen_fd_);
  close_fd(wake_read_);
  close_fd(wake_write_);
}

void TcpRelay::stop() {
  if (!thread_.joinable()) return;
  const char byte = 1;
  // The pipe is empty (only stop() writes, once), so this cannot block or fail.
  [[maybe_unused]] const ssize_t n = ::write(wake_write_, &byte, 1);
  thread_.join();
}

std::vector<uint8_t> TcpRelay::capture() const {
  require_stopped();
  size_t total = 0;
  for (const RelayStream& s : streams_) total += s.bytes.size();
  std::vector<uint8_t> out;
  out.reserve(total);
  for (const RelayStream& s : streams_) out.insert(out.end(), s.bytes.begin(), s.bytes.end());
  return out;
}

sockaddr_in TcpRelay::loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

void TcpRelay::fail(const std::string& what, const std::string& why) {
  close_fd(listen_fd_);
  close_fd(wake_read_);
  close_fd(wake_write_);
  throw std::runtime_error("TcpRelay: " + what + " failed: " + why);
}

void TcpRelay::close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void TcpRelay::require_stopped() const {
  if (thread_.joinable()) {
    throw std::logic_error("TcpRelay: read the capture only after stop()");
  }
}

int TcpRelay::connect_target() const {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const sockaddr_in a = loopback(target_port_);
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

bool TcpRelay::accept_all() {
  for (;;) {
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      failure_ = std::string("accept failed: ") + std::strerror(errno);
      return false;
    }
    const int target = connect_target();
    if (target < 0) {
      ::close(client);
      continue;
    }
    Connection& c = connections_.emplace_back();
    c.client = client;
    c.target = target;
    const size_t ordinal = streams_.size() / 2;
    c.up.from = client;
    c.up.to = target;
    c.up.stream = streams_.size();
    streams_.push_back({ordinal, true, {}});
    c.down.from = target;
    c.down.to = client;
    c.down.stream = streams_.size();
    streams_.push_back({ordinal, false, {}});
  }
}

void TcpRelay::pump(Connection& c, Direction& d, short from_events) {
  if (!d.has_pending() && !d.eof && (from_events & (POLLIN | POLLHUP | POLLERR))) {
    d.pending.resize(kReadBytes);
    d.written = 0;
    const ssize_t n = ::recv(d.from, d.pending.data(), kReadBytes, 0);
    if (n > 0) {
      d.pending.resize(static_cast<size_t>(n));
      std::vector<uint8_t>& s = streams_[d.stream].bytes;
      s.insert(s.end(), d.pending.begin(), d.pending.end());
    } else {
      d.pending.clear();
      if (n == 0) {
        d.eof = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        c.dead = true;
        return;
      }
    }
  }
  while (d.has_pending()) {
    const ssize_t n = ::send(d.to, d.pending.data() + d.written, d.pending.size() - d.written,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      d.written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // wait for POLLOUT
    c.dead = true;
    return;
  }
  if (d.eof && !d.shut) {
    ::shutdown(d.to, SHUT_WR);
    d.shut = true;
  }
}

void TcpRelay::loop() {
  std::vector<pollfd> fds;
  for (;;) {
    // A socket is polled only for what can make progress: reading when its
    // direction has nothing pending, writing when the other one has. One
    // with nothing to wait for is left out, so a hang-up on it cannot make
    // poll() return at once again and again.
    fds.clear();
    fds.push_back({wake_read_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (Connection& c : connections_) {
      const auto events = [](const Direction& reading, const Direction& writing) {
        short e = 0;
        if (!reading.has_pending() && !reading.eof) e |= POLLIN;
        if (writing.has_pending()) e |= POLLOUT;
        return e;
      };
      const short ce = events(c.up, c.down);
      const short te = events(c.down, c.up);
      fds.push_back({ce ? c.client : -1, ce, 0});
      fds.push_back({te ? c.target : -1, te, 0});
    }
    int ready;
    do {
      ready = ::poll(fds.data(), fds.size(), -1);
    } while (ready < 0 && errno == EINTR);
    if (ready < 0) {
      failure_ = std::string("poll failed: ") + std::strerror(errno);
      break;
    }
    if (fds[0].revents) break;  // stop()
    // fds[2..] follow connections_ as it was polled: serve those before
    // accepting new ones.
    size_t k = 2;
    for (auto it = connections_.begin(); it != connections_.end(); k += 2) {
      Connection& c = *it;
      const short client_ev = fds[k].revents;
      const short target_ev = fds[k + 1].revents;
      // An error or hang-up on the writing side surfaces through send().
      pump(c, c.up, client_ev);
      if (!c.dead) pump(c, c.down, target_ev);
      if (c.dead || (c.up.done() && c.down.done())) {
        close_fd(c.client);
        close_fd(c.target);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    if (fds[1].revents && !accept_all()) break;
  }
  for (Connection& c : connections_) {
    close_fd(c.client);
    close_fd(c.target);
  }
  connections_.clear();
}

}  // namespace fedwan::testing
