#include "node/node_security.hpp"

#include <algorithm>
#include <ctime>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "common/utc_time.hpp"
#include "fedwan/error.hpp"
#include "security/aead.hpp"
#include "security/audit_log.hpp"
#include "security/authorization.hpp"
#include "security/node_key.hpp"
#include "security/tls_session.hpp"
#include "transport/secure_channel.hpp"

namespace fedwan::node {
namespace {

using security::noise_key;

// Handshake times kept for the summary: one per accepted child session, so
// a child reconnecting in a loop cannot grow it without bound.
constexpr size_t kMaxHandshakeTimes = 4096;
constexpr std::chrono::seconds kCrlCheckEvery{10};

security::NoiseFilter::Options alarm_repeats() {
  security::NoiseFilter::Options o;
  o.window = std::chrono::hours(1);
  o.burst = 1;
  o.max_keys = 64;
  return o;
}

// Set by a program before its nodes start (see set_parent_channel_wrapper);
// read when a node opens a parent link.
ParentChannelWrapper& parent_channel_wrapper() {
  static ParentChannelWrapper w;
  return w;
}

}  // namespace

void set_parent_channel_wrapper(ParentChannelWrapper wrapper) {
  parent_channel_wrapper() = std::move(wrapper);
}

NodeSecurity::NodeSecurity(const SecurityOptions& options, const Topology& topology,
                           const NodeSpec& self)
    : options_(options), topology_(topology), self_(self), alarm_noise_(alarm_repeats()) {
  // Unknown names, and a FEDWAN_AEAD_LIBRARY this build cannot serve, fail
  // here, at start, not at the first handshake.
  const security::AeadAlgorithm cipher = security::aead_by_name(options_.cipher);
  if (!options_.insecure_plaintext) {
    (void)security::AeadCipher(cipher, security::AeadKey{});
    log().info("frames sealed with {}", security::aead_description(cipher));
  }
  if (options_.insecure_plaintext && !options_.credentials_dir.empty()) {
    throw ConfigError("node '" + self_.id +
                      "': both credentials and insecure_plaintext given; "
                      "choose one (credentials are the safe choice)");
  }
  if (!options_.insecure_plaintext) {
    if (options_.credentials_dir.empty()) {
      throw ConfigError("node '" + self_.id +
                        "' has no credentials: links are encrypted by "
                        "default, so give it its bundle (made by `fedwan certs init --topology "
                        "FILE --out DIR`, then DIR/" +
                        self_.id +
                        "), or run a loopback "
                        "experiment with insecure plaintext (--insecure-plaintext)");
    }
    tls_ =
        std::make_shared<security::TlsContext>(options_.credentials_dir, true, options_.crl_grace);
    const security::NodeIdentity& me = tls_->self();
    if (me.node_id != self_.id || me.role != self_.role || me.job != topology_.job()) {
      throw ConfigError("credentials in '" + options_.credentials_dir + "' are for " +
                        role_name(me.role) + " '" + me.node_id + "' of job '" + me.job +
                        "', not for " + role_name(self_.role) + " '" + self_.id + "' of job '" +
                        topology_.job() + "'; use this node's own bundle");
    }
    key_ = security::NodeKey::from_bundle(options_.credentials_dir);
    verifier_ = security::SignatureVerifier::from_bundle(options_.credentials_dir);
  }
  if (!options_.audit_log.empty()) {
    security::AuditOptions ao;
    ao.key = key_;
    ao.head_interval = options_.audit_head_interval;
    audit_ = std::make_unique<security::AuditLog>(options_.audit_log, self_.id, ao);
  }
  if (plaintext()) {
    audit("security_mode", {{"mode", "plaintext"}});
    return;
  }
  audit("security_mode",
        {{"mode", "mtls"}, {"cipher", options_.cipher}, {"credentials", options_.credentials_dir}});
  check_crl();
}

NodeSecurity::~NodeSecurity() {
  try {
    flush_noise(/*all=*/true);
  } catch (...) {
    // Closing anyway.
  }
}

// ---- audit and noise ------------------------------------------------------------

void NodeSecurity::audit(const std::string& event, const nlohmann::json& fields) {
  if (!audit_) return;
  audit_->append(event, fields);
  check_audit_health();
}

bool NodeSecurity::audit_noise(const std::string& event, const std::string& key,
                               const nlohmann::json& fields, const std::string& log_line,
                               uint64_t bytes, bool warn) {
  flush_noise(false);
  if (!noise_.admit(key, Clock::now(), bytes)) return false;
  if (warn) {
    log().warn("[{}] {}", self_.id, log_line);
  } else {
    log().info("[{}] {}", self_.id, log_line);
  }
  audit(event, fields);
  return true;
}

bool NodeSecurity::log_noise(const std::string& key, const std::string& log_line) {
  flush_noise(false);
  if (!noise_.admit(key, Clock::now())) return false;
  log().warn("[{}] {}", self_.id, log_line);
  return true;
}

void NodeSecurity::flush_noise(bool all) {
  for (const security::NoiseFilter::Summary& s : noise_.drain(Clock::now(), all)) {
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(s.window).count();
    log().warn("[{}] {} more like this in the last {} s were not logged: {}", self_.id,
               s.suppressed, secs, s.key);
    audit("suppressed",
          {{"kind", s.key}, {"count", s.suppressed}, {"bytes", s.bytes}, {"window_s", secs}});
  }
}

void NodeSecurity::audit_sync() {
  if (!audit_) return;
  (void)audit_->sync();
  check_audit_health();
}

std::optional<NodeSecurity::AuditHead> NodeSecurity::audit_head() const {
  if (!audit_) return std::nullopt;
  const auto h = audit_->head();
  if (!h) return std::nullopt;
  return AuditHead{h->seq, h->hash};
}

void NodeSecurity::check_audit_head(uint64_t seq, const std::string& hash) {
  if (!audit_ || audit_->contains(seq, hash)) return;
  const std::string why = "the audit log " + audit_->path() + " no longer holds entry " +
                          std::to_string(seq) + " with hash " + hash.substr(0, 16) +
                          "..., which this node's checkpoint recorded: entries were removed from "
                          "its end, or it was replaced";
  audit("audit_truncated",
        {{"expected_seq", seq}, {"expected_hash", hash}, {"entries", audit_->entries()}});
  alarm("audit_truncated", why);
}

void NodeSecurity::check_audit_health() {
  if (!audit_ || in_alarm_) return;
  const security::AuditHealth h = audit_->health();
  if (!h.writable && !audit_alarm_) {
    audit_alarm_ = true;
    alarm("audit_write_failed",
          h.last_error + "; entries wait in memory and are written, with an audit_outage "
                         "entry, once the log takes writes again; the node keeps serving");
  } else if (h.writable && audit_alarm_) {
    audit_alarm_ = false;
    log().warn("[{}] the audit log {} takes writes again; the outage is recorded in it "
               "(audit_outage)",
               self_.id, audit_->path());
  }
  if (h.lost > audit_lost_seen_) {
    audit_lost_seen_ = h.lost;
    alarm("audit_entries_lost", std::to_string(h.lost) +
                                    " audit entries did not fit in memory while the log could "
                                    "not be written; its audit_outage entry counts them by event");
  }
}

// ---- alarms ---------------------------------------------------------------------

void NodeSecurity::alarm(const std::string& kind, const std::string& message) {
  Alarm& a = alarms_[kind];
  a.message = message;
  a.count += 1;
  if (in_alarm_ || !alarm_noise_.admit(kind, Clock::now())) return;
  in_alarm_ = true;
  log().error("[{}] ALARM {}: {}", self_.id, kind, message);
  try {
    audit("alarm", {{"kind", kind}, {"message", message}});
  } catch (...) {
    in_alarm_ = false;
    throw;
  }
  in_alarm_ = false;
}

std::vector<std::string> NodeSecurity::alarms() const {
  std::vector<std::string> out;
  for (const auto& [kind, a] : alarms_) {
    out.push_back(kind + ": " + a.message +
                  (a.count > 1 ? " (raised " + std::to_string(a.count) + " times)" : ""));
  }
  return out;
}

void NodeSecurity::tick(bool now_all) {
  const auto now = Clock::now();
  if (tls_ && (now_all || now >= next_crl_check_)) check_crl();
  if (audit_) {
    audit_->retry();
    check_audit_health();
  }
  flush_noise(now_all);
  const uint64_t failures = log_write_failures();
  if (failures > log_failures_seen_) {
    log_failures_seen_ = failures;
    alarm("log_write_failed", std::to_string(failures) +
                                  " log lines could not be written to stderr (disk full, or "
                                  "the file or pipe closed); the node keeps serving");
  }
}

void NodeSecurity::check_crl() {
  next_crl_check_ = Clock::now() + kCrlCheckEvery;
  const bool reloaded = tls_->reload_crl_if_changed();
  const std::string dir = options_.credentials_dir;
  if (!tls_->crl_problem().empty()) {
    alarm("crl_unusable", "crl.pem in " + dir + " cannot be used: " + tls_->crl_problem());
  } else if (reloaded) {
    // A new CRL is in force: checkpoint signatures are judged by it too.
    try {
      verifier_ = security::SignatureVerifier::from_bundle(dir);
    } catch (const Error& e) {
      alarm("crl_unusable", std::string("the new CRL cannot check signatures: ") + e.what());
    }
  }
  const std::time_t now = std::time(nullptr);
  const std::time_t next = tls_->crl_next_update();
  const std::string refresh =
      "refresh it where the CA key is (`fedwan certs crl refresh --out DIR`) and copy "
      "DIR/ca/crl.pem into every node's bundle";
  if (now > next) {
    alarm("crl_expired", "the CRL expired at " + utc_text(next) + "; it is still applied until " +
                             utc_text(next + options_.crl_grace.count()) +
                             " (its grace period), after which handshakes fail: " + refresh);
  } else if (next - now <= options_.crl_warn_before.count()) {
    alarm("crl_expiring", "the CRL expires at " + utc_text(next) + " (in " +
                              std::to_string((next - now) / 3600) + " h): " + refresh);
  }
}

// ---- links ------------------------------------------------------------------------

void NodeSecurity::on_link_event(const transport::LinkEvent& e, bool as_parent) {
  const char* side = as_parent ? "child" : "parent";
  switch (e.kind) {
    case transport::LinkEvent::Kind::kHandshakeAccepted: {
      if (as_parent && handshake_ms_.size() < kMaxHandshakeTimes) {
        handshake_ms_.push_back(e.handshake_ms);
      }
      const std::string line = std::string("secure link with ") + side + " '" + e.peer_node +
                               "' (" + e.peer_role + " " + e.peer + ", serial " + e.peer_serial +
                               ") up in " + std::to_string(e.handshake_ms) + " ms, " + e.cipher;
      if (!noise_.admit("handshake_accepted:" + e.peer, Clock::now())) return;
      log().info("[{}] {}", self_.id, line);
      audit("handshake", {{"peer", e.peer},
                          {"side", side},
                          {"decision", "accepted"},
                          {"cert_node", e.peer_node},
                          {"cert_role", e.peer_role},
                          {"cert_serial", e.peer_serial},
                          {"cipher", e.cipher},
                          {"ms", e.handshake_ms}});
      return;
    }
    case transport::LinkEvent::Kind::kHandshakeRefused:
      audit_noise("handshake", noise_key("handshake_refused", e.reason),
                  {{"peer", e.peer},
                   {"side", side},
                   {"decision", "refused"},
                   {"reason", e.reason},
                   {"cert_node", e.peer_node},
                   {"cert_serial", e.peer_serial}},
                  std::string("refused secure link with ") + side + " '" + e.peer +
                      "': " + e.reason);
      return;
    case transport::LinkEvent::Kind::kCrlUnusable:
      alarm("crl_unusable",
            "crl.pem in " + options_.credentials_dir + " cannot be used: " + e.reason);
      return;
    case transport::LinkEvent::Kind::kFrameRejected:
      audit_noise("frame_rejected", noise_key("frame_rejected", e.reason),
                  {{"peer", e.peer}, {"side", side}, {"bytes", e.bytes}, {"reason", e.reason}},
                  std::string("dropped frame from ") + side + " '" + e.peer + "': " + e.reason,
                  e.bytes);
      return;
    case transport::LinkEvent::Kind::kFrameOfOtherSession:
      // What a restart or a new key agreement leaves on the way: told apart
      // from tampering by its key epoch, before any cryptography.
      audit_noise("frame_of_other_session", noise_key("frame_of_other_session", e.reason),
                  {{"peer", e.peer}, {"side", side}, {"bytes", e.bytes}, {"reason", e.reason}},
                  std::string("dropped a frame of another session from ") + side + " '" + e.peer +
                      "': " + e.reason,
                  e.bytes, /*warn=*/false);
      return;
    case transport::LinkEvent::Kind::kPeerWithoutSession:
      // Unauthenticated: its only effect is a shorter wait on the parent's
      // silence (session::ParentSession::silent); the reconnect that may
      // follow is audited with its reason.
      audit_noise("parent_without_session", noise_key("parent_without_session", e.peer),
                  {{"peer", e.peer}, {"reason", e.reason}},
                  std::string("parent at ") + e.peer + " says it holds no session with this node " +
                      "(it restarted?); its silence is judged sooner",
                  e.bytes, /*warn=*/false);
      return;
  }
}

transport::LinkAdmission NodeSecurity::children_admission() {
  transport::LinkAdmission a;
  a.job_id = topology_.job_id();
  a.self_index = self_.index;
  a.handshakes.max_pending = static_cast<size_t>(std::max(1, options_.max_pending_handshakes));
  a.handshakes.max_per_source =
      static_cast<size_t>(std::max(1, options_.max_pending_handshakes_per_source));
  a.handshakes.timeout = options_.handshake_timeout;
  a.refusal = [this](const std::string& peer) {
    return security::admission_refusal(topology_, self_, peer);
  };
  // An admitted peer is a child in the topology, or the root reaching its
  // standby over one connection.
  a.streams = [this](const std::string& child) -> size_t {
    const NodeSpec* n = topology_.find(child);
    if (n == nullptr || n->role == Role::kRoot) return 1;
    return topology_.uplink_streams(*n).connections;
  };
  a.adaptive_streams = [this](const std::string& child) {
    const NodeSpec* n = topology_.find(child);
    return n != nullptr && topology_.uplink_streams(*n).adaptive;
  };
  a.reorder_wait = std::chrono::milliseconds(
      static_cast<int64_t>(std::max(1000.0, topology_.federation().heartbeat_timeout_s * 500)));
  a.on_drop = [this](const std::string& peer, const std::string& source, const std::string& why,
                     size_t bytes) {
    audit_noise("handshake", noise_key("handshake_refused", why),
                {{"peer", peer},
                 {"side", "child"},
                 {"decision", "refused"},
                 {"reason", why},
                 {"source", source}},
                "refused '" + peer + "'" + (source.empty() ? "" : " from " + source) + ": " + why,
                bytes);
  };
  return a;
}

transport::SecureChannelConfig NodeSecurity::channel_config(transport::LinkEventSink sink) const {
  transport::SecureChannelConfig c;
  c.tls = tls_;
  c.cipher = security::aead_by_name(options_.cipher);
  c.rekey.max_bytes = options_.rekey_after_bytes;
  c.rekey.max_frames = options_.rekey_after_frames;
  c.rekey.max_age = options_.rekey_interval;
  c.job_id = topology_.job_id();
  c.self_index = self_.index;
  c.on_event = std::move(sink);
  // A restart's leftovers come within the new handshake and the reorder
  // wait that follows it: both well inside two heartbeat timeouts.
  c.other_session_grace = std::chrono::milliseconds(
      static_cast<int64_t>(std::max(5000.0, 2000 * topology_.federation().heartbeat_timeout_s)));
  return c;
}

transport::SecurityFactory NodeSecurity::children_factory() {
  transport::LinkEventSink sink = [this](const transport::LinkEvent& e) { on_link_event(e, true); };
  if (plaintext())
    return transport::plaintext_security_factory(topology_.job_id(), self_.index, sink);
  transport::SecureChannelConfig c = channel_config(sink);
  c.authorize = [this](const security::NodeIdentity& cert, const std::string& claimed) {
    return security::authorize_child(topology_, self_, cert, claimed);
  };
  return [c](const std::string& peer) {
    return std::make_unique<transport::SecureChannel>(c, /*is_client=*/false, peer);
  };
}

transport::SecurityFactory NodeSecurity::parent_factory() {
  transport::LinkEventSink sink = [this](const transport::LinkEvent& e) {
    on_link_event(e, false);
  };
  transport::SecurityFactory make;
  if (plaintext()) {
    make = transport::plaintext_security_factory(topology_.job_id(), self_.index, sink);
  } else {
    transport::SecureChannelConfig c = channel_config(sink);
    c.authorize = [this](const security::NodeIdentity& cert, const std::string&) {
      return security::authorize_parent(topology_, self_, cert);
    };
    make = [c](const std::string& peer) {
      return std::make_unique<transport::SecureChannel>(c, /*is_client=*/true, peer);
    };
  }
  const ParentChannelWrapper& wrap = parent_channel_wrapper();
  if (!wrap) return make;
  return [make, wrap](const std::string& peer) { return wrap(make(peer)); };
}

}  // namespace fedwan::node
