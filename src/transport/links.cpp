#include "transport/links.hpp"

#include <cerrno>
#include <thread>

#include "common/log.hpp"
#include "fedwan/error.hpp"

#include <mutex>

namespace fedwan {
namespace {

using Clock = std::chrono::steady_clock;

void configure(zmq::socket_t& s, const LinkOptions& o) {
  s.set(zmq::sockopt::sndhwm, o.window);
  s.set(zmq::sockopt::rcvhwm, o.window);
  s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
  s.set(zmq::sockopt::linger, o.linger_ms);
}

}  // namespace

int poll_items(zmq::pollitem_t* items, size_t count, Millis timeout) {
  try {
    return zmq::poll(items, count, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;
    throw;
  }
}

namespace {

// Sends without blocking; on a full window waits for POLLOUT until the
// deadline. Returns false on timeout; throws on a hard error.
template <typename SendOnce>
bool send_with_deadline(zmq::socket_t& s, Millis timeout, SendOnce send_once) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (send_once()) return true;
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLOUT, 0};
    // ROUTER reports POLLOUT when any peer has room: wait briefly and retry.
    poll_items(&item, 1, std::min(left, Millis(10)));
  }
}

bool wait_readable(zmq::socket_t& s, Millis timeout) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  return poll_items(&item, 1, timeout) > 0;
}

}  // namespace

SecurityFactory plaintext_security_factory(uint64_t job_id, uint32_t self_index,
                                           LinkEventSink sink) {
  static std::once_flag warned;
  std::call_once(warned, [] {
    log().error("INSECURE: --insecure-plaintext: links are NOT authenticated or encrypted. "
                "Anyone on the network can read the model and impersonate nodes, and secure "
                "nodes will refuse this one. Use only for loopback experiments "
                "(see docs/security.md)");
  });
  return [job_id, self_index, sink](const std::string& peer) {
    return std::make_unique<PlaintextSecurity>(job_id, self_index, sink, peer);
  };
}

// ---- ParentLink -------------------------------------------------------------

ParentLink::ParentLink(zmq::context_t& ctx, const std::string& endpoint,
                       const std::string& self_id, const LinkOptions& options,
                       SecurityFactory security)
    : socket_(ctx, zmq::socket_type::dealer), endpoint_(endpoint), security_(security(endpoint)) {
  try {
    configure(socket_, options);
    socket_.set(zmq::sockopt::routing_id, self_id);
    socket_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw TransportError("cannot connect to parent at " + endpoint + ": " + e.what());
  }
  SecurityReplies first;
  security_->start(&first);
  send_replies(first);
}

ParentLink::~ParentLink() {
  if (!security_->established()) {
    try {
      socket_.set(zmq::sockopt::linger, 0);
    } catch (const zmq::error_t&) {
      // Closing anyway.
    }
  }
}

void ParentLink::abandon() {
  try {
    socket_.set(zmq::sockopt::linger, 0);
  } catch (const zmq::error_t&) {
    // Closing anyway.
  }
}

void ParentLink::send_replies(SecurityReplies& replies) {
  for (auto& r : replies) {
    zmq::message_t msg(r.data(), r.size());
    // A connecting DEALER queues the message for the pipe; a full window
    // during a handshake means the parent is gone, which the caller's
    // timeout reports.
    try {
      if (socket_.send(msg, zmq::send_flags::dontwait)) {
        counters_.frames_sent += 1;
        counters_.bytes_sent += r.size();
      }
    } catch (const zmq::error_t& e) {
      throw TransportError("send to parent " + endpoint_ + " failed: " + e.what());
    }
  }
  replies.clear();
}

void ParentLink::check_failure() const {
  if (!security_->failure().empty()) {
    throw CryptoError("secure channel to parent " + endpoint_ + " failed: " +
                      security_->failure());
  }
}

