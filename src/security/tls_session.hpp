// Mutual TLS 1.3 over memory BIOs: the handshake's records travel in
// kHandshake frames over the node's ZeroMQ link, so TLS authenticates both
// ends and agrees keys, and fedwan then protects frames with keys taken from
// the TLS exporter (RFC 8446 section 7.5). No TLS record layer is used after
// the handshake and the SSL object is freed as soon as keys are exported.
//
// TlsContext: one per node, from its credentials bundle; thread safe after
// construction except reload_crl_if_changed() (call from the owning thread).
// TlsHandshake: one per link attempt; one owner.
#pragma once

#include <sys/types.h>
#include <array>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "security/aead.hpp"
#include "security/identity.hpp"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace fedwan::security {

class TlsContext {
 public:
  // Loads ca.pem, cert.pem, key.pem and crl.pem from `bundle_dir`. Throws
  // ConfigError naming the missing, oversized or unreadable file, or
  // CryptoError when this node's own certificate is not valid now (expired,
  // not yet valid, revoked, or not issued by the bundle's CA) or the CRL
  // expired more than `crl_grace` ago, so a node never starts with
  // credentials its peers will refuse. Tests that play an attacker with such
  // credentials pass verify_own = false.
  //
  // An expired CRL is still applied (what it revokes stays revoked) for
  // `crl_grace` past its nextUpdate, so a CRL nobody refreshed in time does
  // not stop the federation at once; crl_expired() tells the node to raise
  // its alarm. Past the grace, verification fails and says how to refresh.
  explicit TlsContext(const std::string& bundle_dir, bool verify_own = true,
                      std::chrono::seconds crl_grace = std::chrono::hours(24 * 7));
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  const NodeIdentity& self() const { return self_; }
  const std::string& bundle_dir() const { return dir_; }
  // Re-reads crl.pem and takes it when its content changed, so revocations
  // take effect at the next handshake without a restart; true when a new
  // CRL came into force. A file that cannot be used (unreadable,
  // half-written, not signed by the CA, no nextUpdate) leaves the last good
  // CRL in force; crl_problem() says why until a good one arrives. Never
  // throws. Call from the owning thread.
  bool reload_crl_if_changed();
  // Why the current crl.pem on disk is not in force; empty when it is.
  const std::string& crl_problem() const { return crl_problem_; }
  // The CRL in force: when it was issued and when it expires (UTC seconds).
  std::time_t crl_last_update() const { return crl_last_update_; }
  std::time_t crl_next_update() const { return crl_next_update_; }
  std::chrono::seconds crl_grace() const { return crl_grace_; }
  SSL_CTX* ctx() const { return ctx_; }

 private:
  void build(const std::string& crl_text);

  std::string dir_;
  bool verify_own_ = true;
  std::chrono::seconds crl_grace_;
  NodeIdentity self_;
  SSL_CTX* ctx_ = nullptr;
  std::array<uint8_t, 32> crl_digest_{};  // SHA-256 of crl.pem as last read
  std::time_t crl_last_update_ = 0;
  std::time_t crl_next_update_ = 0;
  std::string crl_problem_;
};

// Whether a CRL that expired at `next_update` may still be applied at `now`.
bool crl_in_grace(std::time_t next_update, std::chrono::seconds grace, std::time_t now);

// Keys for the two directions of a link, from the exporter, and the key
// epoch the session's frames start at in both directions: drawn from the
// exporter too (under a label of its own), so that a frame sealed in
// another session of the link (before the peer restarted, or before the
// two agreed keys again) is told apart by its epoch, before any
// cryptography, from one of this session that was tampered with.
struct LinkKeys {
  AeadKey child_to_parent_key{}, parent_to_child_key{};
  AeadNonce child_to_parent_iv{}, parent_to_child_iv{};
  uint32_t first_epoch = 0;
  void wipe();
};

class TlsHandshake {
 public:
  enum class State { kInProgress, kDone, kFailed };

  // The child of a link is the TLS client, the parent the server.
  TlsHandshake(std::shared_ptr<TlsContext> context, bool is_client);
  ~TlsHandshake();
  TlsHandshake(const TlsHandshake&) = delete;
  TlsHandshake& operator=(const TlsHandshake&) = delete;

  // Feeds bytes from the peer (none to start a client) and appends the
  // bytes to send to *out (possibly also on failure: a TLS alert).
  State step(const uint8_t* in, size_t size, std::vector<uint8_t>* out);
  State state() const { return state_; }
  // Why it failed, in words: the certificate verification error (unknown CA,
  // expired, revoked, ...) or the alert the peer sent.
  const std::string& error() const { return error_; }
  // After kDone: who the peer's certificate says it is.
  const NodeIdentity& peer() const { return peer_; }
  std::string peer_serial() const { return peer_serial_; }
  // After kDone: derives the link's keys with SSL_export_keying_material and
  // frees the TLS state (wiping its secrets). Callable once. The frame
  // cipher both ends use is the exporter's context, so the cipher the child
  // named (in a frame header no one authenticated yet) is bound to the
  // handshake: two ends that disagree on it derive different keys, and the
  // parent's sealed confirmation fails at the child.
  LinkKeys export_keys(AeadAlgorithm cipher);
  double elapsed_ms() const;

 private:
  void fail(std::string why);

  std::shared_ptr<TlsContext> context_;
  bool is_client_;
  SSL* ssl_ = nullptr;
  State state_ = State::kInProgress;
  std::string error_;
  NodeIdentity peer_;
  std::string peer_serial_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace fedwan::security
