#include "transport/links.hpp"

#include <mutex>
#include <utility>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "wire/frame.hpp"

namespace fedwan {
namespace {

using Clock = std::chrono::steady_clock;
using transport::SendResult;

// Tries `send_once` until it is not kFull or the deadline passes, waiting
// for room in between. Returns the last result (kFull: timed out).
template <typename SendOnce>
SendResult send_with_deadline(transport::Transport& t, transport::Socket& s, Millis timeout,
                              SendOnce send_once) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const SendResult r = send_once();
    if (r != SendResult::kFull) return r;
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (left.count() <= 0) return r;
    // A server reports room when any peer has some: wait briefly and retry.
    (void)t.wait({&s}, std::min(left, Millis(10)), /*for_send=*/true);
  }
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
  return [job_id, self_index, sink = std::move(sink)](const std::string& peer) {
    return std::make_unique<PlaintextSecurity>(job_id, self_index, sink, peer);
  };
}

// ---- ParentLink -------------------------------------------------------------

ParentLink::ParentLink(transport::Transport& transport, const std::string& endpoint,
                       const std::string& self_id, const LinkOptions& options,
                       const SecurityFactory& security)
    : transport_(transport), endpoint_(endpoint), security_(security(endpoint)) {
  try {
    socket_ = transport_.connect(endpoint, self_id, options);
  } catch (const TransportError& e) {
    throw TransportError("cannot connect to parent at " + endpoint + ": " + e.what());
  }
  SecurityReplies first;
  security_->start(&first);
  send_replies(first);
}

ParentLink::~ParentLink() {
  if (!security_->established()) socket_->set_linger(Millis(0));
}

void ParentLink::abandon() { socket_->set_linger(Millis(0)); }

void ParentLink::send_replies(SecurityReplies& replies) {
  for (auto& r : replies) {
    // A connecting client queues the message; a full window during a
    // handshake means the parent is gone, which the caller's timeout reports.
    try {
      if (socket_->try_send("", r.data(), r.size()) == SendResult::kSent) {
        counters_.frames_sent += 1;
        counters_.bytes_sent += r.size();
      }
    } catch (const TransportError& e) {
      throw TransportError("send to parent " + endpoint_ + " failed: " + e.what());
    }
  }
  replies.clear();
}

void ParentLink::check_failure() const {
  if (!security_->failure().empty()) {
    throw CryptoError("secure channel to parent " + endpoint_ + " failed: " + security_->failure());
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
  const SendResult r = send_with_deadline(transport_, *socket_, timeout,
                                          [&] { return socket_->try_send("", frame.data(), n); });
  if (r != SendResult::kSent) {
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
  size_t n = 0;
  const SendResult r = socket_->try_send_with("", [&] {
    std::vector<uint8_t> bytes(frame);
    security_->seal(bytes);
    n = bytes.size();
    return bytes;
  });
  if (r != SendResult::kSent) return std::nullopt;
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
  return n;
}

bool ParentLink::recv(Incoming* out, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    transport::Received in;
    if (!socket_->try_recv(&in)) {
      const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
      if (left.count() <= 0 || !transport_.wait({socket_.get()}, left)) return false;
      continue;
    }
    counters_.frames_received += 1;
    counters_.bytes_received += in.message.size();
    std::string why;
    size_t frame_size = 0;
    SecurityReplies replies;
    const auto r =
        security_->receive(in.message.data(), in.message.size(), &frame_size, &why, &replies);
    send_replies(replies);
    if (r != ChannelSecurity::Inbound::kFrame) {
      if (r == ChannelSecurity::Inbound::kRejected) counters_.rejected += 1;
      check_failure();
      continue;
    }
    out->peer = endpoint_;
    out->message = std::move(in.message);
    out->frame_size = frame_size;
    return true;
  }
}

// ---- ChildrenLink -----------------------------------------------------------

ChildrenLink::ChildrenLink(transport::Transport& transport, const std::string& bind_endpoint,
                           const LinkOptions& options, SecurityFactory security,
                           LinkAdmission admission)
    : transport_(transport),
      socket_(transport.bind(bind_endpoint, options)),
      factory_(std::move(security)),
      admission_(std::move(admission)),
      guard_(admission_.handshakes) {}

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
  const SendResult r = send_with_deadline(transport_, *socket_, timeout,
                                          [&] { return socket_->try_send(peer, frame.data(), n); });
  if (r == SendResult::kNoPeer) throw TransportError("child '" + peer + "' is not connected");
  if (r != SendResult::kSent) {
    throw TimeoutError("send to child '" + peer + "' blocked for " +
                       std::to_string(timeout.count()) + " ms: the child is not reading");
  }
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
  return n;
}

