#include "security/topology_signature.hpp"

#include <string_view>
#include <vector>

#include "fedwan/error.hpp"

namespace fedwan::security {
namespace {

constexpr std::string_view kDomain = "fedwan-topology-v1";
constexpr size_t kMaxCertText = 8192;

}  // namespace

Topology sign_topology(const Topology& topology, const NodeKey& admin) {
  const NodeIdentity& who = admin.identity();
  if (!who.admin) {
    throw ConfigError("the key given to sign the topology belongs to node '" + who.node_id +
                      "'; topology versions are signed with the federation's admin bundle "
                      "(<pki>/admin, made by `fedwan certs init` or `fedwan certs admin`)");
  }
  if (who.job != topology.job()) {
    throw ConfigError("the admin bundle is for job '" + who.job + "', the topology for '" +
                      topology.job() + "'");
  }
  const auto& d = topology.digest();
  TopologySignature s;
  s.cert = base64_encode(admin.cert_der());
  s.value = base64_encode(admin.sign(kDomain, d.data(), d.size()));
  return topology.with_signature(std::move(s));
}

std::optional<std::string> topology_signature_problem(const Topology& topology,
                                                      const SignatureVerifier& verifier) {
  const std::optional<TopologySignature>& s = topology.signature();
  if (!s) {
    return "version " + std::to_string(topology.version()) +
           " is not signed; sign it with the admin bundle (`fedwan topology sign`)";
  }
  const auto cert = base64_decode(s->cert, kMaxCertText);
  const auto value = base64_decode(s->value, kMaxSignatureBytes);
  if (!cert || !value) return std::string("the signature's cert or value is not base64");
  ExpectedSigner expected;
  expected.node_id = kAdminName;
  expected.admin = true;
  expected.job = topology.job();
  const auto& d = topology.digest();
  if (auto why = verifier.verify(*cert, kDomain, d.data(), d.size(), *value, expected)) {
    return "the signature of version " + std::to_string(topology.version()) +
           " does not hold: " + *why;
  }
  return std::nullopt;
}

}  // namespace fedwan::security
