#include "security/topology_signature.hpp"

#include <openssl/err.h>
#include <openssl/x509.h>

#include <string_view>
#include <vector>

#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"

namespace fedwan::security {
namespace {

constexpr std::string_view kDomain = "fedwan-topology-v1";
constexpr size_t kMaxCertText = 8192;

// A version is judged when it is adopted, so its signer must be valid now
// (records such as checkpoints are judged by when they were signed, and
// SignatureVerifier leaves dates alone for them).
std::optional<std::string> expired(const std::vector<uint8_t>& der) {
  const unsigned char* p = der.data();
  const detail::OpenSslPtr<X509, X509_free> cert(
      d2i_X509(nullptr, &p, static_cast<long>(der.size())));
  if (!cert) {
    ERR_clear_error();
    return std::string("the signer's certificate is not one DER certificate");
  }
  const int before = X509_cmp_current_time(X509_get0_notBefore(cert.get()));
  const int after = X509_cmp_current_time(X509_get0_notAfter(cert.get()));
  ERR_clear_error();
  if (before == 0 || after == 0) return std::string("the admin certificate's dates are unreadable");
  if (before > 0) return std::string("the admin certificate is not valid yet");
  if (after < 0) {
    return std::string("the admin certificate has expired; issue a new one (`fedwan certs admin`)");
  }
  return std::nullopt;
}

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
  auto why = verifier.verify(*cert, kDomain, d.data(), d.size(), *value, expected);
  if (!why) why = expired(*cert);
  if (why) {
    return "the signature of version " + std::to_string(topology.version()) +
           " does not hold: " + *why;
  }
  return std::nullopt;
}

}  // namespace fedwan::security
