#include "runtime/node_security.hpp"

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "runtime/authorization.hpp"
#include "security/aead.hpp"
#include "security/audit_log.hpp"
#include "security/tls_session.hpp"
#include "transport/secure_channel.hpp"

namespace fedwan::runtime {

NodeSecurity::NodeSecurity(const SecurityOptions& options, const Topology& topology,
                           const NodeSpec& self)
    : options_(options), topology_(topology), self_(self) {
  if (!options_.audit_log.empty()) {
    audit_ = std::make_unique<security::AuditLog>(options_.audit_log, self_.id);
  }
  (void)security::aead_by_name(options_.cipher);  // unknown names fail here, at start
  if (options_.insecure_plaintext) {
    if (!options_.credentials_dir.empty()) {
      throw ConfigError("node '" + self_.id + "': both credentials and insecure_plaintext given; "
                        "choose one (credentials are the safe choice)");
    }
    audit("security_mode", {{"mode", "plaintext"}});
    return;
  }
  if (options_.credentials_dir.empty()) {
    throw ConfigError("node '" + self_.id + "' has no credentials: links are encrypted by "
                      "default, so give it its bundle (made by `fedwan certs init --topology "
                      "FILE --out DIR`, then DIR/" + self_.id + "), or run a loopback "
                      "experiment with insecure plaintext (--insecure-plaintext)");
  }
  tls_ = std::make_shared<security::TlsContext>(options_.credentials_dir);
  const security::NodeIdentity& me = tls_->self();
  if (me.node_id != self_.id || me.role != self_.role || me.job != topology_.job()) {
    throw ConfigError("credentials in '" + options_.credentials_dir + "' are for " +
                      role_name(me.role) + " '" + me.node_id + "' of job '" + me.job +
                      "', not for " + role_name(self_.role) + " '" + self_.id + "' of job '" +
                      topology_.job() + "'; use this node's own bundle");
  }
  audit("security_mode", {{"mode", "mtls"}, {"cipher", options_.cipher},
                          {"credentials", options_.credentials_dir}});
}

NodeSecurity::~NodeSecurity() = default;

void NodeSecurity::audit(const std::string& event, const nlohmann::json& fields) {
  if (audit_) audit_->append(event, fields);
}

void NodeSecurity::audit_sync() {
  if (audit_) audit_->sync();
}

void NodeSecurity::on_link_event(const LinkEvent& e, bool as_parent) {
  const char* side = as_parent ? "child" : "parent";
  switch (e.kind) {
    case LinkEvent::Kind::kHandshakeAccepted:
      if (as_parent) handshake_ms_.push_back(e.handshake_ms);
      log().info("[{}] secure link with {} '{}' ({} {}, serial {}) up in {:.1f} ms, {}", self_.id,
                 side, e.peer_node, e.peer_role, e.peer, e.peer_serial, e.handshake_ms, e.cipher);
      audit("handshake", {{"peer", e.peer},
                          {"side", side},
                          {"decision", "accepted"},
                          {"cert_node", e.peer_node},
                          {"cert_role", e.peer_role},
                          {"cert_serial", e.peer_serial},
                          {"cipher", e.cipher},
                          {"ms", e.handshake_ms}});
      return;
    case LinkEvent::Kind::kHandshakeRefused:
      log().warn("[{}] refused secure link with {} '{}': {}", self_.id, side, e.peer, e.reason);
      audit("handshake", {{"peer", e.peer},
                          {"side", side},
                          {"decision", "refused"},
                          {"reason", e.reason},
                          {"cert_node", e.peer_node},
                          {"cert_serial", e.peer_serial}});
      return;
    case LinkEvent::Kind::kFrameRejected:
      log().warn("[{}] dropped frame from {} '{}': {}", self_.id, side, e.peer, e.reason);
      audit("frame_rejected", {{"peer", e.peer}, {"side", side}, {"bytes", e.bytes},
                               {"reason", e.reason}});
      return;
  }
}

SecureChannelConfig NodeSecurity::channel_config(LinkEventSink sink) const {
  SecureChannelConfig c;
  c.tls = tls_;
  c.cipher = security::aead_by_name(options_.cipher);
  c.rekey.max_bytes = options_.rekey_after_bytes;
  c.rekey.max_frames = options_.rekey_after_frames;
  c.rekey.max_age = options_.rekey_interval;
  c.job_id = topology_.job_id();
  c.self_index = self_.index;
  c.on_event = std::move(sink);
  return c;
}

SecurityFactory NodeSecurity::children_factory() {
  LinkEventSink sink = [this](const LinkEvent& e) { on_link_event(e, true); };
  if (plaintext()) return plaintext_security_factory(topology_.job_id(), self_.index, sink);
  SecureChannelConfig c = channel_config(sink);
  c.authorize = [this](const security::NodeIdentity& cert, const std::string& claimed) {
    return authorize_child(topology_, self_, cert, claimed);
  };
  return [c](const std::string& peer) {
    return std::make_unique<SecureChannel>(c, /*is_client=*/false, peer);
  };
}

SecurityFactory NodeSecurity::parent_factory() {
  LinkEventSink sink = [this](const LinkEvent& e) { on_link_event(e, false); };
  if (plaintext()) return plaintext_security_factory(topology_.job_id(), self_.index, sink);
  SecureChannelConfig c = channel_config(sink);
  c.authorize = [this](const security::NodeIdentity& cert, const std::string&) {
    return authorize_parent(topology_, self_, cert);
  };
  return [c](const std::string& peer) {
    return std::make_unique<SecureChannel>(c, /*is_client=*/true, peer);
  };
}

}  // namespace fedwan::runtime
