// The slot between framing and the socket where a security mechanism sits:
// a handshake, then seal/open of every frame. One instance per peer of a
// link; not thread safe (owned by the thread that owns the socket).
//
// Mechanisms: PlaintextSecurity (below, only when asked for explicitly) and
// SecureChannel (secure_channel.hpp: mutual TLS 1.3, then AEAD frames).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wire/frame_order.hpp"

namespace fedwan::security {
class AeadCipher;
class FrameSealer;
}  // namespace fedwan::security

namespace fedwan::transport {

// Bytes the mechanism wants sent to the peer: handshake records, refusals.
using SecurityReplies = std::vector<std::vector<uint8_t>>;

// What happened on a link, for the node's log and audit trail.
struct LinkEvent {
  // kCrlUnusable: a handshake found crl.pem changed but unusable; the last
  // good CRL stays in force (reason says why). kFrameOfOtherSession: a
  // sealed frame dropped as one of another session of the link, sealed
  // before the peer restarted or before the two agreed keys again (its
  // key epoch is none of this session's, or it came before any session):
  // what a restart leaves on the way, not a frame tampered with.
  enum class Kind {
    kHandshakeAccepted,
    kHandshakeRefused,
    kFrameRejected,
    kCrlUnusable,
    kFrameOfOtherSession,
    // Child side: the parent said, in the clear, that it holds no session
    // with this node (wire::kFlagNoSession).
    kPeerWithoutSession
  };
  Kind kind = Kind::kFrameRejected;
  std::string peer;       // routing id (parent side) or parent endpoint (child side)
  std::string reason;     // refusals: why, in words
  std::string peer_node;  // handshakes: who the peer's certificate names
  std::string peer_role;
  std::string peer_serial;
  std::string cipher;
  double handshake_ms = 0;
  uint64_t bytes = 0;  // rejected frames: their size
};
using LinkEventSink = std::function<void(const LinkEvent&)>;

// A received frame whose opening left the owner's thread: ChannelSecurity::
// detach() made it, any thread may run() it (with a cipher of that
// thread's own), and the owner gives it back to finish().
class DetachedFrame {
 public:
  virtual ~DetachedFrame() = default;
  // Decrypts and authenticates the frame at `data` in place; true when it
  // verified, and then data[0, opened_size()) is the frame finish() hands
  // on if it takes it. Throws CryptoError only on a failure of the library.
  virtual bool run(uint8_t* data, std::unique_ptr<security::AeadCipher>* cipher) const = 0;
  // Bytes of payload to decrypt (small frames are not worth another thread).
  virtual size_t payload() const = 0;
  virtual size_t opened_size() const = 0;
};

class ChannelSecurity {
 public:
  enum class Inbound {
    kFrame,     // a data frame, opened in place: data[0, *frame_size)
    kConsumed,  // a handshake message, handled; replies may be in *out
    kRejected,  // dropped; *why says why (already reported to the sink)
    // Dropped as a frame of another session of the link (LinkEvent::
    // kFrameOfOtherSession, reported to the sink): not counted as rejected.
    kOtherSession,
  };

  virtual ~ChannelSecurity() = default;
  virtual std::string_view name() const = 0;
  // Data frames may be sealed and will be accepted.
  virtual bool established() const = 0;
  // Non-empty once the handshake failed for good (child side): why.
  virtual const std::string& failure() const = 0;
  // The failure is this node's own verdict on a peer that proved who it is
  // (it completed TLS, then was not the parent the topology names): trying
  // again cannot help. Anything an unauthenticated party can cause (a plain
  // refusal, a TLS alert, a certificate that does not verify) is not final:
  // the real parent may still answer.
  virtual bool failure_is_final() const { return false; }
  // Child side: the first handshake flight, appended to *out.
  virtual void start(SecurityReplies* out) { (void)out; }

  // Turns an encoded frame (header + payload) into the bytes to send; the
  // header stays readable and authenticated. Grows the buffer. Precondition:
  // established().
  virtual void seal(std::vector<uint8_t>& bytes) = 0;
  // The same for a frame the caller keeps: the bytes to send are new (a
  // mechanism that seals across, as SecureChannel does, copies nothing
  // besides).
  static constexpr size_t kSealGrowth = 64;  // room for any mechanism's trailer
  virtual std::vector<uint8_t> sealed(const std::vector<uint8_t>& frame) {
    std::vector<uint8_t> bytes;
    bytes.reserve(frame.size() + kSealGrowth);
    bytes.assign(frame.begin(), frame.end());
    seal(bytes);
    return bytes;
  }
  // What seals this channel's outgoing frames, for sealing them off the
  // owner's thread (security::SealingPipeline); null for a mechanism that
  // does not seal, or before established().
  virtual security::FrameSealer* sealer() { return nullptr; }

