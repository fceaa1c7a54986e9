#include "transport/links.hpp"

#include <cerrno>
#include <thread>

#include "common/log.hpp"
#include "wire/frame.hpp"
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
                           const LinkOptions& options, SecurityFactory security,
                           LinkAdmission admission)
    : socket_(ctx, zmq::socket_type::router),
      factory_(std::move(security)),
      admission_(std::move(admission)),
      guard_(admission_.handshakes) {
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

namespace {

// The peer's address ("tcp://1.2.3.4:5678" for TCP), or "local".
std::string source_of(const zmq::message_t& msg) {
  const char* a = zmq_msg_gets(const_cast<zmq_msg_t*>(msg.handle()), "Peer-Address");
  return a != nullptr && *a != '\0' ? std::string(a) : std::string("local");
}

// An unsealed kHandshake frame that names a cipher: a child's ClientHello,
// the start of a TLS handshake (transport/secure_channel.hpp).
bool is_client_hello(const zmq::message_t& msg) {
  const auto* d = static_cast<const uint8_t*>(msg.data());
  return msg.size() >= wire::kHeaderSize && d[0] == 'F' && d[1] == 'W' && d[2] == 'A' &&
         d[3] == 'N' && d[5] == static_cast<uint8_t>(wire::MsgType::kHandshake) && d[6] != 0 &&
         (d[7] & 0x80) == 0;
}

}  // namespace

void ChildrenLink::drop(const std::string& peer, const std::string& source,
                        const std::string& why, size_t bytes, bool tell_peer) {
  counters_.rejected += 1;
  if (admission_.on_drop) admission_.on_drop(peer, source, why, bytes);
  if (!tell_peer || !may_refuse()) return;
  try {
    zmq::message_t rid(peer.data(), peer.size());
    if (!socket_.send(rid, zmq::send_flags::dontwait | zmq::send_flags::sndmore)) return;
    const std::vector<uint8_t> reply =
        plain_reject_frame(admission_.job_id, admission_.self_index, why);
    zmq::message_t body(reply.data(), reply.size());
    socket_.send(body, zmq::send_flags::none);
  } catch (const zmq::error_t&) {
    // Gone already; the refusal is recorded.
  }
}

bool ChildrenLink::may_refuse() {
  // A peer with no session can only be told in plain text, and only so
  // often: a flood gets no flood of answers.
  const auto now = Clock::now();
  if (now - reply_window_ >= std::chrono::seconds(1)) {
    reply_window_ = now;
    replies_in_window_ = 0;
  }
  return ++replies_in_window_ <= 20;
}

void ChildrenLink::expire_handshakes() {
  const auto now = Clock::now();
  if (now < next_expiry_) return;
  next_expiry_ = now + Millis(100);
  for (const std::string& peer : guard_.expire(now)) {
    auto it = security_.find(peer);
    if (it == security_.end()) continue;
    it->second->abandon_handshake();
    // A peer that never had a session keeps nothing here.
    if (!it->second->established()) security_.erase(it);
    drop(peer, "", "TLS handshake did not complete within " +
                       std::to_string(guard_.options().timeout.count()) + " ms; its state was dropped",
         0, false);
  }
}

bool ChildrenLink::recv(Incoming* out, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    expire_handshakes();
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
    if (admission_.refusal) {
      const std::string why = admission_.refusal(peer);
      if (!why.empty()) {
        // Never authorizable: no state is kept for it, whatever it sends.
        drop(peer, source_of(msg), why, msg.size(), true);
        continue;
      }
    }
    if (is_client_hello(msg)) {
      const std::string source = source_of(msg);
      const HandshakeGuard::Verdict v = guard_.start(peer, source, Clock::now());
      if (v != HandshakeGuard::Verdict::kAdmit) {
        drop(peer, source, std::string("TLS handshake not started: ") + handshake_verdict_text(v),
             msg.size(), false);
        continue;
      }
    }
    std::string why;
    size_t frame_size = 0;
    SecurityReplies replies;
    ChannelSecurity& security = security_for(peer);
    const auto r = security.receive(static_cast<uint8_t*>(msg.data()), msg.size(), &frame_size,
                                    &why, &replies);
    if (guard_.pending(peer) && !security.handshaking()) guard_.finish(peer);
    for (auto& reply : replies) {
      // Best effort, never blocking: a peer that does not read its handshake
      // replies times out on its side. Plain refusals share the budget of
      // drop()'s.
      if (reply.size() > 5 && reply[5] == static_cast<uint8_t>(wire::MsgType::kReject) &&
          !may_refuse()) {
        continue;
      }
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
