// A fault-injecting TCP proxy for chaos tests: listens on a free port,
// forwards every connection to a target host:port and, on command, partitions
// the link or turns it into a lossy, duplicating, reordering, delaying one at
// the ZeroMQ message layer.
//
// Faults act on whole ZeroMQ messages, not bytes (fault_lane.hpp): command
// frames (READY, PING, PONG, ...) always pass untouched, so the ZMTP session
// stays valid and what the peers see is an unreliable message channel. A
// stream that is not ZMTP 3.x is forwarded as plain bytes (raw_streams), so
// garbage never crashes the proxy. A ZMTP mechanism that encrypts (CURVE)
// carries data inside MESSAGE commands, which faults leave alone; fedwan's
// own link security runs above ZMTP NULL, so its messages are faulted.
//
// partition() blackholes every connection, open or new: bytes are read and
// discarded, nothing is forwarded and nothing is closed, as when a WAN link
// goes dark (ZeroMQ heartbeats, where enabled, then time out). heal() closes
// those connections with a reset, as TCP gives up after a long partition, and
// forwards new ones again.
//
// One proxy in front of an aggregator carries every child's link (they all
// connect to its one endpoint), so partitions and faults can name a peer:
// the ZeroMQ routing id its client announces in the READY command (fedwan
// sets it to the node id). partition("eu") blackholes eu's connections only,
// from the moment eu's READY is seen on a new one; FaultSpec::peer limits
// faults the same way.
//
// One thread runs a poll() loop; it blocks in poll() (no busy-wait) and reads
// from a side only while less than max_queued_bytes wait to be written to the
// other, so memory per direction stays below max_queued_bytes plus one
// message. Target connects are non-blocking (an unreachable target cannot
// stall the loop). Descriptors are close-on-exec.
//
// Thread safety: every public member may be called from any thread. The
// control calls (partition, heal, set_faults, reset_connections) block until
// the loop has applied them (one loop pass), so no byte is forwarded after
// partition() returns.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/fault_lane.hpp"

namespace fedwan::testing {

// Counters since construction (see FaultCounters for how messages count).
struct FaultProxyStats {
  uint64_t connections = 0;         // accepted
  uint64_t messages_forwarded = 0;  // ZMTP data messages sent on
  uint64_t messages_dropped = 0;
  uint64_t messages_duplicated = 0;
  uint64_t messages_reordered = 0;
  uint64_t resets = 0;            // connections reset by a fault or reset_connections()
  uint64_t healed_closes = 0;     // blackholed connections closed by heal()
  uint64_t commands = 0;          // ZMTP command frames passed through
  uint64_t raw_streams = 0;       // directions forwarded as plain bytes (not ZMTP 3.x)
  uint64_t bytes_to_target = 0;   // written to the target
  uint64_t bytes_to_client = 0;   // written to clients
  uint64_t bytes_blackholed = 0;  // read while partitioned and discarded
};

struct FaultProxyOptions {
  std::string target_host = "127.0.0.1";  // IPv4 address or host name
  int target_port = 0;
  std::string listen_host = "127.0.0.1";  // IPv4 address to listen on; the port is chosen free
  size_t max_message_bytes = size_t{64} << 20;  // a larger message turns its direction raw
  size_t max_queued_bytes = size_t{8} << 20;    // per direction, before reading pauses
};

class FaultProxy {
 public:
  // Starts listening and forwarding. Throws std::invalid_argument for zero
  // limits, std::runtime_error when the target cannot be resolved or a
  // socket, the pipe or the thread cannot be made.
  explicit FaultProxy(FaultProxyOptions options) : opt_(std::move(options)) { start(); }
  FaultProxy(const std::string& target_host, int target_port)
      : FaultProxy(options_for(target_host, target_port)) {}

  ~FaultProxy() {
    stop();
    close_fd(listen_fd_);
    close_fd(wake_read_);
    close_fd(wake_write_);
  }
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  int port() const { return port_; }
  const FaultProxyOptions& options() const { return opt_; }