  // Handles one received message in place.
  virtual Inbound receive(uint8_t* data, size_t size, size_t* frame_size, std::string* why,
                          SecurityReplies* out) = 0;
  // A message of `bytes` that the link can tell, without opening it, was
  // sealed for a session this end has not got (a sealed frame, or a piece
  // of one, on a striped peer's further connection before any session
  // here: what the peer sent before this end restarted). Dropped and
  // reported as receive() reports a frame of another session: kOtherSession
  // where the mechanism has sessions, kRejected where it has none; what the
  // peer is told, as receive() would tell it, goes to *out (for its first
  // connection).
  virtual Inbound sealed_before_any_session(std::string reason, uint64_t bytes, std::string* why,
                                            SecurityReplies* out) = 0;

  // receive() in two steps, for opening frames on other threads: a data
  // frame of an established session that needs nothing but decrypting and
  // recording is detached (null for every other message: receive() it, in
  // its turn); once run, finish() does what receive() would have, with the
  // same results, refusals and events. Messages are finished or received
  // in the order they came, and nothing but other detached frames is
  // received between a detach() and its finish().
  virtual std::unique_ptr<DetachedFrame> detach(const uint8_t* data, size_t size) {
    (void)data;
    (void)size;
    return nullptr;
  }
  virtual Inbound finish(const DetachedFrame& frame, bool authenticated, uint8_t* data, size_t size,
                         size_t* frame_size, std::string* why) {
    (void)frame;
    (void)authenticated;
    (void)data;
    (void)size;
    (void)frame_size;
    *why = "this channel detaches no frames";
    return Inbound::kRejected;
  }

  // Where the message the last receive() opened stands in its sender's
  // order: the session (a new one starts with each key agreement) and its
  // authenticated sequence number there. Set for sealed messages (kFrame,
  // and sealed kConsumed); nullopt for the rest, and for mechanisms without
  // sequence numbers. Links striped over several connections put frames
  // back in order by it (transport/resequencer.hpp).
  // `klass` and `tag` say what the frame may overtake and what it must not
  // (wire/frame_order.hpp), from its authenticated header.
  struct Order {
    uint64_t session = 0;
    uint64_t seq = 0;
    wire::OrderClass klass = wire::OrderClass::kBarrier;
    wire::OrderTag tag{};
  };
  virtual std::optional<Order> last_order() const { return std::nullopt; }

  // Key agreements (sessions) so far on this channel; 0 for mechanisms
  // that agree none. A parent follows a child to the link whose message
  // made the count grow (ChildrenLink). A wrapper forwards it.
  virtual uint64_t key_agreements() const = 0;

  // Child side: when the parent's end last said, in the clear, that it
  // holds no session with this node (wire::kFlagNoSession: it restarted and
  // cannot open what this node seals), while this session was up. Anyone on
  // the path could say so: it only shortens how long the parent's silence
  // is waited out (session::ParentSession::silent).
  virtual std::optional<std::chrono::steady_clock::time_point> peer_without_session() const {
    return std::nullopt;
  }

  // Parent side: a handshake is in progress (its state is held), and
  // dropping it (it took too long). An established session survives.
  virtual bool handshaking() const { return false; }
  virtual void abandon_handshake() {}
};

// No protection: frames travel as encoded. Only when a deployment asks for
// it explicitly (loopback experiments); it refuses secure peers' handshake
// and sealed frames with a message saying so.
class PlaintextSecurity final : public ChannelSecurity {
 public:
  PlaintextSecurity(uint64_t job_id, uint32_t self_index, LinkEventSink sink, std::string peer);
  std::string_view name() const override { return "plaintext"; }
  bool established() const override { return true; }
  uint64_t key_agreements() const override { return 0; }
  const std::string& failure() const override { return failure_; }
  void seal(std::vector<uint8_t>&) override {}
  Inbound receive(uint8_t* data, size_t size, size_t* frame_size, std::string* why,
                  SecurityReplies* out) override;
  Inbound sealed_before_any_session(std::string reason, uint64_t bytes, std::string* why,
                                    SecurityReplies* out) override;

 private:
  // Tells the sink of a message dropped (why) and says so.
  Inbound rejected(const std::string& why, uint64_t bytes);

  uint64_t job_id_;
  uint32_t self_index_;
  LinkEventSink sink_;
  std::string peer_;
  std::string failure_;
};

// A plain kReject frame carrying `reason`: what a node can still tell a peer
// it has no session with.
std::vector<uint8_t> plain_reject_frame(uint64_t job_id, uint32_t self_index,
                                        const std::string& reason);
// A plain kHandshake with wire::kFlagNoSession: a parent tells a child whose
// sealed frame it cannot open that it holds no session with it.
std::vector<uint8_t> no_session_frame(uint64_t job_id, uint32_t self_index);
bool is_no_session_frame(const std::vector<uint8_t>& bytes);

}  // namespace fedwan::transport