std::optional<size_t> ChildrenLink::try_send(const std::string& peer,
                                             const std::vector<uint8_t>& frame) {
  size_t n = 0;
  // Sealed only once the window has room: a refused frame takes no sequence
  // number.
  const SendResult r = socket_->try_send_with(peer, [&] {
    std::vector<uint8_t> bytes(frame);
    security_for(peer).seal(bytes);
    n = bytes.size();
    return bytes;
  });
  if (r == SendResult::kNoPeer) throw TransportError("child '" + peer + "' is not connected");
  if (r != SendResult::kSent) return std::nullopt;
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
  return n;
}

void ChildrenLink::send_unsealed(const std::string& peer, const std::vector<uint8_t>& bytes) {
  try {
    if (socket_->try_send(peer, bytes.data(), bytes.size()) == SendResult::kSent) {
      counters_.frames_sent += 1;
      counters_.bytes_sent += bytes.size();
    }
  } catch (const TransportError& e) {
    log().debug("reply to '{}' not delivered: {}", peer, e.what());
  }
}

namespace {

// An unsealed kHandshake frame that names a cipher: a child's ClientHello,
// the start of a TLS handshake (transport/secure_channel.hpp).
bool is_client_hello(const transport::Message& msg) {
  const uint8_t* d = msg.data();
  return msg.size() >= wire::kHeaderSize && d[0] == 'F' && d[1] == 'W' && d[2] == 'A' &&
         d[3] == 'N' && d[5] == static_cast<uint8_t>(wire::MsgType::kHandshake) && d[6] != 0 &&
         (d[7] & 0x80) == 0;
}

}  // namespace

void ChildrenLink::drop(const std::string& peer, const std::string& source, const std::string& why,
                        size_t bytes, bool tell_peer) {
  counters_.rejected += 1;
  if (admission_.on_drop) admission_.on_drop(peer, source, why, bytes);
  if (!tell_peer || !may_refuse()) return;
  // Plain refusals were never counted as frames sent.
  const std::vector<uint8_t> reply =
      plain_reject_frame(admission_.job_id, admission_.self_index, why);
  try {
    (void)socket_->try_send(peer, reply.data(), reply.size());
  } catch (const TransportError&) {
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
    drop(peer, "",
         "TLS handshake did not complete within " +
             std::to_string(guard_.options().timeout.count()) + " ms; its state was dropped",
         0, false);
  }
}

bool ChildrenLink::recv(Incoming* out, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    expire_handshakes();
    transport::Received in;
    if (!socket_->try_recv(&in)) {
      const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
      if (left.count() <= 0 || !transport_.wait({socket_.get()}, left)) return false;
      continue;
    }
    counters_.frames_received += 1;
    counters_.bytes_received += in.message.size();
    std::string peer = std::move(in.peer);
    if (in.malformed) {
      counters_.rejected += 1;
      continue;
    }
    if (admission_.refusal) {
      const std::string why = admission_.refusal(peer);
      if (!why.empty()) {
        // Never authorizable: no state is kept for it, whatever it sends.
        drop(peer, in.source, why, in.message.size(), true);
        continue;
      }
    }
    if (is_client_hello(in.message)) {
      const HandshakeGuard::Verdict v = guard_.start(peer, in.source, Clock::now());
      if (v != HandshakeGuard::Verdict::kAdmit) {
        drop(peer, in.source,
             std::string("TLS handshake not started: ") + handshake_verdict_text(v),
             in.message.size(), false);
        continue;
      }
    }
    std::string why;
    size_t frame_size = 0;
    SecurityReplies replies;
    ChannelSecurity& security = security_for(peer);
    const auto r =
        security.receive(in.message.data(), in.message.size(), &frame_size, &why, &replies);
    if (guard_.pending(peer) && !security.handshaking()) guard_.finish(peer);
    for (auto& reply : replies) {
      // Best effort, never blocking: a peer that does not read its handshake
      // replies times out on its side. Plain refusals share the budget of
      // drop()'s.
      if (reply.size() > 5 && reply[5] == static_cast<uint8_t>(wire::MsgType::kReject) &&
          !may_refuse()) {
        continue;
      }
      send_unsealed(peer, reply);
    }
    if (r != ChannelSecurity::Inbound::kFrame) {
      if (r == ChannelSecurity::Inbound::kRejected) counters_.rejected += 1;
      continue;
    }
    out->peer = std::move(peer);
    out->message = std::move(in.message);
    out->frame_size = frame_size;
    return true;
  }
}

}  // namespace fedwan
