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

#include <netinet/in.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <list>
#include <string>
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
  explicit TcpRelay(int target_port);
  ~TcpRelay();
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  // The port clients connect to.
  int port() const { return port_; }
  int target_port() const { return target_port_; }

  // Closes every relayed connection and joins the thread. Idempotent; blocks
  // for at most one pass of the loop.
  void stop();

  // Every direction of every connection that reached the target, in the order
  // the connections were accepted.
  const std::vector<RelayStream>& streams() const {
    require_stopped();
    return streams_;
  }

  // All streams concatenated (each one contiguous, so a pattern never spans
  // two streams unless it straddles their junction).
  std::vector<uint8_t> capture() const;

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

  static sockaddr_in loopback(int port);

  // Constructor failures: closes what was opened (the destructor will not run).
  [[noreturn]] void fail(const std::string& what, const std::string& why);
  [[noreturn]] void fail_errno(const char* what) { fail(what, std::strerror(errno)); }

  static void close_fd(int& fd);
  void require_stopped() const;
  // Connects to the target; -1 when it refuses (not listening yet).
  int connect_target() const;

  // Accepts every pending connection. False on an unexpected error.
  bool accept_all();

  // Reads once from d.from when readable and nothing is pending, then writes
  // what is pending. Marks the connection dead on a socket error.
  void pump(Connection& c, Direction& d, short from_events);
  void loop();

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
