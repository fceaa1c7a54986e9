// The X.509 certificates the federation CA signs: its own, self-signed, and
// each node's (the admin's included), with their serial numbers, names,
// extensions and validity. Private to provisioning (certs.cpp).
#pragma once

#include <openssl/evp.h>

#include <cstdint>
#include <ctime>
#include <set>
#include <string>

#include "security/ca_files.hpp"
#include "security/certs.hpp"
#include "security/identity.hpp"

namespace fedwan::security::ca_detail {

// The CA's notBefore relative to now: back-dated at least as far as the node
// certificates, so test federations of already-expired node certificates
// still have a valid CA.
int64_t ca_start(const IssueOptions& o);

// The self-signed CA certificate of `key` for `job` (subject O "fedwan <job>").
X509Ptr make_ca_certificate(const std::string& job, EVP_PKEY* key, std::time_t now,
                            const IssueOptions& o);

// `id`'s certificate of `key`, signed by `ca`, under a random serial not in
// `used` (upper-case hex, as int_hex writes them). Throws ConfigError when
// the CA has expired or the certificate would outlive it.
X509Ptr make_node_certificate(const NodeIdentity& id, EVP_PKEY* key, const Ca& ca,
                              const std::set<std::string>& used, std::time_t now,
                              const IssueOptions& o);

}  // namespace fedwan::security::ca_detail