void ParentLink::wait_established(Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!security_->established()) {
    check_failure();
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw TimeoutError("TLS handshake with parent " + endpoint_ + " did not complete within " +
                         std::to_string(timeout.count()) +
                         " ms: is the parent running, with its credentials?");
    }
    Incoming ignored;
    // Nothing but handshake messages can arrive before the session is up.
    (void)recv(&ignored, std::min(left, Millis(50)));
  }
}

size_t ParentLink::send(std::vector<uint8_t> frame, Millis timeout) {
  const auto start = Clock::now();
  wait_established(timeout);
  timeout -= std::chrono::duration_cast<Millis>(Clock::now() - start);
  security_->seal(frame);
  return send_sealed(std::move(frame), timeout);
}

size_t ParentLink::send_sealed(std::vector<uint8_t> frame, Millis timeout) {
  const size_t n = frame.size();
  zmq::message_t msg(frame.data(), n);
  const bool sent = send_with_deadline(socket_, timeout, [&] {
    try {
      return socket_.send(msg, zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t& e) {
      throw TransportError("send to parent " + endpoint_ + " failed: " + e.what());
    }
  });
  if (!sent) {
    throw TimeoutError("send to parent " + endpoint_ + " blocked for " +
                       std::to_string(timeout.count()) + " ms: the parent is not reading");
  }
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
  return n;
}

std::optional<size_t> ParentLink::try_send(const std::vector<uint8_t>& frame) {
  check_failure();
  if (!security_->established()) return std::nullopt;
  try {
    if (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLOUT)) return std::nullopt;
    std::vector<uint8_t> bytes(frame);
    security_->seal(bytes);
    zmq::message_t msg(bytes.data(), bytes.size());
    // POLLOUT guarantees room for one message, so this does not fail.
    if (!socket_.send(msg, zmq::send_flags::dontwait)) return std::nullopt;
    counters_.frames_sent += 1;
    counters_.bytes_sent += bytes.size();
    return bytes.size();
  } catch (const zmq::error_t& e) {
    throw TransportError("send to parent " + endpoint_ + " failed: " + e.what());
  }
}

bool ParentLink::recv(Incoming* out, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (!wait_readable(socket_, std::max(left, Millis(0)))) return false;
    zmq::message_t msg;
    if (!socket_.recv(msg, zmq::recv_flags::dontwait)) continue;
    counters_.frames_received += 1;
    counters_.bytes_received += msg.size();
    std::string why;
    size_t frame_size = 0;
    SecurityReplies replies;
    const auto r = security_->receive(static_cast<uint8_t*>(msg.data()), msg.size(), &frame_size,
                                      &why, &replies);
    send_replies(replies);
    if (r != ChannelSecurity::Inbound::kFrame) {
      if (r == ChannelSecurity::Inbound::kRejected) counters_.rejected += 1;
      check_failure();
      continue;
    }
    out->peer = endpoint_;
    out->message = std::move(msg);
    out->frame_size = frame_size;
    return true;
  }
}

// ---- ChildrenLink -----------------------------------------------------------

ChildrenLink::ChildrenLink(zmq::context_t& ctx, const std::string& bind_endpoint,
                           const LinkOptions& options, SecurityFactory security)
    : socket_(ctx, zmq::socket_type::router), factory_(std::move(security)) {
  try {
    configure(socket_, options);
    // Fail loudly on unroutable peers instead of dropping silently, and let a
    // reconnecting child take over its routing id.
    socket_.set(zmq::sockopt::router_mandatory, 1);
    socket_.set(zmq::sockopt::router_handover, 1);
    socket_.bind(bind_endpoint);
  } catch (const zmq::error_t& e) {
    throw TransportError("cannot bind " + bind_endpoint + ": " + e.what() +
                         " (is another process using the port?)");
  }
}

bool ChildrenLink::established(const std::string& peer) const {
  auto it = security_.find(peer);
  return it != security_.end() && it->second->established();
}

ChannelSecurity& ChildrenLink::security_for(const std::string& peer) {
  auto it = security_.find(peer);
  if (it == security_.end()) it = security_.emplace(peer, factory_(peer)).first;
  return *it->second;
}

