// The two ends of a tree link, over any transport (transport.hpp): a parent
// binds one server socket for all its children; each child connects one
// client socket (or several) under routing ids that name it, its link and
// the connection (routing_id.hpp). Here the security layer
// (channel_security.hpp), the windows and the admission of peers sit on
// top of the transport, the same for all of them.
//
// Each connection's routing id names the child, the connection and the link
// (routing_id.hpp): the parent sends to the connections of the link whose
// handshake made the child's current session.
//
// Striping (LinkOptions::streams > 1): a child opens more connections, under
// the routing ids "<id>~1.<link>", "<id>~2.<link>", ...; the first carries the TLS
// handshake and all of them carry sealed frames of the one secure session.
// Each frame goes out on the next connection with room, and the receiver
// delivers chunks as they come and everything else in the order it was
// sealed (resequencer.hpp). A frame of 64 KiB or more going over more
// than one connection is cut into pieces of 32 KiB that go out over
// whichever connection has room as each goes, and are put back together
// before it is opened (fragments.hpp): a connection that a loss slowed
// holds a piece, not a frame. Plaintext links cannot be striped. With
// LinkOptions::adaptive_streams (`streams: auto`) the child uses as many
// connections as pay (stream_governor.hpp), opening them as its governor
// asks; the parent sends to it over as many as it now sends on.
//
// Back-pressure: each direction keeps at most `window` frames queued per peer;
// a send beyond that blocks the caller up to its timeout. Sockets cap the
// message size so a peer cannot make us allocate more than one maximal frame.
//
// Thread safety: a link is owned by one thread; the transport may be shared.
#pragma once

#include <any>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/channel_security.hpp"
#include "transport/crypto_workers.hpp"
#include "transport/fragments.hpp"
#include "transport/handshake_guard.hpp"
#include "transport/resequencer.hpp"
#include "transport/stream_governor.hpp"
#include "transport/transport.hpp"

namespace fedwan::transport {

using LinkOptions = SocketOptions;

struct LinkCounters {
  uint64_t frames_sent = 0, bytes_sent = 0;
  uint64_t frames_received = 0, bytes_received = 0;
  uint64_t rejected = 0;  // dropped by the security layer
  // Dropped as sealed in another session of the link (a restart's leftovers).
  uint64_t other_session = 0;
};

// A received frame: the bytes stay where the transport put them (no copy).
struct Incoming {
  std::string peer;  // the child's node id (ChildrenLink); the parent's endpoint (ParentLink)
  Message message;
  size_t frame_size = 0;
  // What the link's FrameInspector answered for this frame, where it ran
  // (ChildrenLink::inspect_opened); else empty.
  std::any inspected;
  const uint8_t* data() const { return message.data(); }
};

using SecurityFactory = std::function<std::unique_ptr<ChannelSecurity>(const std::string& peer)>;
// Plaintext links; warns loudly once per process.
SecurityFactory plaintext_security_factory(uint64_t job_id, uint32_t self_index,
                                           LinkEventSink sink = {});

// Child end: DEALER connected to the parent. The security layer's handshake
// starts at construction and advances whenever the link receives.
class ParentLink {
 public:
  ParentLink(Transport& transport, const std::string& endpoint, const std::string& self_id,
             const LinkOptions& options, const SecurityFactory& security);
  // A link whose session never came up has nothing worth flushing: it closes
  // at once instead of lingering on a handshake nobody will read.
  ~ParentLink();
  // Drops whatever is still queued so that closing does not linger: a
  // replaced link must not keep reconnecting under this node's routing id
  // (the parent would hand the id back and forth between the two sockets).
  void abandon();
  ParentLink(const ParentLink&) = delete;
  ParentLink& operator=(const ParentLink&) = delete;
  // Waits (receiving) until the secure session is up, at most `timeout`.
  // Throws CryptoError when the handshake failed or was refused (with the
  // reason), TimeoutError when the parent did not answer.
  void wait_established(Millis timeout);
  bool established() const { return security_->established(); }
  // Blocks while the session is not up or the window is full, at most
  // `timeout`; throws TimeoutError, CryptoError (see wait_established).
  // Returns the bytes put on the wire (after the security layer).
  size_t send(std::vector<uint8_t> frame, Millis timeout);
  // Never blocks: the bytes put on the wire, or nullopt when the window is
  // full, the session not up yet, or a striped link lost a frame (recv()
  // reports that; nothing was sealed or consumed). Throws CryptoError once
  // the handshake failed.
  [[nodiscard]] std::optional<size_t> try_send(const std::vector<uint8_t>& frame);
  // Like send() for bytes already sealed by this link's own sealer (see
  // SecureChannel::sealer and security::SealingPipeline).
  size_t send_sealed(std::vector<uint8_t> frame, Millis timeout);
  // Puts out what is left of a frame sent in pieces, as far as the
  // connections take it: true when nothing is left. recv() does it too, and
  // watch() asks for room while something is left.
  bool flush();
  bool sending() const { return out_.has_value(); }
  // Waits at most `timeout` for one frame that passes the security layer.
  // Throws CryptoError once the handshake failed, and on a striped link once
  // a frame was lost on one of its connections (the owner reconnects): at
  // once from the call that met the failure, after `timeout` from every
  // later one (a failed link delivers nothing, and an owner polling it
  // until its reconnect is due must not spin).
  bool recv(Incoming* out, Millis timeout);
  // It failed (see recv): it delivers nothing more, and watch() adds none
  // of its connections.
  bool failed() const;
  ChannelSecurity& security() { return *security_; }
  // For the owner's Transport::wait over all its links: adds every
  // connection of this link (readable, and writable when asked); none once
  // it failed.
  void watch(std::vector<Transport::Interest>* out, bool writable = false);
  // The connections open (1 + extra stripes), those that carry frames now,
  // and the reordering they caused.
  size_t streams() const { return stripes_.size(); }
  // It just opened connections and its next frame goes on the newest, so
  // that the parent sends on all of them: an owner with nothing to send
  // sends a heartbeat now rather than when one is due.
  bool announcing() const { return announce_; }
  size_t active_streams() const;
  const Resequencer::Stats& reordering() const { return reseq_.stats(); }
  const LinkCounters& counters() const { return counters_; }
  const std::string& endpoint() const { return endpoint_; }
  // The routing id connection k (0: the first) goes under: the node id,
  // k and this link's tag (routing_id.hpp).
  std::string routing_id(size_t k) const;
  // 5 ms or more there and back on one of its connections, as the kernel
  // measured it lately (checked at most every half second; false where
  // the transport cannot tell).
  bool long_link();

