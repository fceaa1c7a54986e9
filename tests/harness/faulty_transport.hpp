// Fault injection as a transport decorator (c10d's way: wrap the backend),
// for tests whose nodes run as threads: FaultyTransport wraps any Transport,
// and every message its sockets receive passes a FaultInjector's partitions
// and rules first, which may drop, delay, corrupt or duplicate it.
//
//   ScopedTransportFaults faults;  // wraps every transport make_transport() makes
//   faults->add(FaultRule::drop().of_type(wire::MsgType::kAnchor)
//                   .on(topo.node("region-0").endpoint, "site-0").first(2));
//   faults->partition(topo.root().endpoint, "region-0");  // ... faults->heal_all();
//   run the federation; EXPECT_EQ(faults->stats().dropped, 2u);
//
// A connection is named the same from both its ends: the endpoint its server
// bound and the routing id its client connected under (a node's id). Up is
// client -> server (child -> parent), down the other way. Faults act where a
// message is received, so each message meets them once, whichever sides are
// wrapped, as long as the receiving side is; what a sender sees is what a
// lossy network gives it (a send that succeeds and never arrives).
//
// Rules see the message's bytes as they travel: with a secure channel that
// is a sealed frame, whose 64-byte header stays in clear (frame_header()
// reads it), so a rule can pick frames by type, round or chunk; a corrupted
// sealed frame fails authentication at the receiver. Tests of what an
// attacker on the wire sees and does use the real-socket relay instead
// (fault_proxy.hpp, tcp_relay.hpp).
//
// Delays keep each peer's order: a message is never delivered before one the
// same peer sent earlier, except one delayed by delay_overtaken(), which
// later messages pass (one connection of a striped link in loss recovery). Held messages no longer
// count against the sender's window (they are on the wire, not in a queue).
//
// Thread safety: a FaultInjector may be used from any thread (the test's
// and the nodes'); its predicates run under its lock, on the receiving
// node's thread, and must not call back into it. FaultyTransport is as
// thread safe as the transport it wraps; its sockets belong to one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "transport/transport.hpp"
#include "wire/frame.hpp"

namespace fedwan::testing {

using transport::Millis;

// Which way a message travels on its connection.
enum class Way { kAny, kUp, kDown };

// Where a received message travelled.
struct Hop {
  std::string endpoint;  // the server's
  std::string client;    // the client's routing id, without its link's tag ("a", "a~1")
  Way way = Way::kUp;    // kUp or kDown
};

// The header of a fedwan frame, plain or sealed, when `data` starts with one
// (at least 64 bytes and the magic); its fields are as sent, unchecked.
std::optional<wire::FrameHeader> frame_header(const uint8_t* data, size_t size);

struct FaultRule {
  // kObserve changes nothing: its hits tell a test when a message went by.
  // kRewrite changes a message in place (its size stays): a dishonest
  // sender, when the frames travel in clear.
  enum class Action { kDrop, kDelay, kCorrupt, kDuplicate, kObserve, kRewrite };
  using Predicate = std::function<bool(const uint8_t* data, size_t size)>;
  using Rewrite = std::function<void(uint8_t* data, size_t size)>;
  static constexpr size_t kLastByte = std::numeric_limits<size_t>::max();

  Action action = Action::kDrop;
  std::string endpoint;  // "": any server
  std::string client;    // "": any client
  Way way = Way::kAny;
  Predicate match;                                        // empty: every message
  uint64_t limit = std::numeric_limits<uint64_t>::max();  // messages it applies to, at most
  Millis delay{0};                                        // kDelay
  bool keep_order = true;     // kDelay: later messages of the peer wait behind it
  size_t offset = kLastByte;  // kCorrupt: the byte flipped (past the end: the last one)
  uint8_t mask = 0x01;        // kCorrupt: the bits flipped
  Rewrite rewrite;            // kRewrite; runs under the injector's lock

  static FaultRule drop() { return FaultRule{}; }
  static FaultRule delay_by(Millis d);
  static FaultRule delay_overtaken(Millis d);  // later messages pass it
  static FaultRule corrupt(size_t offset = kLastByte, uint8_t mask = 0x01);
  static FaultRule duplicate();
  static FaultRule observe();
  static FaultRule rewrite_with(Rewrite r);

