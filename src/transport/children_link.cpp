// ChildrenLink: a parent's link to its children (one server socket), with a
// channel security per child, frames sent over a child's connections (whole
// or in pieces), and striped children's frames put back in order. What may
// arrive at all is children_admission.cpp's; which connection of a child a
// frame goes to, children_routes.cpp's.
#include "transport/links.hpp"

#include <algorithm>
#include <utility>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "security/aead.hpp"
#include "wire/frame.hpp"

namespace fedwan::transport {

using Clock = std::chrono::steady_clock;

ChildrenLink::ChildrenLink(Transport& transport, const std::string& bind_endpoint,
                           const LinkOptions& options, SecurityFactory security,
                           LinkAdmission admission)
    : transport_(transport),
      socket_(transport.bind(bind_endpoint, options)),
      max_message_bytes_(options.max_message_bytes),
      factory_(std::move(security)),
      admission_(std::move(admission)),
      guard_(admission_.handshakes) {
  const size_t threads = options.crypto_threads < 0 ? CryptoWorkers::default_threads()
                                                    : size_t(options.crypto_threads);
  if (threads > 0) workers_ = std::make_unique<CryptoWorkers>(threads);
}

ChildrenLink::~ChildrenLink() = default;

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

size_t ChildrenLink::width_of(const std::string& child) const {
  size_t n = streams_of(child);
  if (n > 1 && admission_.adaptive_streams && admission_.adaptive_streams(child)) {
    // As many as the child sends on now (it measures; the link is the same).
    const auto w = widths_.find(child);
    n = std::min(n, w == widths_.end() ? size_t{1} : w->second.width);
  }
  return n;
}

template <typename SendOn>
SendResult ChildrenLink::send_striped(const std::string& peer, SendOn send_on) {
  if (suspended_.count(peer)) return SendResult::kFull;
  const size_t n = width_of(peer);
  if (n == 1) return send_on(route(peer, 0));
  size_t& next = next_send_[peer];
  bool any_full = false;
  for (size_t i = 0; i < n; ++i) {
    const size_t k = (next + i) % n;
    // A connection not (yet) open is skipped; the child is gone only when
    // none is.
    const SendResult r = send_on(route(peer, k));
    if (r == SendResult::kSent) {
      next = (k + 1) % n;
      return r;
    }
    any_full = any_full || r == SendResult::kFull;
  }
  return any_full ? SendResult::kFull : SendResult::kNoPeer;
}

bool ChildrenLink::flush(const std::string& child) {
  if (auto h = held_.find(child); h != held_.end()) {
    const SendResult r = send_striped(
        child, [&](const std::string& id) { return socket_->try_send_owned(id, h->second); });
    if (r == SendResult::kFull && !suspended_.count(child)) return false;
    if (r != SendResult::kSent) {
      log().debug("child '{}' left with a sealed frame of {} bytes still to send", child,
                  h->second.size());
    }
    held_.erase(h);
  }
  auto it = out_.find(child);
  while (it != out_.end()) {
    Fragmenter& f = it->second;
    std::vector<uint8_t> piece = f.next();
    const SendResult r = send_striped(
        child, [&](const std::string& id) { return socket_->try_send_owned(id, piece); });
    if (r == SendResult::kFull && !suspended_.count(child)) return false;
    if (r != SendResult::kSent) {
      // Gone, or its session suspended: what it missed reaches it as after
      // any reconnect.
      log().debug("child '{}' left with {} bytes of a frame still to send", child, f.size());
      out_.erase(it);
      return true;
    }
    f.advance();
    if (f.done()) out_.erase(it);
    it = out_.find(child);
  }
  return true;
}

bool ChildrenLink::fragmenting_to(const std::string& child, size_t size) const {
  if (size < 2 * kFragmentBytes || suspended_.count(child) || width_of(child) < 2) return false;
  const auto p = pieced_session_.find(child);
  const auto r = reseq_.find(child);
  return p != pieced_session_.end() && r != reseq_.end() && r->second.session() == p->second;
}

bool ChildrenLink::flush() {
  if (out_.empty() && held_.empty()) return true;
  std::vector<std::string> children;
  children.reserve(out_.size() + held_.size());
  for (const auto& entry : held_) children.push_back(entry.first);
  for (const auto& entry : out_) {
    if (!held_.count(entry.first)) children.push_back(entry.first);
  }
  bool all = true;
  for (const std::string& child : children) all = flush(child) && all;
  return all;
}

size_t ChildrenLink::send(const std::string& peer, std::vector<uint8_t> frame, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto wait_for_room = [&] {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw TimeoutError("send to child '" + peer + "' blocked for " +
                         std::to_string(timeout.count()) + " ms: the child is not reading");
    }
    (void)transport_.wait({socket_.get()}, std::min(left, Millis(10)), /*for_send=*/true);
  };
  // One frame in pieces at a time.
  while (!flush(peer)) wait_for_room();
  security_for(peer).seal(frame);
  const size_t n = frame.size();
  if (fragmenting_to(peer, n)) {
    out_.emplace(peer, Fragmenter(std::move(frame), next_fragment_id_++));
    count_sent(peer, n);
    while (!flush(peer)) wait_for_room();
    return n;
  }
  SendResult r = SendResult::kFull;
  for (;;) {
    r = send_striped(peer,
                     [&](const std::string& id) { return socket_->try_send_owned(id, frame); });
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
  // One frame in pieces at a time: the next waits until the last went.
  if (!flush(peer)) return std::nullopt;
  if (fragmenting_to(peer, frame.size())) {
    // Sealed only when its first piece goes, and once.
    bool sealed = false;
    const SendResult r = send_striped(peer, [&](const std::string& id) {
      return socket_->try_send_with(id, [&] {
        if (!sealed) {
          std::vector<uint8_t> bytes = security_for(peer).sealed(frame);
          n = bytes.size();
          sealed = true;
          out_.insert_or_assign(peer, Fragmenter(std::move(bytes), next_fragment_id_++));
        }
        return out_.at(peer).next();
      });
    });
    if (r == SendResult::kNoPeer && !sealed) {
      throw TransportError("child '" + peer + "' is not connected");
    }
    if (!sealed) return std::nullopt;
    // Sealed: the frame is the link's now, whatever became of its first piece.
    auto f = out_.find(peer);
    if (r == SendResult::kSent && f != out_.end()) {
      f->second.advance();
      if (f->second.done()) out_.erase(f);
    }
    count_sent(peer, n);
    (void)flush(peer);
    return n;
  }
  // Sealed only once a window has room: a refused frame takes no sequence
  // number.
  const SendResult r = send_striped(peer, [&](const std::string& id) {
    return socket_->try_send_with(id, [&] {
      std::vector<uint8_t> bytes = security_for(peer).sealed(frame);
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
      out->inspected = std::move(f.inspected);
      return true;
    }
  }
  return false;
}

bool ChildrenLink::recv(Incoming* out, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  out->inspected.reset();  // an answer is never another frame's
  for (;;) {
    if (!out_.empty()) {
      try {
        (void)flush();
      } catch (const TransportError& e) {
        // The send that meets it again reports it.
        log().debug("children link: {}", e.what());
      }
    }
    expire_handshakes();
    if (!reseq_.empty() && pop_reordered(out, Clock::now())) return true;
    // With opening threads, messages are read ahead while there is room
    // and every one before is a data frame being opened, then taken in the
    // order they came.
    Received in;
    if (!reading_ahead() || !socket_->try_recv(&in)) {
      if (!taken_.empty()) {
        if (take_oldest(out)) return true;
        continue;
      }
      if (!wait_readable(deadline)) return false;
      continue;
    }
    counters_.frames_received += 1;
    counters_.bytes_received += in.message.size();
    std::string peer;
    size_t stripe = 0;
    if (!admit(in, &peer, &stripe)) continue;
    const bool pieced = is_fragment(in.message.data(), in.message.size());
    if (pieced && !reassemble(peer, in)) continue;
    if (workers_) {
      queue_taken(std::move(peer), stripe, in, pieced);
      continue;
    }
    taking_pieced_ = pieced;
    taking_long_ = in.long_link;
    if (take_frame(std::move(peer), stripe, in, out)) return true;
  }
}

bool ChildrenLink::wait_readable(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (now >= deadline) return false;
  auto left = std::chrono::duration_cast<Millis>(deadline - now);
  // A gap given up on releases the frames behind it without a message.
  bool gap_due = false;
  for (const auto& [child, r] : reseq_) {
    if (r.wake_at() < now + left) {
      left = std::max(Millis(0), std::chrono::duration_cast<Millis>(r.wake_at() - now) + Millis(1));
      gap_due = true;
    }
  }
  // Pieces still to go: back soon to put them out (a server socket cannot
  // signal room for one child).
  if (!out_.empty() && left > Millis(2)) {
    left = Millis(2);
    gap_due = true;
  }
  return transport_.wait({socket_.get()}, left) || gap_due;
}

bool ChildrenLink::take_frame(std::string peer, size_t stripe, Received& in, Incoming* out) {
  std::string why;
  size_t frame_size = 0;
  SecurityReplies replies;
  ChannelSecurity& security = security_for(peer);
  const auto r =
      security.receive(in.message.data(), in.message.size(), &frame_size, &why, &replies);
  if (guard_.pending(peer) && !security.handshaking()) guard_.finish(peer);
  if (!replies.empty()) send_plain_words(first_connection(in.peer), replies);
  return settle(std::move(peer), stripe, in, {}, r, frame_size, security, out);
}

void ChildrenLink::send_plain_words(const std::string& peer, SecurityReplies& replies) {
  for (auto& reply : replies) {
    // Best effort, never blocking: a peer that does not read its handshake
    // replies times out on its side. Plain refusals and "no session here"
    // share the budget of drop()'s.
    const bool plain_word =
        (reply.size() > 5 && reply[5] == static_cast<uint8_t>(wire::MsgType::kReject)) ||
        is_no_session_frame(reply);
    if (plain_word && !may_refuse()) continue;
    send_unsealed(peer, reply);
  }
}

bool ChildrenLink::settle(std::string peer, size_t stripe, Received& in, std::any inspected,
                          ChannelSecurity::Inbound r, size_t frame_size, ChannelSecurity& security,
                          Incoming* out) {
  if (r == ChannelSecurity::Inbound::kRejected) counters_.rejected += 1;
  if (r == ChannelSecurity::Inbound::kOtherSession) counters_.other_session += 1;
  follow_link(peer, in.peer, security);
  const std::optional<ChannelSecurity::Order> order = security.last_order();
  if (order && admission_.streams && admission_.streams(peer) > 1) {
    std::optional<Resequencer::Frame> f;
    if (r == ChannelSecurity::Inbound::kFrame) {
      f = Resequencer::Frame{std::move(in.message), frame_size, std::move(inspected)};
    }
    auto it = reseq_.find(peer);
    if (it == reseq_.end()) {
      it = reseq_.emplace(peer, Resequencer({64, admission_.reorder_wait})).first;
    }
    auto q = suspended_.find(peer);
    if (q != suspended_.end()) {
      // A new session (the child reconnected) lifts the suspension.
      if (q->second == order->session) return false;
      suspended_.erase(q);
    }
    // A child that sends in pieces measured its link as long, or its
    // frames came over a connection this end measured as long: the parent
    // sends its own in pieces too, this session.
    if ((taking_pieced_ || taking_long_) && r == ChannelSecurity::Inbound::kFrame) {
      auto [p, fresh] = pieced_session_.try_emplace(peer, order->session);
      if (fresh || p->second != order->session) {
        p->second = order->session;
        log().debug("child '{}' is over a long link ({}): big frames go to it in pieces", peer,
                    taking_pieced_ ? "it sends in pieces" : "measured here");
      }
    }
    // An adaptive child is on one connection until a frame of its session
    // comes over a further one (a frame in pieces came over several).
    if (admission_.adaptive_streams && admission_.adaptive_streams(peer)) {
      if (stripe > 0 || taking_pieced_) striped_session_[peer] = order->session;
      Width& w = widths_[peer];
      w.recent[w.seen++ % w.recent.size()] = static_cast<uint8_t>(stripe);
      const size_t n = std::min(w.seen, w.recent.size());
      w.width = 1 + *std::max_element(w.recent.begin(), w.recent.begin() + n);
      const auto s = striped_session_.find(peer);
      it->second.set_striped(s != striped_session_.end() && s->second == order->session);
    }
    it->second.push(*order, std::move(f), Clock::now());
    return false;
  }
  if (r != ChannelSecurity::Inbound::kFrame) return false;
  out->peer = std::move(peer);
  out->message = std::move(in.message);
  out->frame_size = frame_size;
  out->inspected = std::move(inspected);
  return true;
}

}  // namespace fedwan::transport
