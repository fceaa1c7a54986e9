#include "transport/links.hpp"

#include <algorithm>
#include <mutex>
#include <utility>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "wire/frame.hpp"

namespace fedwan {

using Clock = std::chrono::steady_clock;
using transport::SendResult;

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
    : transport_(transport),
      endpoint_(endpoint),
      security_(security(endpoint)),
      reseq_(Resequencer::Options{64, Millis(options.reorder_wait_ms)}) {
  const int streams = std::max(1, options.streams);
  if (streams > 1 && security_->name() == "plaintext") {
    throw ConfigError("streams " + std::to_string(streams) +
                      " needs the secure channel: plaintext frames carry no sequence numbers "
                      "to put frames striped over several connections back in order (set "
                      "streams: 1, or run with credentials)");
  }
  try {
    for (int k = 0; k < streams; ++k) {
      const std::string id = k == 0 ? self_id : self_id + "~" + std::to_string(k);
      stripes_.push_back(transport_.connect(endpoint, id, options));
    }
  } catch (const TransportError& e) {
    throw TransportError("cannot connect to parent at " + endpoint + ": " + e.what());
  }
  SecurityReplies first;
  security_->start(&first);
  send_replies(first);
}

ParentLink::~ParentLink() {
  if (!security_->established()) abandon();
}

void ParentLink::abandon() {
  for (auto& s : stripes_) s->set_linger(Millis(0));
}

void ParentLink::watch(std::vector<transport::Transport::Interest>* out, bool writable) {
  for (auto& s : stripes_) out->push_back({s.get(), true, writable});
}

template <typename SendOn>
SendResult ParentLink::send_striped(SendOn send_on) {
  // Until the session is up only the handshake's connection is used.
  const size_t n = security_->established() ? stripes_.size() : 1;
  SendResult last = SendResult::kFull;
  for (size_t i = 0; i < n; ++i) {
    const size_t k = (next_send_ + i) % n;
    last = send_on(*stripes_[k]);
    if (last == SendResult::kSent) {
      next_send_ = (k + 1) % n;
      return last;
    }
  }
  return last;
}

bool ParentLink::wait_any(Millis timeout, bool for_send) {
  std::vector<transport::Socket*> sockets;
  for (auto& s : stripes_) sockets.push_back(s.get());
  return transport_.wait(sockets, timeout, for_send);
}

void ParentLink::send_replies(SecurityReplies& replies) {
  for (auto& r : replies) {
    // A connecting client queues the message; a full window during a
    // handshake means the parent is gone, which the caller's timeout reports.
    try {
      if (stripes_.front()->try_send("", r.data(), r.size()) == SendResult::kSent) {
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
  if (!broken_.empty()) throw CryptoError("link to parent " + endpoint_ + " failed: " + broken_);
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
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const SendResult r =
        send_striped([&](transport::Socket& s) { return s.try_send("", frame.data(), n); });
    if (r == SendResult::kSent) break;
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw TimeoutError("send to parent " + endpoint_ + " blocked for " +
                         std::to_string(timeout.count()) + " ms: the parent is not reading");
    }
    (void)wait_any(std::min(left, Millis(10)), /*for_send=*/true);
  }
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
  return n;
}

std::optional<size_t> ParentLink::try_send(const std::vector<uint8_t>& frame) {
  // A link that lost a frame takes nothing more, quietly: recv() reports it
  // and the owner reconnects. Thrown from here, it would escape the owner's
  // upkeep (a heartbeat due just after the failure) and end the node.
  if (!broken_.empty()) return std::nullopt;
  check_failure();
  if (!security_->established()) return std::nullopt;
  size_t n = 0;
  // Sealed only by the connection that takes it: a refused frame takes no
  // sequence number.
  const SendResult r = send_striped([&](transport::Socket& s) {
    return s.try_send_with("", [&] {
      std::vector<uint8_t> bytes(frame);
      security_->seal(bytes);
      n = bytes.size();
      return bytes;
    });
  });
  if (r != SendResult::kSent) return std::nullopt;
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
  return n;
}

bool ParentLink::recv(Incoming* out, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  const bool striped = stripes_.size() > 1;
  for (;;) {
    Resequencer::Frame ready;
    const bool popped = striped && reseq_.pop(&ready, Clock::now());
    if (striped && reseq_.stats().gaps_skipped > 0 && broken_.empty()) {
      // A frame that never came was lost with a connection that broke or
      // was taken over (its routing id reused): the connections are no
      // longer one ordered link. The owner's session reconnects them all
      // and the protocol catches up as after any reconnect.
      broken_ = "a frame sent over one of its " + std::to_string(stripes_.size()) +
                " connections never arrived (given up after " +
                std::to_string(reseq_.options().max_wait.count()) +
                " ms, or with too many frames held behind it)";
    }
    check_failure();
    if (popped) {
      out->peer = endpoint_;
      out->message = std::move(ready.message);
      out->frame_size = ready.frame_size;
      return true;
    }
    transport::Received in;
    bool got = false;
    for (size_t i = 0; i < stripes_.size() && !got; ++i) {
      const size_t k = (next_recv_ + i) % stripes_.size();
      if (stripes_[k]->try_recv(&in)) {
        got = true;
        next_recv_ = (k + 1) % stripes_.size();
      }
    }
    if (!got) {
      const auto now = Clock::now();
      if (now >= deadline) return false;
      auto left = std::chrono::duration_cast<Millis>(deadline - now);
      // A gap given up on releases the frames behind it without a message.
      bool gap_due = false;
      if (striped && reseq_.wake_at() < deadline) {
        left = std::max(Millis(0),
                        std::chrono::duration_cast<Millis>(reseq_.wake_at() - now) + Millis(1));
        gap_due = true;
      }
      if (!wait_any(left, /*for_send=*/false) && !gap_due) return false;
      continue;
    }
    counters_.frames_received += 1;
    counters_.bytes_received += in.message.size();
    if (in.malformed) {  // several parts: no frame of ours
      counters_.rejected += 1;
      log().debug("dropped a message of several parts from the parent {}", endpoint_);
      continue;
    }
    std::string why;
    size_t frame_size = 0;
    SecurityReplies replies;
    const auto r =
        security_->receive(in.message.data(), in.message.size(), &frame_size, &why, &replies);
    send_replies(replies);
    if (r == ChannelSecurity::Inbound::kRejected) counters_.rejected += 1;
    const std::optional<ChannelSecurity::Order> order = security_->last_order();
    if (striped && order) {
      std::optional<Resequencer::Frame> f;
      if (r == ChannelSecurity::Inbound::kFrame) {
        f = Resequencer::Frame{std::move(in.message), frame_size};
      }
      reseq_.push(*order, std::move(f), Clock::now());
      check_failure();
      continue;
    }
    if (r != ChannelSecurity::Inbound::kFrame) {
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

size_t ChildrenLink::streams_of(const std::string& child) const {
  if (!admission_.streams || !established(child)) return 1;
  return std::max<size_t>(1, admission_.streams(child));
}

size_t ChildrenLink::frames_reordering() const {
  size_t n = 0;
  for (const auto& [child, r] : reseq_) n += r.holding();
  return n;
}

template <typename SendOn>
SendResult ChildrenLink::send_striped(const std::string& peer, SendOn send_on) {
  if (suspended_.count(peer)) return SendResult::kFull;
  const size_t n = streams_of(peer);
  if (n == 1) return send_on(peer);
  size_t& next = next_send_[peer];
  bool any_full = false;
  for (size_t i = 0; i < n; ++i) {
    const size_t k = (next + i) % n;
    // A connection not (yet) open is skipped; the child is gone only when
    // none is.
    const SendResult r = send_on(k == 0 ? peer : peer + "~" + std::to_string(k));
    if (r == SendResult::kSent) {
      next = (k + 1) % n;
      return r;
    }
    any_full = any_full || r == SendResult::kFull;
  }
  return any_full ? SendResult::kFull : SendResult::kNoPeer;
}

size_t ChildrenLink::send(const std::string& peer, std::vector<uint8_t> frame, Millis timeout) {
  security_for(peer).seal(frame);
  const size_t n = frame.size();
  const auto deadline = Clock::now() + timeout;
  SendResult r = SendResult::kFull;
  for (;;) {
    r = send_striped(peer,
                     [&](const std::string& id) { return socket_->try_send(id, frame.data(), n); });
    if (r != SendResult::kFull) break;
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (left.count() <= 0) break;
    // A server reports room when any peer has some: wait briefly and retry.
    (void)transport_.wait({socket_.get()}, std::min(left, Millis(10)), /*for_send=*/true);
  }
  if (r == SendResult::kNoPeer) throw TransportError("child '" + peer + "' is not connected");
  if (r != SendResult::kSent) {
    throw TimeoutError("send to child '" + peer + "' blocked for " +
                       std::to_string(timeout.count()) + " ms: the child is not reading");
  }
  count_sent(peer, n);
  return n;
}

std::optional<size_t> ChildrenLink::try_send(const std::string& peer,
                                             const std::vector<uint8_t>& frame) {
  size_t n = 0;
  // A child without a session (one reconnecting) gets nothing: the socket
  // is not touched, as sealing would fail (with this error) mid-send.
  if (!security_for(peer).established()) {
    throw TransportError("no secure session with child '" + peer + "' yet");
  }
  // Sealed only once a window has room: a refused frame takes no sequence
  // number.
  const SendResult r = send_striped(peer, [&](const std::string& id) {
    return socket_->try_send_with(id, [&] {
      std::vector<uint8_t> bytes(frame);
      security_for(peer).seal(bytes);
      n = bytes.size();
      return bytes;
    });
  });
  if (r == SendResult::kNoPeer) throw TransportError("child '" + peer + "' is not connected");
  if (r != SendResult::kSent) return std::nullopt;
  count_sent(peer, n);
  return n;
}

void ChildrenLink::count_sent(const std::string& peer, size_t n) {
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
  peer_sent_[peer] += n;
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
    if (!it->second->established()) {
      security_.erase(it);
      reseq_.erase(peer);
      next_send_.erase(peer);
      suspended_.erase(peer);
      gaps_seen_.erase(peer);
    }
    drop(peer, "",
         "TLS handshake did not complete within " +
             std::to_string(guard_.options().timeout.count()) + " ms; its state was dropped",
         0, false);
  }
}

bool ChildrenLink::pop_reordered(Incoming* out, Clock::time_point now) {
  for (auto& [child, r] : reseq_) {
    Resequencer::Frame f;
    const bool popped = !suspended_.count(child) && r.pop(&f, now);
    uint64_t& seen = gaps_seen_[child];
    if (r.stats().gaps_skipped > seen) {
      seen = r.stats().gaps_skipped;
      if (!suspended_.count(child)) {
        // A frame of the child's never came: one of its connections broke
        // or was taken over, and what it still sends there is lost. Nothing
        // more is sent to it or taken from it in this session, so that its
        // parent falls silent and it reconnects all its connections.
        suspended_[child] = r.session();
        r.clear();
        drop(child, "",
             "a frame sent over one of its connections never arrived; its session is "
             "suspended until it reconnects",
             0, false);
        continue;
      }
    }
    if (popped) {
      out->peer = child;
      out->message = std::move(f.message);
      out->frame_size = f.frame_size;
      return true;
    }
  }
  return false;
}

bool ChildrenLink::recv(Incoming* out, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    expire_handshakes();
    if (!reseq_.empty() && pop_reordered(out, Clock::now())) return true;
    transport::Received in;
    if (!socket_->try_recv(&in)) {
      const auto now = Clock::now();
      if (now >= deadline) return false;
      auto left = std::chrono::duration_cast<Millis>(deadline - now);
      // A gap given up on releases the frames behind it without a message.
      bool gap_due = false;
      for (const auto& [child, r] : reseq_) {
        if (r.wake_at() < now + left) {
          left = std::max(Millis(0),
                          std::chrono::duration_cast<Millis>(r.wake_at() - now) + Millis(1));
          gap_due = true;
        }
      }
      if (!transport_.wait({socket_.get()}, left) && !gap_due) return false;
      continue;
    }
    counters_.frames_received += 1;
    counters_.bytes_received += in.message.size();
    std::string peer = std::move(in.peer);
    if (in.malformed) {
      counters_.rejected += 1;
      continue;
    }
    if (!peer.empty() && peer[0] == '\0') {
      // ZeroMQ's name for a connection whose routing id a newer connection
      // took over (a node that restarted, or a child's new link): the last
      // frames of the old one, which nobody can read any more. Node ids
      // never start with a zero byte.
      counters_.rejected += 1;
      log().debug("dropped {} bytes from a connection replaced by a newer one under its id",
                  in.message.size());
      continue;
    }
    // A striped child's further connections: "<id>~<k>", k from 1.
    size_t stripe = 0;
    if (const size_t tilde = peer.find('~'); tilde != std::string::npos) {
      const std::string k = peer.substr(tilde + 1);
      const bool number = !k.empty() && k.size() <= 2 && k[0] != '0' &&
                          k.find_first_not_of("0123456789") == std::string::npos;
      if (!number) {
        drop(peer, in.source, "malformed routing id (a further connection is <id>~<k>, k >= 1)",
             in.message.size(), true);
        continue;
      }
      stripe = std::stoul(k);
      peer.resize(tilde);
    }
    if (admission_.refusal) {
      const std::string why = admission_.refusal(peer);
      if (!why.empty()) {
        // Never authorizable: no state is kept for it, whatever it sends.
        drop(stripe == 0 ? peer : peer + "~" + std::to_string(stripe), in.source, why,
             in.message.size(), true);
        continue;
      }
    }
    if (stripe > 0) {
      const std::string id = peer + "~" + std::to_string(stripe);
      const size_t allowed = admission_.streams ? admission_.streams(peer) : 1;
      if (stripe >= allowed) {
        drop(id, in.source,
             "connection " + std::to_string(stripe + 1) + " of '" + peer + "' is beyond the " +
                 std::to_string(allowed) + " its topology allows (streams)",
             in.message.size(), true);
        continue;
      }
      // Only sealed frames of an established session travel on the further
      // connections; the handshake runs on the first.
      const bool sealed = in.message.size() >= wire::kHeaderSize && (in.message.data()[7] & 0x80);
      if (!sealed || !established(peer)) {
        drop(id, in.source,
             "only sealed frames of an established session may come on a further connection",
             in.message.size(), false);
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
    if (r == ChannelSecurity::Inbound::kRejected) counters_.rejected += 1;
    const std::optional<ChannelSecurity::Order> order = security.last_order();
    if (order && admission_.streams && admission_.streams(peer) > 1) {
      std::optional<Resequencer::Frame> f;
      if (r == ChannelSecurity::Inbound::kFrame) {
        f = Resequencer::Frame{std::move(in.message), frame_size};
      }
      auto it = reseq_.find(peer);
      if (it == reseq_.end()) {
        it = reseq_.emplace(peer, Resequencer({64, admission_.reorder_wait})).first;
      }
      auto q = suspended_.find(peer);
      if (q != suspended_.end()) {
        // A new session (the child reconnected) lifts the suspension.
        if (q->second == order->session) continue;
        suspended_.erase(q);
      }
      it->second.push(*order, std::move(f), Clock::now());
      continue;
    }
    if (r != ChannelSecurity::Inbound::kFrame) continue;
    out->peer = std::move(peer);
    out->message = std::move(in.message);
    out->frame_size = frame_size;
    return true;
  }
}

}  // namespace fedwan
