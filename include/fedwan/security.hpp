// How a node protects its links: mutual TLS 1.3 identities from a federation
// CA, then authenticated encryption of every frame. Encrypted is the default;
// plaintext must be asked for explicitly and is refused by secure peers.
// Pure data; no OpenSSL type appears here.
#pragma once

#include "fedwan/export.hpp"

#include <chrono>
#include <cstdint>
#include <string>

#include "fedwan/topology.hpp"

namespace fedwan {

struct FEDWAN_API SecurityOptions {
  // This node's bundle, as written by `fedwan certs`: ca.pem, cert.pem,
  // key.pem and crl.pem. Required unless insecure_plaintext is set.
  std::string credentials_dir;
  // Run links without authentication or encryption. Logged loudly; a secure
  // peer refuses this node. For loopback experiments only.
  bool insecure_plaintext = false;
  // Frame cipher: "aes-256-gcm" (default) or "chacha20-poly1305".
  std::string cipher = "aes-256-gcm";
  // A sender moves to a fresh key (one-way ratchet; the old key is wiped)
  // after this many bytes or frames under one key, or this much time,
  // whichever comes first. The byte default keeps AES-GCM far inside the
  // usage limits of RFC 8446 section 5.5.
  uint64_t rekey_after_bytes = uint64_t{1} << 36;
  uint64_t rekey_after_frames = uint64_t{1} << 32;
  std::chrono::seconds rekey_interval{3600};
  // Append-only, hash-chained JSONL audit log; empty: no log file. With
  // credentials the node signs the head of its chain when it opens and
  // closes the log and at most every audit_head_interval in between
  // (`fedwan audit verify --ca` checks the signatures).
  std::string audit_log;
  std::chrono::seconds audit_head_interval{60};
  // The CRL (crl.pem): a node raises an alarm (log, audit, summary) this
  // long before its nextUpdate, and goes on applying an expired CRL for
  // crl_grace after it (alarm raised), so a CRL nobody refreshed in time
  // does not stop the federation at once. Past the grace, handshakes fail
  // until `fedwan certs crl refresh` has been run and crl.pem copied.
  std::chrono::seconds crl_warn_before{std::chrono::hours(24 * 7)};
  std::chrono::seconds crl_grace{std::chrono::hours(24 * 7)};
  // Peers that have not authenticated yet (an aggregator's side): TLS
  // handshakes in progress at once, from one source address, and how long
  // one may take before its state is dropped.
  int max_pending_handshakes = 64;
  int max_pending_handshakes_per_source = 8;
  std::chrono::seconds handshake_timeout{10};
};

// Provisions a federation's identities into `dir`, as `fedwan certs init`
// does: a federation CA (dir/ca, keep its key offline), one bundle per node
// (dir/<node-id>: ca.pem, cert.pem, key.pem, crl.pem) and an empty CRL.
// Throws ConfigError when dir/ca exists and `overwrite` is false.
FEDWAN_API void provision_credentials(const Topology& topology, const std::string& dir,
                                      int validity_days = 365, bool overwrite = false);

// The SecurityOptions of one node of a federation provisioned into `dir`.
FEDWAN_API SecurityOptions credentials_in(const std::string& dir, const std::string& node_id);

}  // namespace fedwan
