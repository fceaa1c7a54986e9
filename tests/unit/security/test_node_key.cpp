// Signatures that prove a record is a node's own (security/node_key.hpp).
#include "security/node_key.hpp"

#include <gtest/gtest.h>

#include <string>

#include "harness/test_pki.hpp"
#include "security/certs.hpp"

namespace fedwan::security {
namespace {

using fedwan::testing::TestPki;

ExpectedSigner signer(const std::string& node) {
  ExpectedSigner s;
  s.node_id = node;
  return s;
}

TEST(NodeKey, SignsWhatTheCaCanVerify) {
  const TestPki& pki = TestPki::get();
  const auto key = pki.key("site-a");
  EXPECT_EQ(key->identity().node_id, "site-a");
  const std::vector<uint8_t> sig = key->sign("fedwan-test-v1", "round 7 holds these bytes");
  const auto v = pki.verifier();
  EXPECT_EQ(v->verify(key->cert_der(), "fedwan-test-v1", "round 7 holds these bytes", sig,
                      signer("site-a")),
            std::nullopt);
  ExpectedSigner full = signer("site-a");
  full.role = Role::kSite;
  full.job = "unit-sign";
  EXPECT_EQ(v->verify(key->cert_der(), "fedwan-test-v1", "round 7 holds these bytes", sig, full),
            std::nullopt);
}

TEST(NodeKey, RefusesEveryChangeAndEveryOtherSigner) {
  const TestPki& pki = TestPki::get();
  const auto key = pki.key("site-a");
  const auto v = pki.verifier();
  const std::string msg = "checkpoint digest";
  const std::vector<uint8_t> sig = key->sign("fedwan-test-v1", msg);
  const auto fails = [&](const std::vector<uint8_t>& cert, std::string_view domain,
                         const std::string& m, const std::vector<uint8_t>& s,
                         const ExpectedSigner& who, const std::string& needle) {
    const auto why = v->verify(cert, domain, m, s, who);
    ASSERT_TRUE(why.has_value());
    EXPECT_NE(why->find(needle), std::string::npos) << *why;
  };
  fails(key->cert_der(), "fedwan-test-v1", msg + ".", sig, signer("site-a"), "does not match");
  fails(key->cert_der(), "fedwan-other-v1", msg, sig, signer("site-a"), "does not match");
  // Another node's certificate with this signature, and this signature
  // presented as another node's.
  fails(pki.key("site-b")->cert_der(), "fedwan-test-v1", msg, sig, signer("site-b"),
        "does not match");
  fails(key->cert_der(), "fedwan-test-v1", msg, sig, signer("site-b"), "not by 'site-b'");
  ExpectedSigner region = signer("site-a");
  region.role = Role::kRegion;
  fails(key->cert_der(), "fedwan-test-v1", msg, sig, region, "expected a region");
  // Garbage instead of a certificate or a signature.
  fails({1, 2, 3}, "fedwan-test-v1", msg, sig, signer("site-a"), "not one DER certificate");
  fails(key->cert_der(), "fedwan-test-v1", msg, {}, signer("site-a"), "the signature is 0 bytes");
  std::vector<uint8_t> flipped = sig;
  flipped[flipped.size() / 2] ^= 1;
  fails(key->cert_der(), "fedwan-test-v1", msg, flipped, signer("site-a"), "does not match");
}

TEST(NodeKey, ACertificateFromAnotherCaIsRefused) {
  const TestPki& pki = TestPki::get();
  fedwan::testing::TempDir other;
  provision_federation(pki.topology(), (other.path() / "pki").string());
  const auto foreign = NodeKey::from_bundle((other.path() / "pki" / "site-a").string());
  const std::vector<uint8_t> sig = foreign->sign("fedwan-test-v1", "m");
  const auto why =
      pki.verifier()->verify(foreign->cert_der(), "fedwan-test-v1", "m", sig, signer("site-a"));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("does not verify against the federation CA"), std::string::npos) << *why;
}

TEST(NodeKey, ARevokedSignerIsRefusedOnceTheCrlSaysSo) {
  const TestPki& pki = TestPki::get();
  fedwan::testing::TempDir copy;
  std::filesystem::copy(pki.dir(), copy.path() / "pki", std::filesystem::copy_options::recursive);
  const std::string dir = (copy.path() / "pki").string();
  const auto key = NodeKey::from_bundle(dir + "/site-b");
  const std::vector<uint8_t> sig = key->sign("fedwan-test-v1", "m");
  EXPECT_EQ(SignatureVerifier::from_bundle(dir + "/root")
                ->verify(key->cert_der(), "fedwan-test-v1", "m", sig, signer("site-b")),
            std::nullopt);
  revoke_node(dir, "site-b");
  const auto why = SignatureVerifier::from_bundle(dir + "/root")
                       ->verify(key->cert_der(), "fedwan-test-v1", "m", sig, signer("site-b"));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("revoked"), std::string::npos) << *why;
}

TEST(Base64, RoundTripsAndRefusesWhatIsNotCanonical) {
  for (size_t n : {0u, 1u, 2u, 3u, 4u, 70u, 71u, 72u}) {
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 37 + 1);
    const std::string text = base64_encode(b);
    if (n == 0) {
      EXPECT_EQ(text, "");
      continue;
    }
    const auto back = base64_decode(text, 128);
    ASSERT_TRUE(back.has_value()) << n;
    EXPECT_EQ(*back, b);
    EXPECT_FALSE(base64_decode(text, n - 1).has_value()) << "over the limit, " << n;
  }
  for (const char* bad : {"", "A", "AB=C", "AAA", "A\nAA", "QUJD!===", "QQ=A", "QR=="}) {
    EXPECT_FALSE(base64_decode(bad, 1024).has_value()) << bad;
  }
}

}  // namespace
}  // namespace fedwan::security
