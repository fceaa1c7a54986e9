#include "harness/fault_proxy.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <tuple>

namespace fedwan::testing {

FaultProxy::~FaultProxy() {
  stop();
  close_fd(listen_fd_);
  close_fd(wake_read_);
  close_fd(wake_write_);
}

void FaultProxy::partition(const std::string& peer) {
  control([&](Control& c) {
    if (peer.empty()) {
      c.partitioned = true;
    } else {
      c.partitioned_peers.insert(peer);
    }
  });
}

void FaultProxy::heal(const std::string& peer) {
  control([&](Control& c) {
    if (peer.empty()) {
      c.partitioned = false;
      c.partitioned_peers.clear();
    } else {
      c.partitioned_peers.erase(peer);
    }
  });
}

bool FaultProxy::partitioned(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return control_.partitioned || (!peer.empty() && control_.partitioned_peers.count(peer) > 0);
}

void FaultProxy::set_faults(const FaultSpec& spec) {
  if (const std::string why = spec.problem(); !why.empty()) throw std::invalid_argument(why);
  control([&](Control& c) {
    c.faults = spec;
    c.faults_generation += 1;
  });
}

FaultProxyStats FaultProxy::stats() const {
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

std::vector<std::string> FaultProxy::peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_;
}

std::string FaultProxy::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void FaultProxy::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    control_.stop = true;
  }
  wake();
  thread_.join();
}

FaultProxyOptions FaultProxy::options_for(const std::string& host, int port) {
  FaultProxyOptions o;
  o.target_host = host;
  o.target_port = port;
  return o;
}

sockaddr_in FaultProxy::resolve(const std::string& host, int port) {
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

void FaultProxy::start() {
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

void FaultProxy::fail(const std::string& what, const std::string& why) {
  close_fd(listen_fd_);
  close_fd(wake_read_);
  close_fd(wake_write_);
  throw std::runtime_error("FaultProxy: " + what + " failed: " + why);
}

void FaultProxy::close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void FaultProxy::reset_fd(int& fd) {
  if (fd < 0) return;
  const linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close_fd(fd);
}

void FaultProxy::wake() {
  const char byte = 1;
  // A full pipe wakes the loop already: a failed write changes nothing.
  [[maybe_unused]] const ssize_t n = ::write(wake_write_, &byte, 1);
}

void FaultProxy::run() {
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

bool FaultProxy::apply_control() {
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

bool FaultProxy::cut_off(const Connection& c) const {
  return partitioned_ || (!c.up.peer().empty() && partitioned_peers_.count(c.up.peer()) > 0);
}

void FaultProxy::blackhole(Connection& c) {
  c.blackholed = true;
  c.up.clear();
  c.down.clear();
}

void FaultProxy::reap() {
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

void FaultProxy::read_into(Connection& c, FaultLane& l, int fd, Clock::time_point now) {
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

void FaultProxy::write_from(Connection& c, FaultLane& l, int fd, bool& shut,
                            Clock::time_point now) {
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

void FaultProxy::discard(int& fd, short revents) {
  if (fd < 0 || !(revents & (POLLIN | POLLHUP | POLLERR))) return;
  uint8_t buf[kReadBytes];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  if (n > 0) {
    bytes_blackholed_ += static_cast<uint64_t>(n);
  } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    close_fd(fd);
  }
}

void FaultProxy::serve(Connection& c, short cev, short tev, Clock::time_point now) {
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

void FaultProxy::accept_all() {
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

int FaultProxy::poll_timeout(Clock::time_point now) const {
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

void FaultProxy::loop() {
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

}  // namespace fedwan::testing
