// Sets a TCP congestion control (federation.tcp_congestion, docs/topology.md)
// on every TCP connection of one ZeroMQ socket, and keeps track of those
// connections to read their retransmissions (TCP_INFO) for the link's
// stream governor. ZeroMQ opens and reopens
// its connections in its I/O thread and never hands out their descriptors,
// so a socket monitor reports each one (ZMQ_EVENT_CONNECTED, _ACCEPTED:
// the value is the connection's fd) and the owner applies the algorithm
// when it next uses the socket: setsockopt(TCP_CONGESTION), then reads back
// what is in effect.
//
// An algorithm the host does not allow (EPERM) or have (ENOENT) is logged
// once per link in a process (a reconnect does not repeat it) with how to
// allow it, and the connection keeps the host's default: a link never fails
// for this.
//
// Thread safety: none; it belongs to the thread that owns the socket.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "transport/transport.hpp"

namespace fedwan::transport {

class CongestionMonitor {
 public:
  // Starts monitoring `socket` of `ctx`; call it before the socket connects
  // or binds, so that no connection is missed. `algorithm` is a congestion
  // control name, "" to leave the host's; `name` says which link it is in
  // log lines. Never throws:
  // a monitor that cannot start is logged and the socket runs without it.
  // `socket` must outlive this object.
  // `long_notsent_lowat` (bytes, 0: none): TCP_NOTSENT_LOWAT on each
  // connection whose handshake took `long_rtt_us` or more there and back,
  // so that the kernel holds little more than the window can send and the
  // sender chooses late which connection takes what (links.hpp,
  // fragments.hpp).
  CongestionMonitor(zmq::context_t& ctx, zmq::socket_t& socket, std::string algorithm,
                    std::string name, int long_notsent_lowat = 0, uint32_t long_rtt_us = 5000);
  // Stops the monitor, then closes its socket (linger 0), so that the
  // monitored socket may close and the context end without waiting on it.
  ~CongestionMonitor();
  CongestionMonitor(const CongestionMonitor&) = delete;
  CongestionMonitor& operator=(const CongestionMonitor&) = delete;

  // Applies the algorithm to the connections opened since the last call.
  // Never blocks: one non-blocking receive when nothing is waiting.
  void poll();
  // What to poll for ZMQ_POLLIN to learn of a new connection; null when the
  // monitor did not start.
  void* handle() { return pair_.handle(); }
  // The congestion control read back from the newest connection; "" before
  // the first one.
  const std::string& applied() const { return applied_; }
  // The connections open now, their tcpi_bytes_acked and
  // tcpi_total_retrans summed.
  TcpCounters counters();
  // An accepted connection from host `ip` (as zmq's Peer-Address names it)
  // is open whose handshake took `long_rtt_us` or more there and back.
  bool long_peer(const std::string& ip) const;

 private:
  void apply(int fd, const std::string& address, bool accepted);
  void forget(int fd);
  // Once per socket: why `algorithm_` was refused, what is used instead
  // (`in_effect`, "" when unknown) and how to allow it.
  // Once per link (name and end) and cause in the process.
  void warn(int err, const std::string& in_effect, bool accepted);

  zmq::socket_t& socket_;
  zmq::socket_t pair_;  // receives the monitor's events; closed when not monitoring
  bool monitoring_ = false;
  std::string algorithm_;
  int long_notsent_lowat_ = 0;
  uint32_t long_rtt_us_ = 5000;
  std::string name_;
  std::string applied_;
  bool warned_ = false;
  // The connections open now: descriptor, the port checked against it
  // (descriptors are reused once closed), and which end it is.
  struct Connection {
    int fd;
    unsigned port;
    bool accepted;
    std::string long_peer;  // accepted over a long path: the peer's address, else ""
  };
  std::vector<Connection> connections_;
};

}  // namespace fedwan::transport
