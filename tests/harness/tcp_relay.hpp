// A recording TCP relay for tests: listens on a free 127.0.0.1 port, forwards
// every connection it accepts to 127.0.0.1:<target port>, copies the bytes
// both ways, and keeps a copy of every byte it read, so that a test can look
// at exactly what crossed a link.
//
// One thread per relay runs a poll() loop over the listening socket, a wake-up
// pipe and both sockets of every connection. It blocks in poll() (no
// busy-wait) and reads from one side of a connection only once what it last
// read from there has been written to the other side, so memory stays bounded
// by one read buffer per direction plus the capture. A connection the target
// refuses (its listener is not up yet) is closed at once: ZeroMQ reconnects.
// Every descriptor is close-on-exec, so processes the test spawns do not
// inherit them.
//
// Thread safety: construct, port() and stop() from one thread; streams(),
// capture(), connections() and failure() only after stop() (they throw
// std::logic_error before).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <list>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace fedwan::testing {

// The bytes of one direction of one relayed connection, in order.
struct RelayStream {
  size_t connection = 0;  // ordinal of the accepted connection, from 0
  bool to_target = true;  // true: client -> target; false: target -> client
  std::vector<uint8_t> bytes;
};

class TcpRelay {
 public:
  // Starts listening and forwarding to 127.0.0.1:target_port. Throws
  // std::runtime_error when a socket, the pipe or the thread cannot be made.
  explicit TcpRelay(int target_port) : target_port_(target_port) {
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

  ~TcpRelay() {
    stop();
    close_fd(listen_fd_);
    close_fd(wake_read_);
    close_fd(wake_write_);
  }

  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  // The port clients connect to.
  int port() const { return port_; }
  int target_port() const { return target_port_; }

  // Closes every relayed connection and joins the thread. Idempotent; blocks
  // for at most one pass of the loop.
  void stop() {
    if (!thread_.joinable()) return;
    const char byte = 1;
    // The pipe is empty (only stop() writes, once), so this cannot block or fail.
    [[maybe_unused]] const ssize_t n = ::write(wake_write_, &byte, 1);
    thread_.join();
  }

  // Every direction of every connection that reached the target, in the order
  // the connections were accepted.
  const std::vector<RelayStream>& streams() const {
    require_stopped();
    return streams_;
  }

  // All streams concatenated (each one contiguous, so a pattern never spans
  // two streams unless it straddles their junction).
  std::vector<uint8_t> capture() const {
    require_stopped();
    size_t total = 0;
    for (const RelayStream& s : streams_) total += s.bytes.size();
    std::vector<uint8_t> out;
    out.reserve(total);
    for (const RelayStream& s : streams_) out.insert(out.end(), s.bytes.begin(), s.bytes.end());
    return out;
  }

  // Connections accepted and forwarded to the target.
  size_t connections() const {
    require_stopped();
    return streams_.size() / 2;
  }

  // Why the loop ended early (an unexpected socket error), or empty.
  const std::string& failure() const {
    require_stopped();
    return failure_;
  }

 private:
  static constexpr size_t kReadBytes = 64 * 1024;

  // One direction of a connection: bytes read from `from` wait in `pending`
  // until written to `to`.
  struct Direction {
    int from = -1;
    int to = -1;
    size_t stream = 0;             // index into streams_
    std::vector<uint8_t> pending;  // read, not yet written
    size_t written = 0;            // of pending
    bool eof = false;              // `from` sent FIN
    bool shut = false;             // FIN forwarded to `to`
    bool has_pending() const { return written < pending.size(); }
    bool done() const { return shut; }
  };

  struct Connection {
    int client = -1;
    int target = -1;
    Direction up;    // client -> target
    Direction down;  // target -> client
    bool dead = false;
  };

  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }

  // Constructor failures: closes what was opened (the destructor will not run).
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    close_fd(listen_fd_);
    close_fd(wake_read_);
    close_fd(wake_write_);
    throw std::runtime_error("TcpRelay: " + what + " failed: " + why);
  }
  [[noreturn]] void fail_errno(const char* what) { fail(what, std::strerror(errno)); }

  static void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  void require_stopped() const {
    if (thread_.joinable()) {
      throw std::logic_error("TcpRelay: read the capture only after stop()");
    }
  }

  // Connects to the target; -1 when it refuses (not listening yet).
  int connect_target() const {
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

  // Accepts every pending connection. False on an unexpected error.
  bool accept_all() {
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

  // Reads once from d.from when readable and nothing is pending, then writes
  // what is pending. Marks the connection dead on a socket error.
  void pump(Connection& c, Direction& d, short from_events) {
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

  void loop() {
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

  int target_port_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_read_ = -1;
  int wake_write_ = -1;
  std::list<Connection> connections_;  // loop thread only
  std::vector<RelayStream> streams_;   // loop thread until stop(), then readers
  std::string failure_;
  std::thread thread_;
};

}  // namespace fedwan::testing