  // Blackholes every connection, open or new; with a peer, only the
  // connections of the client that announced that routing id. Blocks until
  // applied.
  void partition(const std::string& peer = "") {
    control([&](Control& c) {
      if (peer.empty()) {
        c.partitioned = true;
      } else {
        c.partitioned_peers.insert(peer);
      }
    });
  }
  // Closes the blackholed connections with a reset and forwards new ones:
  // all of them, or with a peer, that peer's (a partition of everything
  // stays).
  void heal(const std::string& peer = "") {
    control([&](Control& c) {
      if (peer.empty()) {
        c.partitioned = false;
        c.partitioned_peers.clear();
      } else {
        c.partitioned_peers.erase(peer);
      }
    });
  }
  // Whether everything is partitioned; with a peer, whether that peer is.
  bool partitioned(const std::string& peer = "") const {
    std::lock_guard<std::mutex> lock(mu_);
    return control_.partitioned || (!peer.empty() && control_.partitioned_peers.count(peer) > 0);
  }
  // Replaces the fault spec, for open connections too (reseeded from
  // spec.seed). Throws std::invalid_argument when spec.problem() says so.
  void set_faults(const FaultSpec& spec) {
    if (const std::string why = spec.problem(); !why.empty()) throw std::invalid_argument(why);
    control([&](Control& c) {
      c.faults = spec;
      c.faults_generation += 1;
    });
  }
  void clear_faults() { set_faults(FaultSpec{}); }
  // Resets every open connection now (both sides see a reset), as a crashing
  // middlebox would; new connections are forwarded as before.
  void reset_connections() {
    control([](Control& c) { c.reset_generation += 1; });
  }

