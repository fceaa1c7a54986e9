// One node's security set-up: its TLS credentials and signing key, the
// security layer for each of its links (mutual TLS + AEAD, or plaintext when
// explicitly asked for), who may reach it, authorization against the
// topology, its audit log, and its alarms. Shared by Aggregator and
// SiteCore. Owned by the node's thread.
//
// Noise: events a peer can cause at will (refused frames and handshakes,
// protocol refusals) go through a NoiseFilter, so a flood costs a bounded
// number of log lines and audit entries; what was held back is summarised
// (a "suppressed" audit entry and one log line per kind and window).
//
// Alarms: conditions an operator must act on while the node keeps serving
// (the audit log cannot be written, the CRL is unusable, expiring or
// expired, stderr cannot be written). Each is logged at error level with
// "ALARM", audited when the audit log takes it, and listed by alarms() for
// the node's summary; repeats are rate limited.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fedwan/security.hpp"
#include "fedwan/topology.hpp"
#include "security/noise_filter.hpp"
#include "transport/links.hpp"

namespace fedwan::security {
class AuditLog;
class TlsContext;
class NodeKey;
class SignatureVerifier;
}  // namespace fedwan::security

namespace fedwan::transport {
struct SecureChannelConfig;
}  // namespace fedwan::transport

namespace fedwan::node {

class NodeSecurity {
 public:
  // Throws ConfigError when neither credentials nor insecure_plaintext are
  // given, when the bundle belongs to another node (its certificate must
  // name this node, role and job), or the cipher is unknown; CryptoError
  // when the node's own certificate is expired, revoked or foreign.
  NodeSecurity(const SecurityOptions& options, const Topology& topology, const NodeSpec& self);
  // Summarises what the noise filter held back and closes the audit log
  // (its signed closing head).
  ~NodeSecurity();

  bool plaintext() const { return tls_ == nullptr; }
  transport::SecurityFactory children_factory();  // this node as parent (TLS server)
  transport::SecurityFactory parent_factory();    // this node as child (TLS client)
  // Who may reach this node as a child at all (see LinkAdmission).
  transport::LinkAdmission children_admission();

  // Appends to the audit log (no-op without one). `fields` is a JSON object.
  void audit(const std::string& event, const nlohmann::json& fields);
  // An event a peer can cause at will: logged at warn (`log_line`; at info
  // when not `warn`) and audited at most a burst per `key` and window, the
  // rest summarised. True when it was written.
  bool audit_noise(const std::string& event, const std::string& key, const nlohmann::json& fields,
                   const std::string& log_line, uint64_t bytes = 0, bool warn = true);
  // The same for a log line alone; true when it was written.
  bool log_noise(const std::string& key, const std::string& log_line);
  void audit_sync();
  bool auditing() const { return audit_ != nullptr; }
  // The audit log's last entry (nullopt without a log or while empty).
  struct AuditHead {
    uint64_t seq = 0;
    std::string hash;
  };
  std::optional<AuditHead> audit_head() const;
  // Checks that the audit log still holds a head recorded earlier (in a
  // checkpoint); raises the audit_truncated alarm and audits it when not.
  void check_audit_head(uint64_t seq, const std::string& hash);

  // Raises alarm `kind` (see above).
  void alarm(const std::string& kind, const std::string& message);
  // "kind: message" of every alarm raised, the latest message per kind.
  std::vector<std::string> alarms() const;
  // Periodic upkeep (every heartbeat or so): the CRL (reloaded if changed,
  // checked for expiry, at most every 10 s), the audit log's waiting
  // entries, noise summaries, stderr failures. `all`: everything now (at the
  // end of a run, before the alarms are read).
  void tick(bool all = false);
  // Reads the CRL now (when it changed, it is in force for handshakes and
  // signatures at once): before judging a signature that a revocation just
  // written must be able to stop.
  void refresh_crl() {
    if (tls_) check_crl();
  }

  // This node's signing key and the federation's verifier; null in plaintext.
  std::shared_ptr<const security::NodeKey> key() const { return key_; }
  std::shared_ptr<const security::SignatureVerifier> verifier() const { return verifier_; }
  // Handshake times (ms) of the links to this node's children, in order.
  const std::vector<double>& handshake_ms() const { return handshake_ms_; }

 private:
  using Clock = std::chrono::steady_clock;
  void on_link_event(const transport::LinkEvent& e, bool as_parent);
  // The settings both sides of this node's secure links share.
  transport::SecureChannelConfig channel_config(transport::LinkEventSink sink) const;
  void check_crl();
  void check_audit_health();
  void flush_noise(bool all);

  SecurityOptions options_;
  const Topology& topology_;
  const NodeSpec& self_;
  std::shared_ptr<security::TlsContext> tls_;
  std::shared_ptr<const security::NodeKey> key_;
  std::shared_ptr<const security::SignatureVerifier> verifier_;
  std::unique_ptr<security::AuditLog> audit_;
  std::vector<double> handshake_ms_;
  security::NoiseFilter noise_;
  security::NoiseFilter alarm_noise_;  // alarm repeats: once per kind per hour
  struct Alarm {
    std::string message;
    uint64_t count = 0;
  };
  std::map<std::string, Alarm> alarms_;
  bool audit_alarm_ = false;  // the audit log's writes are failing
  bool in_alarm_ = false;     // alarm() is auditing (no alarm about that audit)
  uint64_t audit_lost_seen_ = 0;
  uint64_t log_failures_seen_ = 0;
  Clock::time_point next_crl_check_{};
};

// Wraps each channel a node of this process opens toward its parent, after
// the mechanism is built (mutual TLS or plaintext) and before any frame
// passes. For programs built on the library that must act as a node which
// changes its own frames before they are sealed: the dishonest site of the
// robustness tests (tests/tools/dishonest_site.cpp). The product never sets
// one. Set it before any node starts; null (the default): no wrapper.
using ParentChannelWrapper = std::function<std::unique_ptr<transport::ChannelSecurity>(
    std::unique_ptr<transport::ChannelSecurity>)>;
void set_parent_channel_wrapper(ParentChannelWrapper wrapper);

}  // namespace fedwan::node
