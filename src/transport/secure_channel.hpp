// SecureChannel: the mutual-TLS + AEAD mechanism of a link (see
// docs/security.md and docs/protocol.md, "Secure channel").
//
//   child (TLS client)                      parent (TLS server)
//   kHandshake[ClientHello, codec=cipher] ->
//                                        <- kHandshake[ServerHello..Finished]
//   verify parent cert, authorize
//   kHandshake[Certificate..Finished]    ->
//                                           verify child cert, authorize
//                                        <- sealed empty kHandshake (confirm)
//   established                             established
//
// Keys come from the TLS exporter, one per direction; frames are then sealed
// by security::FrameSealer/FrameOpener. A refusal is reported to the event
// sink and told to the peer in a plain kReject (it has no keys to read a
// sealed one). A parent keeps a child's current keys while the child runs a
// new handshake (after a restart) and switches when it completes. A parent
// with no session (it restarted) answers a child's sealed frame with a plain
// kHandshake flagged kFlagNoSession, so the child judges its silence sooner.
//
// Not thread safe: owned by the link's thread.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "security/frame_protector.hpp"
#include "security/identity.hpp"
#include "security/tls_session.hpp"
#include "transport/channel_security.hpp"
#include "wire/frame.hpp"

namespace fedwan::transport {

struct SecureChannelConfig {
  std::shared_ptr<security::TlsContext> tls;
  security::AeadAlgorithm cipher = security::AeadAlgorithm::kAes256Gcm;  // child side
  security::RekeyPolicy rekey;
  uint64_t job_id = 0;
  uint32_t self_index = 0;
  // Decides whether the authenticated peer may be on this link: nullopt to
  // accept, else the reason to refuse. `claimed` is the peer's routing id
  // (parent side) or the id of the parent expected (child side).
  std::function<std::optional<std::string>(const security::NodeIdentity& peer,
                                           const std::string& claimed)>
      authorize;
  LinkEventSink on_event;
  // How long after keys are agreed a sealed frame of another session is
  // taken for what a restart or the new agreement left on the way (a
  // LinkEvent::kFrameOfOtherSession). Later, nothing explains one: it is
  // a rejected frame. Before this end has any session, there is nothing
  // to tamper with and such a frame is always of another session.
  std::chrono::milliseconds other_session_grace{30000};
};

class SecureChannel final : public ChannelSecurity {
 public:
  SecureChannel(const SecureChannelConfig& config, bool is_client, std::string peer);
  ~SecureChannel() override;

  std::string_view name() const override { return "mtls"; }
  bool established() const override { return sealer_ != nullptr && state_ == State::kEstablished; }
  const std::string& failure() const override { return failure_; }
  bool failure_is_final() const override { return failure_final_; }
  void start(SecurityReplies* out) override;
  void seal(std::vector<uint8_t>& bytes) override;
  std::vector<uint8_t> sealed(const std::vector<uint8_t>& frame) override;
  Inbound receive(uint8_t* data, size_t size, size_t* frame_size, std::string* why,
                  SecurityReplies* out) override;
  Inbound sealed_before_any_session(std::string reason, uint64_t bytes, std::string* why,
                                    SecurityReplies* out) override;

  std::unique_ptr<DetachedFrame> detach(const uint8_t* data, size_t size) override;
  Inbound finish(const DetachedFrame& frame, bool authenticated, uint8_t* data, size_t size,
                 size_t* frame_size, std::string* why) override;

  uint64_t key_agreements() const override { return session_; }
  std::optional<Order> last_order() const override { return last_order_; }
  bool handshaking() const override { return pending_ != nullptr; }
  std::optional<std::chrono::steady_clock::time_point> peer_without_session() const override {
    return peer_without_session_;
  }
  void abandon_handshake() override;

  // The peer's identity once established (nullopt before).
  const std::optional<security::NodeIdentity>& peer_identity() const { return peer_identity_; }
  // The sender of this channel's direction, for a SealingPipeline.
  security::FrameSealer* sealer() override { return sealer_.get(); }

 private:
  enum class State { kIdle, kHandshaking, kAwaitConfirm, kEstablished, kFailed };

  // Picks up a changed crl.pem; reports one that cannot be used.
  void reload_crl();
  Inbound on_handshake(const uint8_t* data, size_t size, std::string* why, SecurityReplies* out);
  Inbound on_sealed(uint8_t* data, size_t size, size_t* frame_size, std::string* why,
                    SecurityReplies* out);
  // The parent's word, in the clear, that it holds no session with this
  // child (wire::kFlagNoSession).
  Inbound on_no_session(const wire::ParsedFrame& f, uint64_t bytes, std::string* why);
  // Parent side, no session with the peer: tells it so, at most once a
  // second, unless a handshake with it is under way.
  void tell_no_session(SecurityReplies* out);
  Inbound reject(std::string reason, uint64_t bytes, std::string* why);
  // A sealed frame of another session of the link, dropped.
  Inbound other_session(std::string reason, uint64_t bytes, std::string* why);
  // Tells the event sink of a frame dropped (kind: why).
  void dropped(LinkEvent::Kind kind, std::string reason, uint64_t bytes);
  void refuse_handshake(const std::string& reason, SecurityReplies* out);
  void adopt_keys(security::LinkKeys& keys, security::AeadAlgorithm cipher);
  std::vector<uint8_t> handshake_frame(const std::vector<uint8_t>& records) const;
  void emit(LinkEvent::Kind kind, const std::string& reason);

  SecureChannelConfig config_;
  bool is_client_;
  std::string peer_;
  State state_ = State::kIdle;
  std::string failure_;
  bool failure_final_ = false;
  std::unique_ptr<security::TlsHandshake> pending_;
  security::AeadAlgorithm pending_cipher_ = security::AeadAlgorithm::kAes256Gcm;
  security::AeadAlgorithm cipher_ = security::AeadAlgorithm::kAes256Gcm;
  std::unique_ptr<security::FrameSealer> sealer_;
  std::unique_ptr<security::FrameOpener> opener_;
  std::optional<security::NodeIdentity> peer_identity_;
  std::string peer_serial_;
  double handshake_ms_ = 0;
  uint64_t session_ = 0;                             // key agreements so far
  std::chrono::steady_clock::time_point keys_at_{};  // the last agreement's
  std::optional<Order> last_order_;
  // Parent side: when it last told this peer it holds no session with it
  // (at most once a second). Child side: when its parent last said so.
  std::chrono::steady_clock::time_point no_session_told_{};
  std::optional<std::chrono::steady_clock::time_point> peer_without_session_;
};

}  // namespace fedwan::transport
