// ChildrenLink's admission of what arrives: which routing ids and which
// messages may reach a child's channel security at all (LinkAdmission,
// HandshakeGuard, further connections, pieces of frames), the budget of
// plain refusals, and handshakes that took too long.
#include "transport/links.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "transport/routing_id.hpp"
#include "wire/frame.hpp"

namespace fedwan::transport {

using Clock = std::chrono::steady_clock;
namespace {

// An unsealed kHandshake frame that names a cipher: a child's ClientHello,
// the start of a TLS handshake (transport/secure_channel.hpp).
bool is_client_hello(const Message& msg) {
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
      links_.erase(peer);
      reseq_.erase(peer);
      out_.erase(peer);
      held_.erase(peer);
      reassembly_.erase(peer);
      pieced_session_.erase(peer);
      next_send_.erase(peer);
      widths_.erase(peer);
      striped_session_.erase(peer);
      suspended_.erase(peer);
      gaps_seen_.erase(peer);
    }
    drop(peer, "",
         "TLS handshake did not complete within " +
             std::to_string(guard_.options().timeout.count()) + " ms; its state was dropped",
         0, false);
  }
}

bool ChildrenLink::reassemble(const std::string& child, Received& in) {
  // Only a striped child with a session sends pieces: nobody else gets
  // memory held for them.
  if (!established(child) || streams_of(child) < 2) {
    drop(child, in.source, "fragments come only from a child striped over several connections",
         in.message.size(), false);
    return false;
  }
  auto it = reassembly_.find(child);
  if (it == reassembly_.end()) {
    Reassembler::Options o;
    // The replay window's span: frames further apart cannot be opened.
    o.max_frames = Resequencer::kSpan;
    o.max_bytes = 128 << 20;
    o.max_frame_bytes = fragment_frame_limit(max_message_bytes_);
    o.max_wait = std::max(Millis(1000), admission_.reorder_wait) * 2;
    it = reassembly_.emplace(child, Reassembler(o)).first;
  }
  std::vector<uint8_t> whole;
  std::string why;
  const uint64_t dropped = it->second.stats().dropped;
  const Reassembler::Result r =
      it->second.add(in.message.data(), in.message.size(), Clock::now(), &whole, &why);
  if (it->second.stats().dropped > dropped) {
    log().warn("child '{}': gave up {} frame(s) sent in pieces (pieces missing too long, or too "
               "many frames in pieces at once); the link recovers as after a lost frame",
               child, it->second.stats().dropped - dropped);
  }
  if (r == Reassembler::Result::kRefused) {
    drop(child, in.source, why, in.message.size(), false);
    return false;
  }
  if (r == Reassembler::Result::kPending) return false;
  in.message = Message(std::move(whole));
  return true;
}

bool ChildrenLink::admit(Received& in, std::string* child, size_t* stripe_out) {
  // `in.peer` stays the connection's routing id: replies go back to it.
  const std::string& connection = in.peer;
  if (in.malformed) {
    counters_.rejected += 1;
    return false;
  }
  if (!connection.empty() && connection[0] == '\0') {
    // ZeroMQ's name for a connection whose routing id a newer connection
    // took over (a node that restarted, or a child's new link): the last
    // frames of the old one, which nobody can read any more. Node ids
    // never start with a zero byte.
    counters_.rejected += 1;
    log().debug("dropped {} bytes from a connection replaced by a newer one under its id",
                in.message.size());
    return false;
  }
  // "<id>~<k>.<link>" (routing_id.hpp), or an untagged form.
  std::string why;
  std::optional<RoutingId> id = parse_routing_id(connection, &why);
  if (!id) {
    drop(connection, in.source, why, in.message.size(), true);
    return false;
  }
  if (admission_.refusal) {
    why = admission_.refusal(id->node);
    if (!why.empty()) {
      // Never authorizable: no state is kept for it, whatever it sends.
      drop(connection, in.source, why, in.message.size(), true);
      return false;
    }
  }
  if (id->stripe > 0 && !admit_stripe(id->node, id->stripe, in)) return false;
  if (is_client_hello(in.message)) {
    const HandshakeGuard::Verdict v = guard_.start(id->node, in.source, Clock::now());
    if (v != HandshakeGuard::Verdict::kAdmit) {
      drop(connection, in.source,
           std::string("TLS handshake not started: ") + handshake_verdict_text(v),
           in.message.size(), false);
      return false;
    }
  }
  *child = std::move(id->node);
  *stripe_out = id->stripe;
  return true;
}

bool ChildrenLink::admit_stripe(const std::string& peer, size_t stripe, const Received& in) {
  const std::string& id = in.peer;
  const size_t allowed = admission_.streams ? admission_.streams(peer) : 1;
  if (stripe >= allowed) {
    drop(id, in.source,
         "connection " + std::to_string(stripe + 1) + " of '" + peer + "' is beyond the " +
             std::to_string(allowed) + " its topology allows (streams)",
         in.message.size(), true);
    return false;
  }
  // Only sealed frames of an established session travel on the further
  // connections; the handshake runs on the first.
  const bool sealed = (in.message.size() >= wire::kHeaderSize && (in.message.data()[7] & 0x80)) ||
                      is_fragment(in.message.data(), in.message.size());
  if (!sealed) {
    drop(id, in.source,
         "only sealed frames of an established session may come on a further connection",
         in.message.size(), false);
    return false;
  }
  if (!established(peer)) {
    // Sealed in a session this end has not got: what the child sent, and
    // sends until it notices, after this node restarted. Reported as its
    // first connection's are (a frame of another session), not as a
    // refused handshake; its new session begins on that one.
    std::string why;
    SecurityReplies replies;
    const ChannelSecurity::Inbound r = security_for(peer).sealed_before_any_session(
        "sealed frame of an earlier session on a further connection (none is established here "
        "yet)",
        in.message.size(), &why, &replies);
    // On its link's first connection, which every end of the child reads:
    // a child striped over many may send little there.
    if (!replies.empty()) send_plain_words(first_connection(in.peer), replies);
    if (r == ChannelSecurity::Inbound::kOtherSession) {
      counters_.other_session += 1;
    } else {
      counters_.rejected += 1;
    }
    return false;
  }
  return true;
}

}  // namespace fedwan::transport
