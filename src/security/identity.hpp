// Who a certificate says a node is. The subject carries
//   CN = node id, OU = role (root | region | site), O = "fedwan " + job,
//   L  = region (the parent's id for a site, the node's own id for a region,
//        absent for the root).
#pragma once

#include <cstdint>
#include <string>

#include "fedwan/topology.hpp"

typedef struct x509_st X509;

namespace fedwan::security {

struct NodeIdentity {
  std::string node_id;
  Role role = Role::kSite;
  std::string region;  // see above; empty for the root
  std::string job;
  // The federation's admin certificate (OU "admin", CN "admin"): it signs
  // topology versions and never runs a node, so identity_from_certificate
  // refuses it and only signer_identity_from_certificate returns it.
  bool admin = false;
};

// Reads the identity from a certificate's subject. Throws CryptoError naming
// the missing or malformed field (unknown role, no CN, ...).
NodeIdentity identity_from_certificate(X509* cert);

// As identity_from_certificate, and also the admin certificate (admin set,
// role meaningless): who signed a record.
NodeIdentity signer_identity_from_certificate(X509* cert);

// The admin certificate's OU and CN.
inline constexpr const char* kAdminOu = "admin";
inline constexpr const char* kAdminName = "admin";

// Parses one PEM certificate and returns its identity (for `fedwan certs
// show` and the fuzzer). Throws CryptoError on anything malformed.
NodeIdentity identity_from_pem(const std::string& pem);

// What `fedwan certs show` prints: the identity plus serial and validity.
struct CertificateSummary {
  NodeIdentity identity;
  std::string serial_hex;  // upper-case hex, no separators (as `openssl x509 -serial`)
  std::string not_before;  // UTC, ISO 8601: "2025-01-31T12:00:00Z"
  std::string not_after;
};

// Same errors as identity_from_certificate / identity_from_pem.
CertificateSummary summarize_certificate(X509* cert);
CertificateSummary summary_from_pem(const std::string& pem);

// The certificate's serial number, upper-case hex without separators.
std::string certificate_serial_hex(X509* cert);

// Role <-> OU text.
const char* role_ou(Role role);
bool role_from_ou(const std::string& ou, Role* out);

}  // namespace fedwan::security
