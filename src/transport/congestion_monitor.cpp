#include "transport/congestion_monitor.hpp"

#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_acked (glibc's lacks it)
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "common/errno_text.hpp"
#include "common/log.hpp"

namespace fedwan::transport {
namespace {

// The kernel's TCP_CA_NAME_MAX, its terminating NUL included.
constexpr size_t kNameBytes = 16;

// libzmq 4.3's first event frame: uint16 event, uint32 value, host order.
constexpr size_t kEventBytes = 6;

// The first line of a /proc file, "" when it cannot be read.
std::string proc_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The congestion control `fd` uses, "" when it cannot be read.
std::string congestion_of(int fd) {
  char buf[kNameBytes] = {};
  socklen_t len = sizeof buf;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, buf, &len) != 0) return "";
  return std::string(buf, ::strnlen(buf, len));
}

// The port `address` ("tcp://HOST:PORT") ends with; 0 when it names none.
unsigned port_of(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return 0;
  unsigned port = 0;
  for (size_t i = colon + 1; i < address.size(); ++i) {
    const char c = address[i];
    if (c < '0' || c > '9' || port > 65535) return 0;
    port = port * 10 + static_cast<unsigned>(c - '0');
  }
  return port <= 65535 ? port : 0;
}

// The port of `fd`'s own end (`local`) or of its peer; 0 when unknown.
unsigned socket_port(int fd, bool local) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  auto* sa = reinterpret_cast<sockaddr*>(&a);
  if ((local ? ::getsockname(fd, sa, &len) : ::getpeername(fd, sa, &len)) != 0) return 0;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return 0;
}

// The peer's address as zmq's Peer-Address property gives it (numeric, by
// getnameinfo); "" when unknown.
std::string peer_ip(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, nullptr, 0,
                    NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

// inproc:// names are per context; one counter keeps them apart in any.
std::string monitor_address() {
  static std::atomic<uint64_t> next{0};
  return "inproc://fedwan-congestion-monitor-" + std::to_string(next.fetch_add(1));
}

}  // namespace

CongestionMonitor::CongestionMonitor(zmq::context_t& ctx, zmq::socket_t& socket,
                                     std::string algorithm, std::string name,
                                     int long_notsent_lowat, uint32_t long_rtt_us)
    : socket_(socket),
      algorithm_(std::move(algorithm)),
      long_notsent_lowat_(long_notsent_lowat),
      long_rtt_us_(long_rtt_us),
      name_(std::move(name)) {
  const std::string address = monitor_address();
  if (zmq_socket_monitor(socket_.handle(), address.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_CLOSED) != 0) {
    log().warn("[transport] {}: cannot watch its connections ({}); TCP congestion control "
               "'{}' is not set, the host's default is used",
               name_, zmq_strerror(zmq_errno()), algorithm_);
    return;
  }
  monitoring_ = true;
  try {
    pair_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    pair_.set(zmq::sockopt::linger, 0);
    // Unbounded: libzmq sends events with a blocking send from its I/O
    // thread, which a full pipe would stall. Events are rare (one per
    // connection) and drained whenever the socket is used.
    pair_.set(zmq::sockopt::rcvhwm, 0);
    pair_.connect(address);
  } catch (const zmq::error_t& e) {
    log().warn("[transport] {}: cannot watch its connections ({}); TCP congestion control "
               "'{}' is not set, the host's default is used",
               name_, e.what(), algorithm_);
    (void)zmq_socket_monitor(socket_.handle(), nullptr, 0);
    monitoring_ = false;
    pair_.close();
  }
}

CongestionMonitor::~CongestionMonitor() {
  if (monitoring_) (void)zmq_socket_monitor(socket_.handle(), nullptr, 0);
  pair_.close();
}

void CongestionMonitor::poll() {
  if (!monitoring_) return;
  try {
    for (;;) {
      zmq::message_t event;
      if (!pair_.recv(event, zmq::recv_flags::dontwait)) return;
      // The two frames of an event arrive together, or not at all.
      zmq::message_t address;
      if (!event.more() || !pair_.recv(address, zmq::recv_flags::dontwait)) continue;
      while (address.more()) {
        zmq::message_t extra;
        if (!pair_.recv(extra, zmq::recv_flags::dontwait)) break;
        if (!extra.more()) break;
      }
      if (event.size() < kEventBytes) continue;
      uint16_t id = 0;
      uint32_t value = 0;
      std::memcpy(&id, event.data(), sizeof id);
      std::memcpy(&value, static_cast<const uint8_t*>(event.data()) + sizeof id, sizeof value);
      if (id == ZMQ_EVENT_CONNECTED || id == ZMQ_EVENT_ACCEPTED) {
        apply(static_cast<int>(value), address.to_string(), id == ZMQ_EVENT_ACCEPTED);
      } else if (id == ZMQ_EVENT_DISCONNECTED || id == ZMQ_EVENT_CLOSED) {
        forget(static_cast<int>(value));
      }
    }
  } catch (const zmq::error_t& e) {
    // The context is ending: the socket is about to close anyway.
    log().debug("[transport] {}: connection monitor stopped: {}", name_, e.what());
    (void)zmq_socket_monitor(socket_.handle(), nullptr, 0);
    monitoring_ = false;
  }
}