 private:
  void send_replies(SecurityReplies& replies);
  void check_failure() const;
  // Offers the frame to each usable connection in turn, from the one after
  // the last used, until one takes it.
  template <typename SendOn>
  SendResult send_striped(SendOn send_on);
  bool wait_any(Millis timeout, bool for_send);
  // Tells the governor how a send went, opens the connections it asks for.
  // recv()'s steps: a frame the resequencer has ready (failing the link
  // once one was given up); a message from any connection, in turn; a
  // message through the security layer (true: a frame for the caller).
  bool pop_ready(Incoming* out);
  bool try_recv_any(Received* in);
  bool take(Received& in, bool striped, Incoming* out);
  void govern(std::optional<size_t> sent);
  void govern_tick(std::chrono::steady_clock::time_point now);
  void open_stripe();
  // Whether a frame of `size` goes in pieces: over several connections.
  bool fragmenting(size_t size);
  void note_sent(size_t n);  // counts a frame of n bytes put on the link

  Transport& transport_;
  std::string self_id_;
  std::string link_tag_;  // this link's, in each connection's routing id
  LinkOptions options_;
  size_t max_streams_ = 1;
  std::optional<StreamGovernor> governor_;        // `streams: auto`
  std::vector<std::unique_ptr<Socket>> stripes_;  // [0]: the handshake's
  size_t next_send_ = 0, next_recv_ = 0;
  // The governor opened connections: the next frame goes on the newest, so
  // that the parent, which sends on as many of them as it has seen frames
  // come over, widens its frames down at once (parent_link.cpp).
  bool announce_ = false;
  std::string endpoint_;
  std::unique_ptr<ChannelSecurity> security_;
  Resequencer reseq_;
  std::string broken_;  // why the striped link stopped being one ordered link
  LinkCounters counters_;
  // The frame going out in pieces (at most one), and the pieces coming in.
  std::optional<Fragmenter> out_;
  uint64_t next_fragment_id_ = fragment_id_base();
  Reassembler reassembler_;
  // A connection's round trip at options_.long_link_rtt_us or more (5 ms
  // by default, the threshold the parent applies at the handshake), checked
  // now and then.
  bool long_link_ = false;
  std::chrono::steady_clock::time_point long_checked_{};
};

// Who may reach a parent at all. Anyone can connect and pick a routing id,
// so what an unauthenticated peer can make the parent hold is bounded here:
// an id that can never be authorized gets no state at all, and TLS
// handshakes in progress are capped (HandshakeGuard) and time out.
struct LinkAdmission {
  // Why `peer` (a child's node id, from its routing id) can never have a
  // session on this link, or ""
  // when it may try. Null: every id may try.
  std::function<std::string(const std::string& peer)> refusal;
  HandshakeGuard::Options handshakes;
  // Who this node is, for the plain refusals it sends.
  uint64_t job_id = 0;
  uint32_t self_index = 0;
  // A message dropped before any session saw it: the routing id, the
  // source address ("local" for ipc/inproc), why, and its size.
  std::function<void(const std::string& peer, const std::string& source, const std::string& why,
                     size_t bytes)>
      on_drop;
  // The connections `child` (an admitted node id) may open (its streams).
  // Null: one each.
  std::function<size_t(const std::string& child)> streams;
  // How long a striped child's link waits for an overtaken frame.
  Millis reorder_wait{5000};
  // Whether `child`'s link runs `streams: auto` (the parent then uses as
  // many of its connections as pay). Null: none does.
  std::function<bool(const std::string& child)> adaptive_streams;
};

// Parent end: ROUTER bound for all children.
class ChildrenLink {
 public:
  using Clock = std::chrono::steady_clock;
  ChildrenLink(Transport& transport, const std::string& bind_endpoint, const LinkOptions& options,
               SecurityFactory security, LinkAdmission admission = {});
  ~ChildrenLink();
  ChildrenLink(const ChildrenLink&) = delete;
  ChildrenLink& operator=(const ChildrenLink&) = delete;
  // Blocks while that child's window is full, at most `timeout`. Throws
  // TransportError when the child is not connected, TimeoutError on timeout.
  // Returns the bytes put on the wire (after the security layer).
  size_t send(const std::string& peer, std::vector<uint8_t> frame, Millis timeout);
  // Never blocks: the bytes put on the wire, or nullopt when that child's
  // window is full (nothing was sealed or consumed). Throws TransportError
  // when the child is not connected.
  [[nodiscard]] std::optional<size_t> try_send(const std::string& peer,
                                               const std::vector<uint8_t>& frame);
  // Waits at most `timeout`; false when nothing (valid) arrived. Handshake
  // messages are answered here and never returned. With opening threads
  // (LinkOptions::crypto_threads), it reads ahead what the socket holds
  // and opens those frames on them, while the caller handles the one
  // returned; a frame read ahead counts as arrived (recv waits for its
  // opening whatever the timeout), so false still means none is left.
  bool recv(Incoming* out, Millis timeout);
  // Messages read ahead and not yet returned: the socket no longer signals
  // them, so an owner that waits on it calls recv() first.
  bool holding() const { return !taken_.empty(); }
  size_t crypto_threads() const { return workers_ ? workers_->threads() : 0; }
  // The link's crypto threads, for the owner's own work split in parts
  // (CryptoWorkers::run_parts); null without any.
  CryptoWorkers* crypto_workers() { return workers_.get(); }
  // Runs `inspect` on each frame opened on the crypto threads, there, once
  // it verified; its answers come back with the frames. Set before the
  // first recv().
  void inspect_opened(FrameInspector inspect) { inspect_ = std::move(inspect); }
  // Puts out what is left of frames sent in pieces or sealed ahead (one per
  // child at most), as far as the connections take it: true when nothing is
  // left. recv() does it too; the owner polls while something is left.
  bool flush();
  bool sending() const { return !out_.empty() || !held_.empty(); }
  // Seals each child's frame of `frames` (a child once at most), all at
  // once: on the link's threads and this one, each child's by its own
  // sealer. Each goes out ahead of anything sent to that child later, as a
  // frame in pieces does: flush(), send() and try_send() put it out first,
  // as that child's window takes it. A child that cannot take one now
  // (may_seal_ahead) is skipped. Returns the bytes each frame puts on the
  // wire, nullopt for those skipped. A sealing that fails throws here once
  // every other has ended (those that succeeded are kept and go).
  std::vector<std::optional<size_t>> seal_ahead(
      const std::vector<std::pair<std::string, const std::vector<uint8_t>*>>& frames);
  // Whether `child` has a session and nothing of its own still to go out.
  bool may_seal_ahead(const std::string& child) const;
  Socket& socket() { return *socket_; }
  const LinkCounters& counters() const { return counters_; }
  // Bytes put on the wire to one child (send and try_send) since the link
  // opened; 0 for a peer never sent to.
  uint64_t bytes_sent_to(const std::string& peer) const {
    const auto it = peer_sent_.find(peer);
    return it == peer_sent_.end() ? 0 : it->second;
  }
  // Whether the child has a secure session (always true for plaintext).
  bool established(const std::string& peer) const;
  // Peers with a security state, and handshakes in progress (for tests and
  // the memory bounds docs/security.md states).
  size_t sessions() const { return security_.size(); }
  size_t handshakes_in_progress() const { return guard_.pending_count(); }
  // Frames held back for order from striped children, now (for the bounds).
  size_t frames_reordering() const;
  // A striped child lost a frame on one of its connections: its session
  // sends and delivers nothing more (try_send reports a full window), so
  // that the child hears nothing, reconnects, and a new session lifts it.
  bool suspended(const std::string& child) const { return suspended_.count(child) != 0; }
  // The connections a frame to `child` may go out on now: with `streams:
  // auto`, one more than the highest a frame of it came over lately.
  size_t width_of(const std::string& child) const;