  FaultProxyStats stats() const {
    FaultProxyStats s;
    s.connections = connections_.load();
    s.messages_forwarded = counters_.forwarded.load();
    s.messages_dropped = counters_.dropped.load();
    s.messages_duplicated = counters_.duplicated.load();
    s.messages_reordered = counters_.reordered.load();
    s.resets = counters_.resets.load();
    s.healed_closes = healed_closes_.load();
    s.commands = counters_.commands.load();
    s.raw_streams = counters_.raw_streams.load();
    s.bytes_to_target = bytes_to_target_.load();
    s.bytes_to_client = bytes_to_client_.load();
    s.bytes_blackholed = bytes_blackholed_.load();
    return s;
  }
  // Connections open right now (blackholed ones included).
  size_t open_connections() const { return open_.load(); }
  // The routing ids announced on the open connections (one per connection
  // that got as far as its READY), sorted.
  std::vector<std::string> peers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_;
  }
  // Why the loop ended early (an unexpected error), or empty.
  std::string failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  // Closes every connection and joins the thread. Idempotent.
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      control_.stop = true;
    }
    wake();
    thread_.join();
  }

 private:
  using Clock = FaultLane::Clock;
  static constexpr size_t kReadBytes = size_t{64} * 1024;

  struct Control {
    bool stop = false;
    bool partitioned = false;
    std::set<std::string> partitioned_peers;
    FaultSpec faults;
    uint64_t faults_generation = 0;
    uint64_t reset_generation = 0;
  };

  struct Connection {
    Connection(uint64_t n, size_t max_message, FaultCounters* counters)
        : ordinal(n), up(true, max_message, counters), down(false, max_message, counters) {}
    uint64_t ordinal;
    int client = -1;
    int target = -1;
    bool connecting = false;  // non-blocking connect to the target in progress
    bool peer_known = false;  // the down lane was told up's peer
    bool blackholed = false;
    bool dead = false;         // close with a FIN
    bool reset = false;        // close with an RST
    bool target_shut = false;  // FIN forwarded to the target
    bool client_shut = false;  // FIN forwarded to the client
    FaultLane up;              // client -> target
    FaultLane down;            // target -> client
  };

  static FaultProxyOptions options_for(const std::string& host, int port) {
    FaultProxyOptions o;
    o.target_host = host;
    o.target_port = port;
    return o;
  }

  static sockaddr_in resolve(const std::string& host, int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
      throw std::runtime_error("FaultProxy: cannot resolve '" + host +
                               "' to an IPv4 address; give an address like 127.0.0.1");
    }
    a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    ::freeaddrinfo(res);
    return a;
  }

  void start() {
    if (opt_.max_message_bytes == 0 || opt_.max_queued_bytes == 0) {
      throw std::invalid_argument("FaultProxy: max_message_bytes and max_queued_bytes must be > 0");
    }
    target_ = resolve(opt_.target_host, opt_.target_port);
    sockaddr_in a = resolve(opt_.listen_host, 0);
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) fail_errno("pipe2");
    wake_read_ = p[0];
    wake_write_ = p[1];
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_fd_ < 0) fail_errno("socket");
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail_errno("bind");
    if (::listen(listen_fd_, 128) != 0) fail_errno("listen");
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      fail_errno("getsockname");
    }
    port_ = ntohs(a.sin_port);
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error& e) {
      fail("starting the proxy thread", e.what());
    }
  }

  // Constructor failures: closes what was opened (the destructor will not run).
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    close_fd(listen_fd_);
    close_fd(wake_read_);
    close_fd(wake_write_);
    throw std::runtime_error("FaultProxy: " + what + " failed: " + why);
  }
  [[noreturn]] void fail_errno(const char* what) {
    fail(what, std::system_category().message(errno));
  }

  static void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  // Closes with an RST instead of a FIN: the peer's next read or write fails.
  static void reset_fd(int& fd) {
    if (fd < 0) return;
    const linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close_fd(fd);
  }

  void wake() {
    const char byte = 1;
    // A full pipe wakes the loop already: a failed write changes nothing.
    [[maybe_unused]] const ssize_t n = ::write(wake_write_, &byte, 1);
  }

  // Changes the control block, then waits (up to 5 s, or until the loop has
  // ended) until the loop has applied it.
  template <typename F>
  void control(F change) {
    std::unique_lock<std::mutex> lock(mu_);
    change(control_);
    const uint64_t gen = ++requested_;
    lock.unlock();
    wake();
    lock.lock();
    applied_cv_.wait_for(lock, std::chrono::seconds(5),
                         [&] { return applied_ >= gen || !running_; });
  }

  // ---- the loop thread ----------------------------------------------------

  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = std::string("proxy loop stopped: ") + e.what();
    }
    for (Connection& c : conns_) {
      close_fd(c.client);
      close_fd(c.target);
    }
    conns_.clear();
    open_ = 0;
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    applied_cv_.notify_all();
  }

  // Applies what the control calls changed. False when stopping.
  bool apply_control() {
    Control c;
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c = control_;
      gen = requested_;
    }
    if (c.stop) return false;
    const Clock::time_point now = Clock::now();
    partitioned_ = c.partitioned;
    partitioned_peers_ = c.partitioned_peers;
    for (Connection& k : conns_) {
      const bool cut = cut_off(k);
      if (cut && !k.blackholed) {
        blackhole(k);
      } else if (!cut && k.blackholed) {
        reset_fd(k.client);
        reset_fd(k.target);
        healed_closes_ += 1;
      }
    }
    if (c.faults_generation != faults_generation_) {
      faults_ = c.faults;
      faults_generation_ = c.faults_generation;
      for (Connection& k : conns_) {
        k.up.set_faults(faults_, k.ordinal, now);
        k.down.set_faults(faults_, k.ordinal, now);
      }
    }
    if (c.reset_generation != reset_generation_) {
      reset_generation_ = c.reset_generation;
      for (Connection& k : conns_) {
        reset_fd(k.client);
        reset_fd(k.target);
        counters_.resets += 1;
      }
    }
    reap();
    {
      std::lock_guard<std::mutex> lock(mu_);
      applied_ = gen;
    }
    applied_cv_.notify_all();
    return true;
  }

  // Whether `c` must be blackholed now.
  bool cut_off(const Connection& c) const {
    return partitioned_ || (!c.up.peer().empty() && partitioned_peers_.count(c.up.peer()) > 0);
  }

  void blackhole(Connection& c) {
    c.blackholed = true;
    c.up.clear();
    c.down.clear();
  }

  // Closes what serve() condemned and forgets connections with no socket left.
  void reap() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->reset) {
        reset_fd(it->client);
        reset_fd(it->target);
      } else if (it->dead) {
        close_fd(it->client);
        close_fd(it->target);
      }
      if (it->client < 0 && it->target < 0) {
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    open_ = conns_.size();
    std::vector<std::string> peers;
    for (const Connection& c : conns_) {
      if (!c.up.peer().empty()) peers.push_back(c.up.peer());
    }
    std::sort(peers.begin(), peers.end());
    std::lock_guard<std::mutex> lock(mu_);
    if (peers != peers_) peers_ = std::move(peers);
  }

  // Reads once from `fd` into `l`; handles EOF and errors.
  void read_into(Connection& c, FaultLane& l, int fd, Clock::time_point now) {
    uint8_t buf[kReadBytes];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      if (!l.push(buf, static_cast<size_t>(n), now)) c.reset = true;
    } else if (n == 0) {
      if (!l.finish(now)) c.reset = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      c.dead = true;
    }
  }

  // Writes what is due of `l` to `fd`; forwards the FIN once drained.
  void write_from(Connection& c, FaultLane& l, int fd, bool& shut, Clock::time_point now) {
    std::atomic<uint64_t>& bytes = l.to_target() ? bytes_to_target_ : bytes_to_client_;
    for (auto [p, n] = l.head(now); n > 0; std::tie(p, n) = l.head(now)) {
      const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        bytes += static_cast<uint64_t>(k);
        l.advance(static_cast<size_t>(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // wait for POLLOUT
      c.dead = true;
      return;
    }
    if (l.drained() && !shut) {
      ::shutdown(fd, SHUT_WR);
      shut = true;
    }
  }

  // Reads from a blackholed side and discards; closes that side at EOF or
  // error (it gave up; the other side keeps waiting, unaware).
  void discard(int& fd, short revents) {
    if (fd < 0 || !(revents & (POLLIN | POLLHUP | POLLERR))) return;
    uint8_t buf[kReadBytes];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      bytes_blackholed_ += static_cast<uint64_t>(n);
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      close_fd(fd);
    }
  }

  void serve(Connection& c, short cev, short tev, Clock::time_point now) {
    if (c.blackholed) {
      discard(c.client, cev);
      discard(c.target, tev);
      return;
    }
    if (c.connecting) {
      if (!tev) return;
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(c.target, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        c.dead = true;  // the target is not listening (yet): ZeroMQ reconnects
        return;
      }
      c.connecting = false;
      tev = 0;
    }
    const short readable = POLLIN | POLLHUP | POLLERR;
    if ((cev & readable) && c.up.wants_input(opt_.max_queued_bytes)) {
      read_into(c, c.up, c.client, now);
      if (!c.peer_known && !c.up.peer().empty()) {
        // The client's READY just passed through the splitter, not the socket.
        c.peer_known = true;
        c.down.set_peer(c.up.peer(), now);
        if (cut_off(c)) {
          blackhole(c);
          return;
        }
      }
    }
    if (!c.dead && !c.reset && (tev & readable) && c.down.wants_input(opt_.max_queued_bytes)) {
      read_into(c, c.down, c.target, now);
    }
    if (c.dead || c.reset) return;
    c.up.tick(now);
    c.down.tick(now);
    write_from(c, c.up, c.target, c.target_shut, now);
    if (!c.dead) write_from(c, c.down, c.client, c.client_shut, now);
    if (c.target_shut && c.client_shut) c.dead = true;  // both sides finished
  }

  void accept_all() {
    for (;;) {
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (client < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN, or out of descriptors: try again on the next pass
      }
      const int one = 1;
      ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      connections_ += 1;
      Connection& c = conns_.emplace_back(next_ordinal_++, opt_.max_message_bytes, &counters_);
      c.client = client;
      const Clock::time_point now = Clock::now();
      c.up.set_faults(faults_, c.ordinal, now);
      c.down.set_faults(faults_, c.ordinal, now);
      if (partitioned_) {
        c.blackholed = true;  // accepted, then silence: the handshake never completes
        continue;
      }
      c.target = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (c.target < 0) {
        c.dead = true;
        continue;
      }
      ::setsockopt(c.target, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      int rc;
      do {
        rc = ::connect(c.target, reinterpret_cast<const sockaddr*>(&target_), sizeof target_);
      } while (rc != 0 && errno == EINTR);
      if (rc != 0 && errno == EINPROGRESS) {
        c.connecting = true;
      } else if (rc != 0) {
        c.dead = true;
      }
    }
  }

  // Milliseconds poll() may sleep: until the next delayed or held message.
  int poll_timeout(Clock::time_point now) const {
    std::optional<Clock::time_point> due;
    for (const Connection& c : conns_) {
      if (c.blackholed || c.connecting) continue;
      for (const FaultLane* l : {&c.up, &c.down}) {
        const auto d = l->next_due(now);
        if (d && (!due || *d < *due)) due = d;
      }
    }
    if (!due) return -1;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*due - now).count();
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 60000));
  }

  void loop() {
    std::vector<pollfd> fds;
    for (;;) {
      if (!apply_control()) return;
      const Clock::time_point before = Clock::now();
      // A socket is polled only for what can make progress, so a hang-up on
      // one with nothing to wait for cannot make poll() return again and again.
      fds.clear();
      fds.push_back({wake_read_, POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (const Connection& c : conns_) {
        short ce = 0;
        short te = 0;
        if (c.blackholed) {
          ce = te = POLLIN;
        } else if (c.connecting) {
          te = POLLOUT;  // the client waits until the target answers
        } else {
          if (c.up.wants_input(opt_.max_queued_bytes)) ce |= POLLIN;
          if (c.down.head(before).second > 0) ce |= POLLOUT;
          if (c.down.wants_input(opt_.max_queued_bytes)) te |= POLLIN;
          if (c.up.head(before).second > 0) te |= POLLOUT;
        }
        fds.push_back({ce && c.client >= 0 ? c.client : -1, ce, 0});
        fds.push_back({te && c.target >= 0 ? c.target : -1, te, 0});
      }
      int ready;
      do {
        ready = ::poll(fds.data(), fds.size(), poll_timeout(before));
      } while (ready < 0 && errno == EINTR);
      if (ready < 0)
        throw std::runtime_error("poll failed: " + std::system_category().message(errno));
      if (fds[0].revents) {
        char drain[64];
        while (::read(wake_read_, drain, sizeof drain) > 0) {
        }
        continue;  // apply the control change first; the rest is reported again
      }
      const Clock::time_point now = Clock::now();
      size_t k = 2;
      for (Connection& c : conns_) {
        serve(c, fds[k].revents, fds[k + 1].revents, now);
        k += 2;
      }
      if (fds[1].revents) accept_all();
      reap();
    }
  }

  FaultProxyOptions opt_;
  sockaddr_in target_{};
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_read_ = -1;
  int wake_write_ = -1;

  mutable std::mutex mu_;  // guards control_, peers_, requested_, applied_, running_, failure_
  std::condition_variable applied_cv_;
  Control control_;
  std::vector<std::string> peers_;
  uint64_t requested_ = 0;
  uint64_t applied_ = 0;
  bool running_ = true;
  std::string failure_;

  FaultCounters counters_;
  std::atomic<uint64_t> connections_{0}, healed_closes_{0}, bytes_to_target_{0},
      bytes_to_client_{0}, bytes_blackholed_{0};
  std::atomic<size_t> open_{0};

  // Loop thread only.
  std::list<Connection> conns_;
  uint64_t next_ordinal_ = 0;
  bool partitioned_ = false;
  std::set<std::string> partitioned_peers_;
  FaultSpec faults_;
  uint64_t faults_generation_ = 0;
  uint64_t reset_generation_ = 0;

  std::thread thread_;
};

}  // namespace fedwan::testing
