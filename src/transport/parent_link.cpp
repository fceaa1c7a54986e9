// ParentLink: a child's link to its parent over the transport (one client
// socket, or several for a striped link), with the channel security on top.
// How many connections it opens and uses: parent_link_streams.cpp.
#include "transport/links.hpp"

#include <algorithm>
#include <thread>
#include <utility>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "transport/routing_id.hpp"
#include "wire/frame.hpp"

namespace fedwan::transport {

using Clock = std::chrono::steady_clock;

ParentLink::ParentLink(Transport& transport, const std::string& endpoint,
                       const std::string& self_id, const LinkOptions& options,
                       const SecurityFactory& security)
    : transport_(transport),
      self_id_(self_id),
      link_tag_(new_link_tag()),
      options_(options),
      endpoint_(endpoint),
      security_(security(endpoint)),
      reseq_(Resequencer::Options{64, Millis(options.reorder_wait_ms)}),
      reassembler_(Reassembler::Options{1024, 128 << 20,
                                        fragment_frame_limit(options.max_message_bytes),
                                        Millis(std::max(1000, options.reorder_wait_ms) * 2)}) {
  const bool plaintext = security_->name() == "plaintext";
  // `auto` on a plaintext link is one connection: nothing to put in order.
  const bool adaptive = options.adaptive_streams && !plaintext && options.streams > 1;
  const int streams = options.adaptive_streams && !adaptive ? 1 : std::max(1, options.streams);
  if (streams > 1 && plaintext) {
    throw ConfigError("streams " + std::to_string(streams) +
                      " needs the secure channel: plaintext frames carry no sequence numbers "
                      "to put frames striped over several connections back in order (set "
                      "streams: 1, or run with credentials)");
  }
  max_streams_ = static_cast<size_t>(streams);
  if (adaptive) governor_.emplace(StreamGovernor::Options{max_streams_});
  try {
    // Adaptive: one now, more as the governor asks for them.
    const size_t first = adaptive ? 1 : max_streams_;
    while (stripes_.size() < first) open_stripe();
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

void ParentLink::watch(std::vector<Transport::Interest>* out, bool writable) {
  // A failed link delivers nothing more: what its sockets still hold would
  // keep an owner's wait waking at once, for nothing, until it reconnects.
  if (failed()) return;
  // What is left of a frame in pieces waits for room too.
  for (auto& s : stripes_) out->push_back({s.get(), true, writable || out_.has_value()});
}

bool ParentLink::flush() {
  while (out_) {
    std::vector<uint8_t> piece = out_->next();
    const size_t n = piece.size();
    const SendResult r = send_striped([&](Socket& s) { return s.try_send_owned("", piece); });
    govern(r == SendResult::kSent ? std::optional<size_t>(n) : std::nullopt);
    if (r != SendResult::kSent) return false;
    out_->advance();
    if (out_->done()) out_.reset();
  }
  return true;
}

void ParentLink::note_sent(size_t n) {
  counters_.frames_sent += 1;
  counters_.bytes_sent += n;
}

template <typename SendOn>
SendResult ParentLink::send_striped(SendOn send_on) {
  // Until the session is up only the handshake's connection is used.
  const size_t n = security_->established() ? active_streams() : 1;
  if (announce_ && n > 1) {
    // Opened while the update's last frames were already queued, the new
    // connections would carry nothing until the next round's update, and
    // the parent's anchor would go down on the one connection it saw: the
    // next frame (one of the update, else the heartbeat the owner sends at
    // once, see announcing()) goes on the newest. Tried once: a frame it
    // does not take goes as any other.
    announce_ = false;
    const SendResult r = send_on(*stripes_[n - 1]);
    if (r == SendResult::kSent) {
      next_send_ = 0;
      return r;
    }
  }
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
  std::vector<Socket*> sockets;
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

bool ParentLink::failed() const { return !security_->failure().empty() || !broken_.empty(); }

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
  const auto wait_for_room = [&] {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw TimeoutError("send to parent " + endpoint_ + " blocked for " +
                         std::to_string(timeout.count()) + " ms: the parent is not reading");
    }
    (void)wait_any(std::min(left, Millis(10)), /*for_send=*/true);
  };
  // One frame in pieces at a time.
  while (!flush()) wait_for_room();
  if (fragmenting(n)) {
    out_.emplace(std::move(frame), next_fragment_id_++);
    note_sent(n);
    while (!flush()) wait_for_room();
    return n;
  }
  for (;;) {
    const SendResult r = send_striped([&](Socket& s) { return s.try_send_owned("", frame); });
    govern(r == SendResult::kSent ? std::optional<size_t>(n) : std::nullopt);
    if (r == SendResult::kSent) break;
    wait_for_room();
  }
  note_sent(n);
  return n;
}

std::optional<size_t> ParentLink::try_send(const std::vector<uint8_t>& frame) {
  // A link that lost a frame takes nothing more, quietly: recv() reports it
  // and the owner reconnects. Thrown from here, it would escape the owner's
  // upkeep (a heartbeat due just after the failure) and end the node.
  if (!broken_.empty()) return std::nullopt;
  check_failure();
  if (!security_->established()) return std::nullopt;
  // One frame in pieces at a time: the next waits until the last went.
  if (!flush()) return std::nullopt;
  size_t n = 0;
  if (fragmenting(frame.size())) {
    // Sealed only when its first piece goes, and once: a connection that
    // refused the piece after all leaves it to the next.
    const SendResult r = send_striped([&](Socket& s) {
      return s.try_send_with("", [&] {
        if (!out_) {
          std::vector<uint8_t> bytes = security_->sealed(frame);
          n = bytes.size();
          out_.emplace(std::move(bytes), next_fragment_id_++);
        }
        return out_->next();
      });
    });
    if (!out_) {
      govern(std::nullopt);
      return std::nullopt;
    }
    // Sealed: the frame is the link's now, whatever became of its first piece.
    if (r == SendResult::kSent) {
      govern(out_->next_size());
      out_->advance();
      if (out_->done()) out_.reset();
    }
    note_sent(n);
    (void)flush();
    return n;
  }
  // Sealed only by the connection that takes it: a refused frame takes no
  // sequence number.
  const SendResult r = send_striped([&](Socket& s) {
    return s.try_send_with("", [&] {
      std::vector<uint8_t> bytes = security_->sealed(frame);
      n = bytes.size();
      return bytes;
    });
  });
  govern(r == SendResult::kSent ? std::optional<size_t>(n) : std::nullopt);
  if (r != SendResult::kSent) return std::nullopt;
  note_sent(n);
  return n;
}

bool ParentLink::pop_ready(Incoming* out) {
  Resequencer::Frame ready;
  const bool popped = reseq_.pop(&ready, Clock::now());
  if (reseq_.stats().gaps_skipped > 0 && broken_.empty()) {
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
  if (!popped) return false;
  out->peer = endpoint_;
  out->message = std::move(ready.message);
  out->frame_size = ready.frame_size;
  return true;
}

bool ParentLink::try_recv_any(Received* in) {
  for (size_t i = 0; i < stripes_.size(); ++i) {
    const size_t k = (next_recv_ + i) % stripes_.size();
    if (stripes_[k]->try_recv(in)) {
      next_recv_ = (k + 1) % stripes_.size();
      return true;
    }
  }
  return false;
}

bool ParentLink::take(Received& in, bool striped, Incoming* out) {
  counters_.frames_received += 1;
  counters_.bytes_received += in.message.size();
  if (in.malformed) {  // several parts: no frame of ours
    counters_.rejected += 1;
    log().debug("dropped a message of several parts from the parent {}", endpoint_);
    return false;
  }
  if (is_fragment(in.message.data(), in.message.size())) {
    std::vector<uint8_t> whole;
    std::string why;
    const uint64_t dropped = reassembler_.stats().dropped;
    const Reassembler::Result r =
        reassembler_.add(in.message.data(), in.message.size(), Clock::now(), &whole, &why);
    if (reassembler_.stats().dropped > dropped) {
      log().warn("link to parent {}: gave up {} frame(s) sent in pieces (pieces missing too long, "
                 "or too many frames in pieces at once); the link recovers as after a lost frame",
                 endpoint_, reassembler_.stats().dropped - dropped);
    }
    if (r == Reassembler::Result::kRefused) {
      counters_.rejected += 1;
      log().warn("dropped a message from the parent {}: {}", endpoint_, why);
      return false;
    }
    if (r == Reassembler::Result::kPending) return false;
    in.message = Message(std::move(whole));
  }
  std::string why;
  size_t frame_size = 0;
  SecurityReplies replies;
  const auto r =
      security_->receive(in.message.data(), in.message.size(), &frame_size, &why, &replies);
  send_replies(replies);
  if (r == ChannelSecurity::Inbound::kRejected) counters_.rejected += 1;
  if (r == ChannelSecurity::Inbound::kOtherSession) counters_.other_session += 1;
  const std::optional<ChannelSecurity::Order> order = security_->last_order();
  if (striped && order) {
    std::optional<Resequencer::Frame> f;
    if (r == ChannelSecurity::Inbound::kFrame) {
      // A parent's frames are not inspected.
      f = Resequencer::Frame{std::move(in.message), frame_size, {}};
    }
    reseq_.push(*order, std::move(f), Clock::now());
    check_failure();
    return false;
  }
  check_failure();
  if (r != ChannelSecurity::Inbound::kFrame) return false;
  out->peer = endpoint_;
  out->message = std::move(in.message);
  out->frame_size = frame_size;
  return true;
}

bool ParentLink::recv(Incoming* out, Millis timeout) {
  out->inspected.reset();  // its frames are not inspected
  if (failed()) {
    // Said once already (the call that met the failure threw at once):
    // nothing comes over it any more, so it waits as for a silent parent
    // before saying it again. An owner polling it until its reconnect is
    // due (with backoff: seconds) does not spin meanwhile.
    std::this_thread::sleep_for(timeout);
    check_failure();
  }
  const auto deadline = Clock::now() + timeout;
  // An adaptive link runs its frames through the resequencer from the
  // start, single while it has one connection, so that the count is in
  // step when it opens a second.
  const bool striped = stripes_.size() > 1 || governor_.has_value();
  reseq_.set_striped(stripes_.size() > 1);
  // What the sender handed over drains while it waits for frames: the
  // epochs go on being measured.
  govern_tick(Clock::now());
  const auto put_out_pieces = [&] {
    try {
      (void)flush();
    } catch (const TransportError& e) {
      // The send that meets it again reports it.
      log().debug("link to parent {}: {}", endpoint_, e.what());
    }
  };
  put_out_pieces();
  for (;;) {
    if (striped) {
      if (pop_ready(out)) return true;
    } else {
      check_failure();
    }
    Received in;
    if (try_recv_any(&in)) {
      if (take(in, striped, out)) return true;
      continue;
    }
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
    // Pieces still to go: back soon to put them out.
    if (out_) {
      put_out_pieces();
      if (out_ && left > Millis(2)) {
        left = Millis(2);
        gap_due = true;
      }
    }
    if (!wait_any(left, /*for_send=*/false) && !gap_due) return false;
  }
}

}  // namespace fedwan::transport
