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
// the ZeroMQ routing id its client announces in the READY command, without
// the link's tag fedwan adds (transport/routing_id.hpp): the node id for a
// node's first connection. partition("eu") blackholes eu's connections only,
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

#include <netinet/in.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
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

  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  int port() const { return port_; }
  const FaultProxyOptions& options() const { return opt_; }

  // Blackholes every connection, open or new; with a peer, only the
  // connections of the client that announced that routing id. Blocks until
  // applied.
  void partition(const std::string& peer = "");
  // Closes the blackholed connections with a reset and forwards new ones:
  // all of them, or with a peer, that peer's (a partition of everything
  // stays).
  void heal(const std::string& peer = "");
  // Whether everything is partitioned; with a peer, whether that peer is.
  bool partitioned(const std::string& peer = "") const;
  // Replaces the fault spec, for open connections too (reseeded from
  // spec.seed). Throws std::invalid_argument when spec.problem() says so.
  void set_faults(const FaultSpec& spec);
  void clear_faults() { set_faults(FaultSpec{}); }
  // Resets every open connection now (both sides see a reset), as a crashing
  // middlebox would; new connections are forwarded as before.
  void reset_connections() {
    control([](Control& c) { c.reset_generation += 1; });
  }

  FaultProxyStats stats() const;
  // Connections open right now (blackholed ones included).
  size_t open_connections() const { return open_.load(); }
  // The routing ids announced on the open connections (one per connection
  // that got as far as its READY), sorted.
  std::vector<std::string> peers() const;
  // Why the loop ended early (an unexpected error), or empty.
  std::string failure() const;

  // Closes every connection and joins the thread. Idempotent.
  void stop();

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

  static FaultProxyOptions options_for(const std::string& host, int port);
  static sockaddr_in resolve(const std::string& host, int port);
  void start();

  // Constructor failures: closes what was opened (the destructor will not run).
  [[noreturn]] void fail(const std::string& what, const std::string& why);
  [[noreturn]] void fail_errno(const char* what) {
    fail(what, std::system_category().message(errno));
  }

  static void close_fd(int& fd);
  // Closes with an RST instead of a FIN: the peer's next read or write fails.
  static void reset_fd(int& fd);
  void wake();

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

  void run();
  // Applies what the control calls changed. False when stopping.
  bool apply_control();
  // Whether `c` must be blackholed now.
  bool cut_off(const Connection& c) const;
  void blackhole(Connection& c);
  // Closes what serve() condemned and forgets connections with no socket left.
  void reap();
  // Reads once from `fd` into `l`; handles EOF and errors.
  void read_into(Connection& c, FaultLane& l, int fd, Clock::time_point now);
  // Writes what is due of `l` to `fd`; forwards the FIN once drained.
  void write_from(Connection& c, FaultLane& l, int fd, bool& shut, Clock::time_point now);
  // Reads from a blackholed side and discards; closes that side at EOF or
  // error (it gave up; the other side keeps waiting, unaware).
  void discard(int& fd, short revents);
  void serve(Connection& c, short cev, short tev, Clock::time_point now);
  void accept_all();
  // Milliseconds poll() may sleep: until the next delayed or held message.
  int poll_timeout(Clock::time_point now) const;
  void loop();

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
