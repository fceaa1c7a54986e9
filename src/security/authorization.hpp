// Who may be on which link, decided from the topology and the identity in
// the peer's (already verified) certificate. Pure functions; unit-tested
// without sockets. Each returns nullopt to accept, or the reason to refuse.
#pragma once

#include <optional>
#include <string>

#include "fedwan/topology.hpp"
#include "security/identity.hpp"

namespace fedwan::security {

// At aggregator `self`: may the peer whose certificate says `cert`, which
// connected under routing id `claimed`, act as one of self's children?
// Checks: same job; the certificate names the claimed node; that node is in
// the topology, under `self`, with the role and region the certificate
// states (a site cannot act as an aggregator); a site's residency policy
// lets its delta go to `self`. One exception: at the root of a topology with
// a standby, the root's own certificate is accepted, because the standby
// runs as the root and the peer is the active root streaming its
// checkpoints to it. Anywhere else a peer presenting the root is refused.
std::optional<std::string> authorize_child(const Topology& topology, const NodeSpec& self,
                                           const security::NodeIdentity& cert,
                                           const std::string& claimed);

// At aggregator `self`, before any handshake: can a peer connecting under
// routing id `claimed` ever be authorized as a child? Refused ids get no
// state at all (transport/links.hpp, LinkAdmission). "" when it may try:
// a child of `self`, or the root itself at a root with a standby.
std::string admission_refusal(const Topology& topology, const NodeSpec& self,
                              const std::string& claimed);

// At node `self` (a site or region): is the peer that answered on the
// parent endpoint really self's parent, in its topology role, and (for a
// site) an aggregator its residency policy allows? A child of the root
// accepts the root's certificate whether the root or its standby (same
// identity) answers. At the root: refused, unless the topology has a
// standby and the peer (the standby, answering on standby_endpoint)
// presents the root's own certificate.
std::optional<std::string> authorize_parent(const Topology& topology, const NodeSpec& self,
                                            const security::NodeIdentity& cert);

}  // namespace fedwan::security
