#include "transport/links.hpp"

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
    zmq::poll(&item, 1, std::min(left, Millis(10)));
  }
}

bool wait_readable(zmq::socket_t& s, Millis timeout) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  return zmq::poll(&item, 1, timeout) > 0;
}

}  // namespace

SecurityFactory plaintext_security_factory() {
  static std::once_flag warned;
  std::call_once(warned, [] {
    log().warn("links are plaintext: not authenticated or encrypted in this release; "
               "run only on a trusted network (see docs/security.md)");
  });
  return [](const std::string&) { return std::make_unique<PlaintextSecurity>(); };
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
}

size_t ParentLink::send(std::vector<uint8_t> frame, Millis timeout) {
  security_->seal(frame);
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
    if (!security_->open(static_cast<uint8_t*>(msg.data()), msg.size(), &frame_size, &why)) {
      counters_.rejected += 1;
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
    std::string why;
    size_t frame_size = 0;
    if (extra || !security_for(peer).open(static_cast<uint8_t*>(msg.data()), msg.size(),
                                           &frame_size, &why)) {
      counters_.rejected += 1;
      continue;
    }
    out->peer = std::move(peer);
    out->message = std::move(msg);
    out->frame_size = frame_size;
    return true;
  }
}

}  // namespace fedwan