 private:
  size_t streams_of(const std::string& child) const;
  bool flush(const std::string& child);
  // Whether a frame of `size` to `child` goes in pieces: it goes out over
  // several connections and, this session, the child sent its own in
  // pieces (it measured the link as long) or a frame over a connection this
  // end measured as long (Received::long_link).
  bool fragmenting_to(const std::string& child, size_t size) const;
  // A fragment from `child`: true (the whole frame in `in`) once its last
  // piece came.
  bool reassemble(const std::string& child, Received& in);
  template <typename SendOn>
  SendResult send_striped(const std::string& peer, SendOn send_on);
  // Pops a frame some striped child's resequencer has ready.
  bool pop_reordered(Incoming* out, Clock::time_point now);
  // Waits until the socket is readable or a striped child's gap is due;
  // false once `deadline` passed with neither.
  bool wait_readable(Clock::time_point deadline);
  // Whether a message may go on to the channel security (its routing id,
  // the admission, further connections, the handshake budget); sets
  // `child` to the child's id. Drops and counts it otherwise.
  bool admit(Received& in, std::string* child, size_t* stripe);
  bool admit_stripe(const std::string& peer, size_t stripe, const Received& in);
  // Passes an admitted message through the child's channel security: true
  // with a frame in *out; false when it was a handshake message, refused,
  // or is held for a striped child's order.
  bool take_frame(std::string peer, size_t stripe, Received& in, Incoming* out);
  // What take_frame() does once the channel security had the message.
  bool settle(std::string peer, size_t stripe, Received& in, std::any inspected,
              ChannelSecurity::Inbound r, size_t frame_size, ChannelSecurity& security,
              Incoming* out);
  // Read ahead (children_opening.cpp): a message queued in its turn, its
  // opening started on a thread when it is a data frame that can be; the
  // oldest taken as take_frame() would have (waiting for its opening).
  void queue_taken(std::string peer, size_t stripe, Received& in, bool pieced);
  bool take_oldest(Incoming* out);
  bool reading_ahead() const;
  ChannelSecurity& security_for(const std::string& peer);
  // Drops handshakes that outlived their timeout, with their state.
  void expire_handshakes();
  void drop(const std::string& peer, const std::string& source, const std::string& why,
            size_t bytes, bool tell_peer);
  bool may_refuse();  // within the budget of plain refusals (20 a second)
  void count_sent(const std::string& peer, size_t n);
  // Best effort, never blocking: handshake replies and plain refusals.
  void send_unsealed(const std::string& peer, const std::vector<uint8_t>& bytes);
  // What the security layer has to tell `peer` in the clear or to start a
  // session (handshake records, refusals, "no session here").
  void send_plain_words(const std::string& peer, SecurityReplies& replies);
  // The routing id connection k of `child` goes under: of the link whose
  // handshake made its current session (see links_).
  std::string route(const std::string& child, size_t k) const;
  // The first connection of the link a connection belongs to (its routing
  // id): where plain words for it go.
  static std::string first_connection(const std::string& connection);
  // Follows `child` to the link a message came from (`connection`, its
  // routing id) when that message made a new session (`security` agreed
  // keys again), or when the mechanism agrees none (plaintext).
  void follow_link(const std::string& child, const std::string& connection,
                   const ChannelSecurity& security);