void CongestionMonitor::apply(int fd, const std::string& address, bool accepted) {
  // The event may be read after its connection closed and the descriptor
  // went to something else: apply nothing to a socket that is not that
  // connection (an accepted one shares the listener's port, a connected
  // one's peer has the endpoint's port).
  const unsigned want = port_of(address);
  if (want != 0 && socket_port(fd, accepted) != want) {
    log().debug("[transport] {}: connection (fd {}) closed before its congestion control was set",
                name_, fd);
    return;
  }
  forget(fd);
  connections_.push_back({fd, socket_port(fd, accepted), accepted, {}});
  tcp_info info{};
  socklen_t len = sizeof info;
  // The handshake's round trip is the first sample.
  const bool long_path =
      ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 && info.tcpi_rtt >= long_rtt_us_;
  if (long_path && accepted) connections_.back().long_peer = peer_ip(fd);
  if (long_notsent_lowat_ > 0) {
    if (long_path && ::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &long_notsent_lowat_,
                                  sizeof long_notsent_lowat_) == 0) {
      log().debug("[transport] {}: connection {} (fd {}, {} us round trip) keeps at most {} "
                  "bytes unsent in the kernel",
                  name_, address, fd, info.tcpi_rtt, long_notsent_lowat_);
    }
  }
  if (algorithm_.empty()) return;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm_.data(),
                   static_cast<socklen_t>(algorithm_.size())) != 0) {
    const int err = errno;
    if (err == EBADF || err == ENOTSOCK || err == ENOPROTOOPT || err == EOPNOTSUPP) {
      log().debug("[transport] {}: connection (fd {}) closed before its congestion control was set",
                  name_, fd);
      return;
    }
    const std::string in_effect = congestion_of(fd);
    if (!in_effect.empty()) applied_ = in_effect;
    warn(err, in_effect, accepted);
    return;
  }
  const std::string in_effect = congestion_of(fd);
  if (!in_effect.empty()) applied_ = in_effect;
  log().debug("[transport] {}: connection {} (fd {}) uses TCP congestion control '{}'", name_,
              address, fd, in_effect);
}

void CongestionMonitor::forget(int fd) {
  for (size_t i = 0; i < connections_.size(); ++i) {
    if (connections_[i].fd == fd) {
      connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

bool CongestionMonitor::long_peer(const std::string& ip) const {
  if (ip.empty()) return false;
  for (const Connection& c : connections_) {
    if (c.long_peer == ip) return true;
  }
  return false;
}

TcpCounters CongestionMonitor::counters() {
  poll();
  TcpCounters total;
  for (size_t i = 0; i < connections_.size();) {
    const Connection& c = connections_[i];
    tcp_info info{};
    socklen_t len = sizeof info;
    // A descriptor closed and reused behind the monitor's back is dropped.
    if (socket_port(c.fd, c.accepted) != c.port ||
        ::getsockopt(c.fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) {
      connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    total.acked += info.tcpi_bytes_acked;
    total.retransmits += info.tcpi_total_retrans;
    total.rtt_us = std::max(total.rtt_us, info.tcpi_rtt);
    total.window += static_cast<uint64_t>(info.tcpi_snd_cwnd) * info.tcpi_snd_mss;
    ++i;
  }
  return total;
}

void CongestionMonitor::warn(int err, const std::string& in_effect, bool accepted) {
  if (warned_) return;
  warned_ = true;
  {
    // Once per link and cause in a process: a site that reconnects to its
    // parent makes a new socket, and the host has not changed meanwhile.
    static std::mutex mu;
    static std::set<std::string> warned_links;
    std::lock_guard<std::mutex> lock(mu);
    if (!warned_links
             .insert(name_ + (accepted ? "\naccepted\n" : "\nconnected\n") + algorithm_ + "\n" +
                     std::to_string(err))
             .second) {
      log().debug("[transport] {}: TCP congestion control '{}' could not be set (warned before)",
                  name_, algorithm_);
      return;
    }
  }
  const std::string allowed = proc_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
  const std::string allow = "sysctl -w net.ipv4.tcp_allowed_congestion_control=\"" +
                            (allowed.empty() ? std::string() : allowed + " ") + algorithm_ + "\"";
  std::string why;
  std::string fix;
  if (err == EPERM) {
    why = "EPERM: the host does not allow it to unprivileged processes";
    fix = "allow it as root with `" + allow + "`";
  } else if (err == ENOENT) {
    why = "ENOENT: the kernel does not have it";
    fix =
        "load it as root with `modprobe tcp_" + algorithm_ + "` and allow it with `" + allow + "`";
  } else {
    why = errno_text(err);
    fix = "check the name against /proc/sys/net/ipv4/tcp_available_congestion_control";
  }
  log().warn("[transport] {}: TCP congestion control '{}' could not be set ({}); its "
             "connections use the host's default{} instead. To use {}, {}; or set "
             "tcp_congestion: system in the topology to keep the host's default without this "
             "warning. Over a long, lossy link under CUBIC, several connections per link "
             "recover much of what one loses: `streams: auto` (the default) opens them as they "
             "pay (docs/topology.md)",
             name_, algorithm_, why, in_effect.empty() ? std::string() : " '" + in_effect + "'",
             algorithm_, fix);
}

}  // namespace fedwan::transport