  // Only the connection of `client` to `endpoint` (every client of it when
  // `client` is empty).
  FaultRule& on(std::string server_endpoint, std::string client_id = "");
  FaultRule& up();
  FaultRule& down();
  // Only messages `p` accepts (and any predicate set before).
  FaultRule& where(Predicate p);
  // Only fedwan frames of type `t`.
  FaultRule& of_type(wire::MsgType t);
  // Only the first `n` messages it would apply to.
  FaultRule& first(uint64_t n);

  bool covers(const Hop& hop) const;
};

// Messages since construction; each is counted once per fault it met.
struct FaultStats {
  uint64_t received = 0;     // reached a faulty socket from the inner transport
  uint64_t dropped = 0;      // by a drop rule
  uint64_t partitioned = 0;  // dropped by a partition
  uint64_t delayed = 0;
  uint64_t corrupted = 0;
  uint64_t duplicated = 0;  // delivered twice
  uint64_t rewritten = 0;
};

class FaultInjector {
 public:
  using RuleId = size_t;

  // Rules apply in the order added: every rule that covers a message and
  // still has room under its limit applies; a drop ends the list.
  RuleId add(FaultRule rule);
  // No rule applies from now on (counters and hits stay).
  void clear_rules();
  // Messages rule `id` applied to so far.
  uint64_t hits(RuleId id) const;

  // Drops everything on the connection of `client` to `endpoint`, both ways,
  // until healed (every client of `endpoint` when `client` is empty, every
  // connection when both are). Connections made meanwhile are cut too.
  void partition(const std::string& endpoint, const std::string& client = "");
  // Lifts the partition named exactly so.
  void heal(const std::string& endpoint, const std::string& client = "");
  void heal_all();
  bool partitioned(const Hop& hop) const;

  FaultStats stats() const;

  // While on, client sockets report TCP retransmissions growing at every
  // look and a 50 ms round trip (a long lossy path, as the kernel's TCP_INFO
  // would show it).
  void report_loss(bool on);
  bool reporting_loss() const;

  // What became of one received message.
  struct Verdict {
    bool drop = false;
    Millis delay{0};
    bool keep_order = true;
    bool duplicate = false;
  };
  // Applies partitions and rules to a message received over `hop`,
  // corrupting it in place, and counts. Called by the faulty sockets.
  Verdict judge(const Hop& hop, uint8_t* data, size_t size);

 private:
  bool partitioned_locked(const Hop& hop) const;

  struct Entry {
    FaultRule rule;
    uint64_t hits = 0;
    bool active = true;
  };
  mutable std::mutex mu_;  // guards everything below
  std::vector<Entry> rules_;
  std::set<std::pair<std::string, std::string>> partitions_;
  FaultStats stats_;
  bool report_loss_ = false;
};

// Wraps `inner`: its sockets, made through this object, pass every message
// they receive through `faults`; wait() waits on the inner sockets and also
// ends when a delayed message comes due.
class FaultyTransport final : public transport::Transport {
 public:
  FaultyTransport(std::unique_ptr<transport::Transport> inner,
                  std::shared_ptr<FaultInjector> faults);

  std::unique_ptr<transport::Socket> connect(const std::string& endpoint,
                                             const std::string& self_id,
                                             const transport::SocketOptions& options) override;
  std::unique_ptr<transport::Socket> bind(const std::string& endpoint,
                                          const transport::SocketOptions& options) override;
  using transport::Transport::wait;
  // Takes only sockets this object made (TransportError otherwise).
  bool wait(const std::vector<Interest>& interests, Millis timeout) override;

 private:
  std::unique_ptr<transport::Transport> inner_;
  std::shared_ptr<FaultInjector> faults_;
};

// While it lives, every transport make_transport() makes is a FaultyTransport
// over `faults` (sockets made before are not). One at a time per process;
// the transports made meanwhile keep the injector alive after it.
class ScopedTransportFaults {
 public:
  ScopedTransportFaults() : ScopedTransportFaults(std::make_shared<FaultInjector>()) {}
  explicit ScopedTransportFaults(std::shared_ptr<FaultInjector> faults);
  ~ScopedTransportFaults();
  ScopedTransportFaults(const ScopedTransportFaults&) = delete;
  ScopedTransportFaults& operator=(const ScopedTransportFaults&) = delete;

  FaultInjector& injector() { return *faults_; }
  FaultInjector* operator->() { return faults_.get(); }

 private:
  std::shared_ptr<FaultInjector> faults_;
};

}  // namespace fedwan::testing
