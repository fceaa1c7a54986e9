// One node's security set-up: its TLS credentials, the security layer for
// each of its links (mutual TLS + AEAD, or plaintext when explicitly asked
// for), authorization against the topology, and its audit log. Shared by
// Aggregator and SiteCore. Owned by the node's thread.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "fedwan/security.hpp"
#include "fedwan/topology.hpp"
#include "transport/links.hpp"

namespace fedwan::security {
class AuditLog;
class TlsContext;
}  // namespace fedwan::security

namespace fedwan {
struct SecureChannelConfig;
}  // namespace fedwan

namespace fedwan::runtime {

class NodeSecurity {
 public:
  // Throws ConfigError when neither credentials nor insecure_plaintext are
  // given, when the bundle belongs to another node (its certificate must
  // name this node, role and job), or the cipher is unknown; CryptoError
  // when the node's own certificate is expired, revoked or foreign.
  NodeSecurity(const SecurityOptions& options, const Topology& topology, const NodeSpec& self);
  ~NodeSecurity();

  bool plaintext() const { return tls_ == nullptr; }
  SecurityFactory children_factory();  // this node as parent (TLS server)
  SecurityFactory parent_factory();    // this node as child (TLS client)

  // Appends to the audit log (no-op without one). `fields` is a JSON object.
  void audit(const std::string& event, const nlohmann::json& fields);
  void audit_sync();
  bool auditing() const { return audit_ != nullptr; }
  // Handshake times (ms) of the links to this node's children, in order.
  const std::vector<double>& handshake_ms() const { return handshake_ms_; }

 private:
  void on_link_event(const LinkEvent& e, bool as_parent);
  // The settings both sides of this node's secure links share.
  SecureChannelConfig channel_config(LinkEventSink sink) const;

  SecurityOptions options_;
  const Topology& topology_;
  const NodeSpec& self_;
  std::shared_ptr<security::TlsContext> tls_;
  std::unique_ptr<security::AuditLog> audit_;
  std::vector<double> handshake_ms_;
};

}  // namespace fedwan::runtime