size_t ChildrenLink::send(const std::string& peer, std::vector<uint8_t> frame, Millis timeout) {
  security_for(peer).seal(frame);
  const size_t n = frame.size();
  bool sent = false;
  try {
    sent = send_with_deadline(socket_, timeout, [&] {
      zmq::message_t id(peer.data(), peer.size());
      zmq::message_t body(frame.data(), n);
      if (!socket_.send(id, zmq::send_flags::dontwait | zmq::send_flags::sndmore)) return false;
      // Once the routing frame is accepted the body always goes with it.
      socket_.send(body, zmq::send_flags::none);
      return true;
    });
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) {
      throw TransportError("child '" + peer + "' is not connected");
    }
    throw TransportError("send to child '" + peer + "' failed: " + e.what());
  }
  if (!sent) {
    throw TimeoutError("send to child '" + peer + "' blocked for " +
                       std::to_string(timeout.count()) + " ms: the child is not reading");
  }
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
  return n;
}

std::optional<size_t> ChildrenLink::try_send(const std::string& peer,
                                             const std::vector<uint8_t>& frame) {
  try {
    zmq::message_t id(peer.data(), peer.size());
    // With ROUTER_MANDATORY a full window refuses the routing frame, before
    // anything is sealed.
    if (!socket_.send(id, zmq::send_flags::dontwait | zmq::send_flags::sndmore)) {
      return std::nullopt;
    }
    std::vector<uint8_t> bytes(frame);
    security_for(peer).seal(bytes);
    zmq::message_t body(bytes.data(), bytes.size());
    socket_.send(body, zmq::send_flags::none);
    counters_.frames_sent += 1;
    counters_.bytes_sent += bytes.size();
    return bytes.size();
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) throw TransportError("child '" + peer + "' is not connected");
    throw TransportError("send to child '" + peer + "' failed: " + e.what());
  }
}

bool ChildrenLink::recv(Incoming* out, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (!wait_readable(socket_, std::max(left, Millis(0)))) return false;
    zmq::message_t id;
    if (!socket_.recv(id, zmq::recv_flags::dontwait)) continue;
    zmq::message_t msg;
    bool extra = false;
    (void)socket_.recv(msg, zmq::recv_flags::none);
    // A well-behaved DEALER sends exactly one frame per message; drain extras.
    while (msg.more()) {
      zmq::message_t skip;
      (void)socket_.recv(skip, zmq::recv_flags::none);
      extra = true;
      if (!skip.more()) break;
    }
    counters_.frames_received += 1;
    counters_.bytes_received += msg.size();
    std::string peer = id.to_string();
    if (extra) {
      counters_.rejected += 1;
      continue;
    }
    std::string why;
    size_t frame_size = 0;
    SecurityReplies replies;
    const auto r = security_for(peer).receive(static_cast<uint8_t*>(msg.data()), msg.size(),
                                              &frame_size, &why, &replies);
    for (auto& reply : replies) {
      // Best effort, never blocking: a peer that does not read its handshake
      // replies times out on its side.
      try {
        zmq::message_t rid(peer.data(), peer.size());
        if (!socket_.send(rid, zmq::send_flags::dontwait | zmq::send_flags::sndmore)) continue;
        zmq::message_t body(reply.data(), reply.size());
        socket_.send(body, zmq::send_flags::none);
        counters_.frames_sent += 1;
        counters_.bytes_sent += reply.size();
      } catch (const zmq::error_t& e) {
        log().debug("handshake reply to '{}' not delivered: {}", peer, e.what());
      }
    }
    if (r != ChannelSecurity::Inbound::kFrame) {
      if (r == ChannelSecurity::Inbound::kRejected) counters_.rejected += 1;
      continue;
    }
    out->peer = std::move(peer);
    out->message = std::move(msg);
    out->frame_size = frame_size;
    return true;
  }
}

}  // namespace fedwan
