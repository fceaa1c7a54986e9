// Federation provisioning: a federation CA, one key and X.509 certificate per
// node, per-node bundle directories and a certificate revocation list.
// Used by `fedwan certs`, `fedwan demo` and the tests. Keys are ECDSA P-256.
//
// On-disk layout under `dir`:
//   dir/ca/ca.key (0600)  dir/ca/ca.pem  dir/ca/crl.pem
//   dir/ca/serial         (one "serial node-id" line per issued certificate,
//                          upper-case hex; the CA's own line says "ca")
//   dir/ca/revoked.txt    (one "serial node-id" line per revoked certificate)
//   dir/<node-id>/{ca.pem, cert.pem, key.pem (0600), crl.pem}   one per node
//   dir/admin/{...}       the same for the admin identity (signs topology versions)
// ca/ and every bundle directory are 0700. Every write is atomic (temp file
// + rename). Not thread safe per directory.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include "fedwan/topology.hpp"
#include "security/identity.hpp"

namespace fedwan::security {

struct IssueOptions {
  // Validity window relative to now; a negative not_before_offset with a
  // short validity lets tests make already-expired certificates.
  std::chrono::seconds not_before_offset{-300};
  std::chrono::seconds validity{std::chrono::hours(24 * 365)};
  // provision_federation only: the CA certificate's lifetime. Node
  // certificates are never issued past it.
  std::chrono::seconds ca_validity{std::chrono::hours(24 * 3650)};
  // How long each CRL the CA signs is valid (its nextUpdate). Nodes warn
  // before it runs out and tolerate it for a grace period after
  // (SecurityOptions); `fedwan certs crl refresh` signs a fresh one.
  std::chrono::seconds crl_validity{kDefaultCrlValidity};
  static constexpr std::chrono::seconds kDefaultCrlValidity{std::chrono::hours(24 * 30)};
};

// Creates dir/ca (new CA key + self-signed CA certificate named after the
// job, empty CRL) and one bundle per node of the topology. Throws ConfigError
// when dir/ca (or a node's bundle) already exists and `overwrite` is false;
// with `overwrite` the old CA, its records and CRL are replaced. Node ids
// must be usable as directory names: "ca", "." and ".." are refused.
void provision_federation(const Topology& topology, const std::string& dir,
                          const IssueOptions& options = {}, bool overwrite = false);

// Issues (or re-issues, for rotation) one node's key and certificate with the
// CA in dir/ca and writes dir/<identity.node_id>/. The identity need not
// match the topology: tests use this to make certificates that lie.
void issue_node(const std::string& dir, const NodeIdentity& identity,
                const IssueOptions& options = {});

// The federation's admin identity (security/identity.hpp): signs topology
// versions. provision_federation issues it into dir/admin/ (a bundle like a
// node's); issue_admin issues it again, or for the first time into a
// federation provisioned before it existed. Same errors as issue_node.
NodeIdentity admin_identity(const std::string& job);
void issue_admin(const std::string& dir, const IssueOptions& options = {});

// Convenience: the identity a topology gives a node (role, region = parent
// id for sites, job).
NodeIdentity identity_for(const Topology& topology, const std::string& node_id);

// Revokes the node's current certificate: appends it to the CRL (re-signed
// by the CA) and copies the new crl.pem into every bundle under dir.
// Throws ConfigError if the node has no bundle, CryptoError if its
// certificate was not issued by this CA. Revoking an already revoked
// certificate only re-signs and re-distributes the CRL.
void revoke_node(const std::string& dir, const std::string& node_id,
                 std::chrono::seconds crl_validity = IssueOptions::kDefaultCrlValidity);

// Signs the CRL again with the same revocations, valid from now for
// `crl_validity`, and copies it into every bundle under dir (like
// revoke_node, without revoking anything). Run it before the CRL's
// nextUpdate; `fedwan certs crl show` prints when that is. `issued_at`
// (UTC seconds; 0: now) back-dates it, for tests of an expired CRL.
void refresh_crl(const std::string& dir,
                 std::chrono::seconds crl_validity = IssueOptions::kDefaultCrlValidity,
                 std::time_t issued_at = 0);

// What the CA's current CRL says (for `fedwan certs crl show`).
struct CrlSummary {
  std::string last_update;  // UTC, ISO 8601
  std::string next_update;
  std::string number;                        // crlNumber, decimal
  std::vector<std::string> revoked_serials;  // upper-case hex
};
CrlSummary crl_summary(const std::string& dir);

// Re-copies dir/ca/crl.pem into every bundle (after a manual CRL update).
void distribute_crl(const std::string& dir);

}  // namespace fedwan::security
