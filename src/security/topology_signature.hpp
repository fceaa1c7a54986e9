// The admin's signature of a topology version (docs/security.md, "Topology
// versions"): ECDSA over the version's digest under the domain
// "fedwan-topology-v1" (node_key.hpp), made with the federation's admin
// bundle and checked against the federation CA and CRL. The digest covers
// the whole tree, the settings, the version and the history, so a signed
// version cannot be edited, renumbered or grafted onto another history.
// Stateless; thread safe.
#pragma once

#include <optional>
#include <string>

#include "fedwan/topology.hpp"
#include "security/node_key.hpp"

namespace fedwan::security {

// `topology` signed with `admin` (the admin bundle's key). Throws ConfigError
// when `admin` is a node's key, not the admin's, or is for another job.
Topology sign_topology(const Topology& topology, const NodeKey& admin);

// nullopt when `topology` carries a signature by the federation's admin
// certificate (issued by `verifier`'s CA, not revoked, for this job) over its
// digest; otherwise why not, in words. Never throws.
std::optional<std::string> topology_signature_problem(const Topology& topology,
                                                      const SignatureVerifier& verifier);

}  // namespace fedwan::security