  Transport& transport_;
  std::unique_ptr<Socket> socket_;
  int64_t max_message_bytes_;
  SecurityFactory factory_;
  LinkAdmission admission_;
  HandshakeGuard guard_;
  std::unordered_map<std::string, std::unique_ptr<ChannelSecurity>> security_;
  // Each child's current link: its tag (routing_id.hpp; empty for a child
  // under the untagged ids) and the key agreement that made the session
  // on it. Frames to the child go only to that link's connections: one of
  // a link the child replaced, however late ZeroMQ completes it, never
  // takes a frame or a live connection's id. Kept with security_.
  struct ChildLink {
    uint64_t agreements = 0;
    std::string tag;
  };
  std::unordered_map<std::string, ChildLink> links_;
  // Striped children only: the order their frames are put back in, and the
  // connection their next frame goes out on.
  std::unordered_map<std::string, Resequencer> reseq_;
  std::unordered_map<std::string, size_t> next_send_;
  // Adaptive children: the connections each sent its last frames on (32),
  // and so how many it uses now, which the parent mirrors.
  struct Width {
    std::array<uint8_t, 32> recent{};
    size_t seen = 0;
    size_t width = 1;
  };
  std::unordered_map<std::string, Width> widths_;
  // Adaptive children (`streams: auto`) and the session in which a frame
  // came over a further connection: their resequencer is single (one
  // connection) until then.
  std::unordered_map<std::string, uint64_t> striped_session_;
  // Striped children that lost a frame, and the session that did: nothing
  // goes to them or comes from them until a new session (see recv).
  std::unordered_map<std::string, uint64_t> suspended_;
  std::unordered_map<std::string, uint64_t> gaps_seen_;
  LinkCounters counters_;
  // Frames going out in pieces, and pieces coming in, per child; a whole
  // frame sealed ahead (seal_ahead), per child.
  std::unordered_map<std::string, Fragmenter> out_;
  std::unordered_map<std::string, std::vector<uint8_t>> held_;
  std::unordered_map<std::string, Reassembler> reassembly_;
  std::unordered_map<std::string, uint64_t> pieced_session_;  // sends in pieces, in this session
  bool taking_pieced_ = false;  // the frame take_frame() has now came in pieces
  bool taking_long_ = false;    // ... from a host with a long connection here (Received::long_link)
  uint64_t next_fragment_id_ = fragment_id_base();
  // Only children this node chose to send to: bounded by the topology.
  std::unordered_map<std::string, uint64_t> peer_sent_;
  std::chrono::steady_clock::time_point next_expiry_{};
  // Plain refusals to peers without a session go out at a bounded rate.
  std::chrono::steady_clock::time_point reply_window_{};
  int replies_in_window_ = 0;
  // Messages read ahead, oldest first; those not detached (every message
  // but a data frame of an established session) stop the reading ahead
  // until their turn, so that nothing is admitted before what comes first
  // has changed the state it is admitted by.
  struct Taken {
    std::string peer;
    size_t stripe = 0;
    Received in;
    bool pieced = false;
    std::unique_ptr<DetachedFrame> detached;
    bool on_thread = false;  // submitted; small frames are opened in their turn
    CryptoWorkers::Job job;
  };
  std::deque<std::unique_ptr<Taken>> taken_;
  size_t taken_undetached_ = 0;
  std::unique_ptr<security::AeadCipher> own_cipher_;  // for small frames
  FrameInspector inspect_;
  // Last: it goes first, its threads done with the frames above.
  std::unique_ptr<CryptoWorkers> workers_;
};

}  // namespace fedwan::transport
