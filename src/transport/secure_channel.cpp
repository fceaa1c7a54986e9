#include "transport/secure_channel.hpp"

#include <cstring>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "transport/frame_peek.hpp"
#include "wire/frame.hpp"
#include "wire/frame_order.hpp"

namespace fedwan::transport {
namespace {

using peek::is_sealed;
using peek::kFlagsOffset;
using peek::kTypeOffset;
using peek::load_order;
using peek::looks_like_frame;
using peek::type_of;
using security::FrameOpener;

}  // namespace

// ---- SecureChannel ----------------------------------------------------------------

SecureChannel::SecureChannel(const SecureChannelConfig& config, bool is_client, std::string peer)
    : config_(config), is_client_(is_client), peer_(std::move(peer)) {
  if (!config_.tls) FEDWAN_THROW(ConfigError, "SecureChannel without TLS credentials");
}

SecureChannel::~SecureChannel() = default;

void SecureChannel::emit(LinkEvent::Kind kind, const std::string& reason) {
  if (!config_.on_event) return;
  LinkEvent e;
  e.kind = kind;
  e.peer = peer_;
  e.reason = reason;
  if (peer_identity_) {
    e.peer_node = peer_identity_->node_id;
    e.peer_role = role_name(peer_identity_->role);
  }
  e.peer_serial = peer_serial_;
  e.cipher = security::aead_name(cipher_);
  e.handshake_ms = handshake_ms_;
  config_.on_event(e);
}

std::vector<uint8_t> SecureChannel::handshake_frame(const std::vector<uint8_t>& records) const {
  wire::FrameHeader h;
  h.type = wire::MsgType::kHandshake;
  h.job_id = config_.job_id;
  h.sender = config_.self_index;
  // Only the ClientHello names the cipher: that marks a new handshake.
  h.codec = is_client_ && state_ == State::kIdle ? static_cast<uint8_t>(config_.cipher) : 0;
  return wire::encode_frame(h, records.data(), records.size());
}

void SecureChannel::reload_crl() {
  config_.tls->reload_crl_if_changed();
  if (!config_.tls->crl_problem().empty()) {
    emit(LinkEvent::Kind::kCrlUnusable, config_.tls->crl_problem());
  }
}

void SecureChannel::start(SecurityReplies* out) {
  if (!is_client_ || state_ != State::kIdle) return;
  reload_crl();
  pending_ = std::make_unique<security::TlsHandshake>(config_.tls, /*is_client=*/true);
  pending_cipher_ = config_.cipher;
  std::vector<uint8_t> records;
  pending_->step(nullptr, 0, &records);
  out->push_back(handshake_frame(records));
  state_ = State::kHandshaking;
}

void SecureChannel::adopt_keys(security::LinkKeys& keys, security::AeadAlgorithm cipher) {
  cipher_ = cipher;
  ++session_;
  keys_at_ = std::chrono::steady_clock::now();
  if (is_client_) {
    sealer_ = std::make_unique<security::FrameSealer>(
        cipher, keys.child_to_parent_key, keys.child_to_parent_iv, config_.rekey, keys.first_epoch);
    opener_ = std::make_unique<FrameOpener>(cipher, keys.parent_to_child_key,
                                            keys.parent_to_child_iv, keys.first_epoch);
  } else {
    sealer_ = std::make_unique<security::FrameSealer>(
        cipher, keys.parent_to_child_key, keys.parent_to_child_iv, config_.rekey, keys.first_epoch);
    opener_ = std::make_unique<FrameOpener>(cipher, keys.child_to_parent_key,
                                            keys.child_to_parent_iv, keys.first_epoch);
  }
  keys.wipe();
}

void SecureChannel::abandon_handshake() {
  pending_.reset();
  if (!is_client_ && state_ == State::kHandshaking) state_ = State::kIdle;
}

void SecureChannel::seal(std::vector<uint8_t>& bytes) {
  if (!established()) {
    throw TransportError("no secure session with '" + peer_ + "' yet: " +
                         (failure_.empty() ? std::string("handshake not complete") : failure_));
  }
  sealer_->seal(bytes);
}

std::vector<uint8_t> SecureChannel::sealed(const std::vector<uint8_t>& frame) {
  if (!established()) {
    throw TransportError("no secure session with '" + peer_ + "' yet: " +
                         (failure_.empty() ? std::string("handshake not complete") : failure_));
  }
  return sealer_->sealed(frame);
}

void SecureChannel::dropped(LinkEvent::Kind kind, std::string reason, uint64_t bytes) {
  if (!config_.on_event) return;
  LinkEvent e;
  e.kind = kind;
  e.peer = peer_;
  e.reason = std::move(reason);
  e.bytes = bytes;
  e.cipher = security::aead_name(cipher_);
  config_.on_event(e);
}

ChannelSecurity::Inbound SecureChannel::reject(std::string reason, uint64_t bytes,
                                               std::string* why) {
  *why = reason;
  dropped(LinkEvent::Kind::kFrameRejected, std::move(reason), bytes);
  return Inbound::kRejected;
}

ChannelSecurity::Inbound SecureChannel::other_session(std::string reason, uint64_t bytes,
                                                      std::string* why) {
  const auto since = std::chrono::steady_clock::now() - keys_at_;
  if (opener_ && since > config_.other_session_grace) {
    // Long into this session: no restart or key agreement explains it.
    const auto s = std::chrono::duration_cast<std::chrono::seconds>(since).count();
    return reject(reason + ", " + std::to_string(s) +
                      " s into this session (longer than a restart's leftovers take)",
                  bytes, why);
  }
  *why = reason;
  dropped(LinkEvent::Kind::kFrameOfOtherSession, std::move(reason), bytes);
  return Inbound::kOtherSession;
}

ChannelSecurity::Inbound SecureChannel::sealed_before_any_session(std::string reason,
                                                                  uint64_t bytes, std::string* why,
                                                                  SecurityReplies* out) {
  // Only a parent has further connections, and it has no session: it says
  // so as on the first connection.
  tell_no_session(out);
  return other_session(std::move(reason), bytes, why);
}

void SecureChannel::tell_no_session(SecurityReplies* out) {
  // Told once a second at most (the peer's heartbeats bring it again), and
  // only where no session and no handshake is: a child that is starting a
  // session needs no word.
  const auto now = std::chrono::steady_clock::now();
  if (is_client_ || pending_ || opener_ || now - no_session_told_ < std::chrono::seconds(1)) return;
  no_session_told_ = now;
  out->push_back(no_session_frame(config_.job_id, config_.self_index));
}

void SecureChannel::refuse_handshake(const std::string& reason, SecurityReplies* out) {
  pending_.reset();
  const std::optional<security::NodeIdentity> keep = peer_identity_;
  emit(LinkEvent::Kind::kHandshakeRefused, reason);
  if (!is_client_) {
    out->insert(out->begin(), plain_reject_frame(config_.job_id, config_.self_index,
                                                 "TLS handshake refused: " + reason));
  } else {
    failure_ = reason;
    state_ = State::kFailed;
  }
  peer_identity_ = keep;
}

ChannelSecurity::Inbound SecureChannel::on_handshake(const uint8_t* data, size_t size,
                                                     std::string* why, SecurityReplies* out) {
  const wire::ParsedFrame f = wire::parse_frame(data, size);
  if (!f.ok()) {
    return reject(std::string("malformed handshake frame: ") + f.detail, size, why);
  }
  if (f.header.job_id != config_.job_id) {
    return reject("handshake for another federation (job id mismatch)", size, why);
  }
  if ((f.header.flags & wire::kFlagNoSession) != 0) return on_no_session(f, size, why);
  if (is_client_) {
    if (state_ != State::kHandshaking || !pending_) {
      return reject("unexpected handshake message from the parent", size, why);
    }
  } else if (f.header.codec != 0) {
    // A ClientHello (the only child frame naming a cipher): a new handshake,
    // on first contact or from a child that restarted. The current keys stay
    // until it completes.
    reload_crl();
    pending_ = std::make_unique<security::TlsHandshake>(config_.tls, /*is_client=*/false);
    pending_cipher_ = static_cast<security::AeadAlgorithm>(f.header.codec);
    if (state_ == State::kIdle) state_ = State::kHandshaking;
  } else if (!pending_) {
    return reject("handshake continuation without a ClientHello", size, why);
  }
  std::vector<uint8_t> records;
  const auto st = pending_->step(f.payload, f.payload_size, &records);
  // A child that refuses its parent withholds its last flight.
  if (!records.empty() && st != security::TlsHandshake::State::kDone) {
    out->push_back(handshake_frame(records));
  }
  if (st == security::TlsHandshake::State::kInProgress) return Inbound::kConsumed;
  if (st == security::TlsHandshake::State::kFailed) {
    handshake_ms_ = pending_->elapsed_ms();
    const std::string err = pending_->error();
    if (!is_client_ && !established()) state_ = State::kIdle;
    refuse_handshake(err, out);
    *why = err;
    return Inbound::kConsumed;
  }
  // TLS completed: the certificate chains to our CA and is not revoked or
  // expired. Now: is this peer allowed on this link?
  handshake_ms_ = pending_->elapsed_ms();
  const security::NodeIdentity who = pending_->peer();
  peer_serial_ = pending_->peer_serial();
  std::optional<std::string> refusal;
  if (config_.authorize) refusal = config_.authorize(who, peer_);
  if (!records.empty() && !(is_client_ && refusal)) out->push_back(handshake_frame(records));
  if (refusal) {
    const std::optional<security::NodeIdentity> prev = peer_identity_;
    peer_identity_ = who;  // name the refused certificate in the event
    if (!is_client_ && !established()) state_ = State::kIdle;
    refuse_handshake(*refusal, out);
    failure_final_ = is_client_;  // an authenticated peer this node will not talk to
    if (!is_client_) peer_identity_ = prev;
    *why = *refusal;
    return Inbound::kConsumed;
  }
  security::LinkKeys keys = pending_->export_keys(pending_cipher_);
  pending_.reset();
  adopt_keys(keys, pending_cipher_);
  peer_identity_ = who;
  if (is_client_) {
    state_ = State::kAwaitConfirm;  // the parent has yet to accept us
  } else {
    std::vector<uint8_t> confirm = handshake_frame({});
    sealer_->seal(confirm);
    out->push_back(std::move(confirm));
    state_ = State::kEstablished;
    emit(LinkEvent::Kind::kHandshakeAccepted, "");
  }
  return Inbound::kConsumed;
}

ChannelSecurity::Inbound SecureChannel::on_no_session(const wire::ParsedFrame& f, uint64_t bytes,
                                                      std::string* why) {
  if (!is_client_ || f.payload_size != 0) {
    return reject("a parent's word that it holds no session, from a child or with a payload", bytes,
                  why);
  }
  // Only a session that is up can be one the parent lost: during a
  // handshake it is the word of a session this end is replacing anyway.
  if (state_ == State::kEstablished) {
    peer_without_session_ = std::chrono::steady_clock::now();
    dropped(LinkEvent::Kind::kPeerWithoutSession,
            "the parent holds no session with this node (it restarted, or someone on the path "
            "says so: unauthenticated)",
            bytes);
  }
  *why = "the parent holds no session with this node";
  return Inbound::kConsumed;
}

ChannelSecurity::Inbound SecureChannel::on_sealed(uint8_t* data, size_t size, size_t* frame_size,
                                                  std::string* why, SecurityReplies* out) {
  if (!opener_) {
    // No keys here yet: sealed in a session before this end's (the peer's
    // frames of one this end had before it restarted, or the parent's of
    // the child's last session, sent before it saw this one begin). A
    // parent tells the child, so that it starts a session sooner than its
    // heartbeat timeout would have it.
    tell_no_session(out);
    return other_session("sealed frame of an earlier session (none is established here yet)", size,
                         why);
  }
  const FrameOpener::Result r = opener_->open(data, size, frame_size);
  if (r == FrameOpener::Result::kOtherSession) {
    return other_session(std::string("sealed frame of another session: its key epoch is none of "
                                     "this session's (the peer restarted or the keys were agreed "
                                     "again while it was on its way)"),
                         size, why);
  }
  if (r != FrameOpener::Result::kOk) {
    return reject(std::string("sealed frame refused: ") + FrameOpener::result_name(r), size, why);
  }
  last_order_ =
      Order{session_, opener_->last_seq(), wire::order_class(data[kTypeOffset], data[kFlagsOffset]),
            wire::unpack_order(load_order(data))};
  if (type_of(data) == wire::MsgType::kHandshake) {
    if (is_client_ && state_ == State::kAwaitConfirm) {
      state_ = State::kEstablished;
      emit(LinkEvent::Kind::kHandshakeAccepted, "");
    }
    return Inbound::kConsumed;
  }
  if (state_ != State::kEstablished) {
    // Only a parent that accepted this child holds the keys to seal for it:
    // a data frame that opens confirms the session as the empty handshake
    // frame does (on a striped link it may overtake that one).
    if (!is_client_ || state_ != State::kAwaitConfirm) {
      return reject("data frame before the session was established", size, why);
    }
    state_ = State::kEstablished;
    emit(LinkEvent::Kind::kHandshakeAccepted, "");
  }
  return Inbound::kFrame;
}

namespace {

// A data frame of one session of one channel, opened elsewhere.
struct SealedDetached final : DetachedFrame {
  SealedDetached(const SecureChannel* c, uint64_t s, std::unique_ptr<security::DetachedOpen> o)
      : channel(c), session(s), open(std::move(o)) {}
  bool run(uint8_t* data, std::unique_ptr<security::AeadCipher>* cipher) const override {
    return open->run(data, cipher);
  }
  size_t payload() const override { return open->payload(); }
  size_t opened_size() const override { return open->opened_size(); }
  const SecureChannel* channel;
  uint64_t session;
  std::unique_ptr<security::DetachedOpen> open;
};

}  // namespace

std::unique_ptr<DetachedFrame> SecureChannel::detach(const uint8_t* data, size_t size) {
  if (!opener_ || state_ != State::kEstablished || !looks_like_frame(data, size) ||
      !is_sealed(data) || type_of(data) == wire::MsgType::kHandshake) {
    return nullptr;
  }
  std::unique_ptr<security::DetachedOpen> open = opener_->detach(data, size);
  if (!open) return nullptr;
  return std::make_unique<SealedDetached>(this, session_, std::move(open));
}

ChannelSecurity::Inbound SecureChannel::finish(const DetachedFrame& frame, bool authenticated,
                                               uint8_t* data, size_t size, size_t* frame_size,
                                               std::string* why) {
  last_order_.reset();
  const auto* d = dynamic_cast<const SealedDetached*>(&frame);
  if (d == nullptr || d->channel != this || !opener_) {
    return reject("sealed frame detached by another channel", size, why);
  }
  if (d->session != session_) {
    // Keys agreed again meanwhile: the frame was checked against a session
    // that is over.
    return other_session("sealed frame of an ended session (the keys were agreed again while it "
                         "was opened)",
                         size, why);
  }
  const FrameOpener::Result r = opener_->finish(*d->open, authenticated, data, frame_size);
  if (r != FrameOpener::Result::kOk) {
    return reject(std::string("sealed frame refused: ") + FrameOpener::result_name(r), size, why);
  }
  last_order_ =
      Order{session_, opener_->last_seq(), wire::order_class(data[kTypeOffset], data[kFlagsOffset]),
            wire::unpack_order(load_order(data))};
  return Inbound::kFrame;
}

ChannelSecurity::Inbound SecureChannel::receive(uint8_t* data, size_t size, size_t* frame_size,
                                                std::string* why, SecurityReplies* out) {
  last_order_.reset();
  if (!looks_like_frame(data, size)) {
    return reject("not a fedwan frame (" + std::to_string(size) + " bytes)", size, why);
  }
  if (is_sealed(data)) return on_sealed(data, size, frame_size, why, out);
  const wire::MsgType type = type_of(data);
  if (type == wire::MsgType::kHandshake) return on_handshake(data, size, why, out);
  if (type == wire::MsgType::kReject && is_client_ && state_ != State::kEstablished &&
      state_ != State::kFailed) {
    // The parent could not read us (no session yet): its refusal comes plain.
    const wire::ParsedFrame f = wire::parse_frame(data, size);
    std::string reason = f.ok()
                             ? std::string(reinterpret_cast<const char*>(f.payload), f.payload_size)
                             : std::string("unreadable refusal");
    failure_ = "parent refused this node: " + reason;
    state_ = State::kFailed;
    pending_.reset();
    emit(LinkEvent::Kind::kHandshakeRefused, failure_);
    *why = failure_;
    return Inbound::kConsumed;
  }
  if (type == wire::MsgType::kReject && is_client_) {
    // Anyone on the path can send a plain refusal; a session that is up
    // does not end on one.
    const wire::ParsedFrame f = wire::parse_frame(data, size);
    return reject("unauthenticated plain refusal ignored (the session is up): " +
                      (f.ok()
                           ? std::string(reinterpret_cast<const char*>(f.payload), f.payload_size)
                           : std::string("unreadable")),
                  size, why);
  }
  std::string reason =
      "plaintext frame refused: this link requires mutual TLS (the peer runs without "
      "credentials or with --insecure-plaintext)";
  if (!is_client_ && !established() && type != wire::MsgType::kReject) {
    out->push_back(plain_reject_frame(
        config_.job_id, config_.self_index,
        "this node requires mutual TLS and refuses plaintext peers; start the node with its "
        "credentials bundle from `fedwan certs`"));
  }
  return reject(std::move(reason), size, why);
}

}  // namespace fedwan::transport
