// Federation provisioning (security/certs.hpp) and the identities issued with
// it: what a node relies on when it loads its bundle and verifies a peer.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "certs_test_util.hpp"
#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "security/certs.hpp"
#include "security/identity.hpp"

namespace fedwan::security {
namespace {

namespace fs = std::filesystem;
using CrlPtr = OpenSslPtr<X509_CRL, X509_CRL_free>;

// One root, two regions, four sites.
const char* kTopology = R"(
job: certs-test
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000"}
  - {id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001"}
  - {id: us, role: region, parent: root, endpoint: "tcp://127.0.0.1:7002"}
  - {id: site-a, role: site, parent: eu}
  - {id: site-b, role: site, parent: eu}
  - {id: site-c, role: site, parent: us}
  - {id: site-d, role: site, parent: us}
)";

const std::vector<std::string> kNodes = {"root",   "eu",     "us",    "site-a",
                                         "site-b", "site-c", "site-d"};

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("fedwan-certs-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(counter++) + "-" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  fs::path operator/(const std::string& p) const { return path_ / p; }

 private:
  fs::path path_;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

CrlPtr crl_from(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return CrlPtr(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
}

PkeyPtr key_from(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return PkeyPtr(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
}

// X509_V_OK when `cert` chains to `ca` (and, with a CRL, is not revoked);
// otherwise the verifier's error.
int verify_error(const std::string& ca_pem, const std::string& cert_pem,
                 const std::string& crl_pem = "", int purpose = 0) {
  OpenSslPtr<X509_STORE, X509_STORE_free> store(X509_STORE_new());
  X509Ptr ca = cert_from(ca_pem);
  X509Ptr cert = cert_from(cert_pem);
  if (!store || !ca || !cert) return -1;
  if (X509_STORE_add_cert(store.get(), ca.get()) != 1) return -1;
  if (!crl_pem.empty()) {
    CrlPtr crl = crl_from(crl_pem);
    if (!crl || X509_STORE_add_crl(store.get(), crl.get()) != 1) return -1;
    X509_STORE_set_flags(store.get(), X509_V_FLAG_CRL_CHECK);
  }
  OpenSslPtr<X509_STORE_CTX, X509_STORE_CTX_free> ctx(X509_STORE_CTX_new());
  if (X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1) return -1;
  if (purpose != 0) X509_STORE_CTX_set_purpose(ctx.get(), purpose);
  const int ok = X509_verify_cert(ctx.get());
  const int err = X509_STORE_CTX_get_error(ctx.get());
  ERR_clear_error();
  return ok == 1 ? X509_V_OK : err;
}

std::string bundle_file(const TempDir& d, const std::string& node, const char* file) {
  return slurp(d / node / file);
}

int verify_node(const TempDir& d, const std::string& node, bool crl_check) {
  return verify_error(slurp(d / "ca" / "ca.pem"), bundle_file(d, node, "cert.pem"),
                      crl_check ? bundle_file(d, node, "crl.pem") : "");
}

std::string serial_of(const TempDir& d, const std::string& node) {
  X509Ptr cert = cert_from(bundle_file(d, node, "cert.pem"));
  return cert ? certificate_serial_hex(cert.get()) : "";
}

IssueOptions expired_options() {
  IssueOptions o;
  o.not_before_offset = std::chrono::hours(-48);
  o.validity = std::chrono::hours(24);
  return o;
}

class Certs : public ::testing::Test {
 protected:
  void SetUp() override { provision_federation(topo_, dir_.str()); }

  Topology topo_ = Topology::parse(kTopology);
  TempDir dir_;
};

TEST_F(Certs, ProvisionWritesEveryFileWithPrivateModes) {
  EXPECT_EQ(mode_of(dir_ / "ca"), 0700u);
  EXPECT_EQ(mode_of(dir_ / "ca" / "ca.key"), 0600u);
  for (const char* f : {"ca.pem", "crl.pem", "serial", "revoked.txt"}) {
    EXPECT_TRUE(fs::is_regular_file(dir_ / "ca" / f)) << f;
  }
  EXPECT_EQ(slurp(dir_ / "ca" / "revoked.txt"), "");
  const std::string ca_pem = slurp(dir_ / "ca" / "ca.pem");
  const std::string crl_pem = slurp(dir_ / "ca" / "crl.pem");
  for (const std::string& node : kNodes) {
    SCOPED_TRACE(node);
    EXPECT_EQ(mode_of(dir_ / node), 0700u);
    EXPECT_EQ(mode_of(dir_ / node / "key.pem"), 0600u);
    EXPECT_EQ(bundle_file(dir_, node, "ca.pem"), ca_pem);
    EXPECT_EQ(bundle_file(dir_, node, "crl.pem"), crl_pem);
    EXPECT_TRUE(fs::is_regular_file(dir_ / node / "cert.pem"));
  }
  // No temporary files left behind by the atomic writes.
  size_t entries = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "ca")) {
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
    ++entries;
  }
  EXPECT_EQ(entries, 5u);
  // Every issued serial (CA and nodes) is recorded.
  const std::string serials = slurp(dir_ / "ca" / "serial");
  for (const std::string& node : kNodes) {
    EXPECT_NE(serials.find(serial_of(dir_, node) + " " + node + "\n"), std::string::npos);
  }
}

TEST_F(Certs, EveryNodeVerifiesAndIdentityRoundTrips) {
  const std::string ca_pem = slurp(dir_ / "ca" / "ca.pem");
  for (const std::string& node : kNodes) {
    SCOPED_TRACE(node);
    const std::string pem = bundle_file(dir_, node, "cert.pem");
    EXPECT_EQ(verify_error(ca_pem, pem), X509_V_OK);
    // The empty CRL written at provisioning passes a revocation check, and
    // the certificate is good for both ends of a TLS link.
    EXPECT_EQ(
        verify_error(ca_pem, pem, bundle_file(dir_, node, "crl.pem"), X509_PURPOSE_SSL_CLIENT),
        X509_V_OK);
    EXPECT_EQ(verify_error(ca_pem, pem, "", X509_PURPOSE_SSL_SERVER), X509_V_OK);

    const NodeIdentity want = identity_for(topo_, node);
    const NodeIdentity got = identity_from_pem(pem);
    EXPECT_EQ(got.node_id, want.node_id);
    EXPECT_EQ(got.role, want.role);
    EXPECT_EQ(got.region, want.region);
    EXPECT_EQ(got.job, "certs-test");

    // The key in the bundle is the certificate's.
    X509Ptr cert = cert_from(pem);
    PkeyPtr key = key_from(bundle_file(dir_, node, "key.pem"));
    ASSERT_TRUE(cert && key);
    EXPECT_EQ(X509_check_private_key(cert.get(), key.get()), 1);
  }
}

TEST_F(Certs, CertificatesCarryTheAdvertisedProfile) {
  X509Ptr ca = cert_from(slurp(dir_ / "ca" / "ca.pem"));
  ASSERT_TRUE(ca);
  EXPECT_EQ(X509_check_ca(ca.get()), 1);
  EXPECT_TRUE(X509_get_key_usage(ca.get()) & KU_KEY_CERT_SIGN);
  EXPECT_TRUE(X509_get_key_usage(ca.get()) & KU_CRL_SIGN);
  EXPECT_NE(X509_get0_subject_key_id(ca.get()), nullptr);
  char subject[256];
  X509_NAME_oneline(X509_get_subject_name(ca.get()), subject, sizeof subject);
  EXPECT_STREQ(subject, "/O=fedwan certs-test/CN=fedwan CA certs-test");
  // CA: about ten years.
  int days = 0, secs = 0;
  ASSERT_EQ(
      ASN1_TIME_diff(&days, &secs, X509_get0_notBefore(ca.get()), X509_get0_notAfter(ca.get())), 1);
  EXPECT_EQ(days, 3650);

  X509Ptr cert = cert_from(bundle_file(dir_, "site-c", "cert.pem"));
  ASSERT_TRUE(cert);
  X509_NAME_oneline(X509_get_subject_name(cert.get()), subject, sizeof subject);
  EXPECT_STREQ(subject, "/L=us/O=fedwan certs-test/OU=site/CN=site-c");
  EXPECT_EQ(X509_get_version(cert.get()), X509_VERSION_3);
  EXPECT_EQ(X509_check_ca(cert.get()), 0);
  EXPECT_EQ(X509_get_key_usage(cert.get()), static_cast<uint32_t>(KU_DIGITAL_SIGNATURE));
  EXPECT_EQ(X509_get_extended_key_usage(cert.get()),
            static_cast<uint32_t>(XKU_SSL_SERVER | XKU_SSL_CLIENT));
  EXPECT_NE(X509_get0_authority_key_id(cert.get()), nullptr);
  EXPECT_EQ(ASN1_OCTET_STRING_cmp(X509_get0_authority_key_id(cert.get()),
                                  X509_get0_subject_key_id(ca.get())),
            0);
  EXPECT_EQ(X509_get_signature_nid(cert.get()), NID_ecdsa_with_SHA256);
  EXPECT_EQ(EVP_PKEY_get_bits(X509_get0_pubkey(cert.get())), 256);

  OpenSslPtr<GENERAL_NAMES, GENERAL_NAMES_free> sans(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)));
  ASSERT_TRUE(sans);
  ASSERT_EQ(sk_GENERAL_NAME_num(sans.get()), 1);
  const GENERAL_NAME* san = sk_GENERAL_NAME_value(sans.get(), 0);
  ASSERT_EQ(san->type, GEN_URI);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(
                            ASN1_STRING_get0_data(san->d.uniformResourceIdentifier)),
                        ASN1_STRING_length(san->d.uniformResourceIdentifier)),
            "fedwan://certs-test/site-c");

  // Serials: positive, at most 128 bits, distinct.
  std::set<std::string> serials;
  for (const std::string& node : kNodes) {
    X509Ptr c = cert_from(bundle_file(dir_, node, "cert.pem"));
    OpenSslPtr<BIGNUM, BN_free> bn(ASN1_INTEGER_to_BN(X509_get0_serialNumber(c.get()), nullptr));
    EXPECT_FALSE(BN_is_negative(bn.get()));
    EXPECT_FALSE(BN_is_zero(bn.get()));
    EXPECT_LE(BN_num_bits(bn.get()), 128);
    serials.insert(certificate_serial_hex(c.get()));
  }
  EXPECT_EQ(serials.size(), kNodes.size());

  // The CRL: v2, signed by the CA, valid for 30 days.
  CrlPtr crl = crl_from(slurp(dir_ / "ca" / "crl.pem"));
  ASSERT_TRUE(crl);
  EXPECT_EQ(X509_CRL_get_version(crl.get()), X509_CRL_VERSION_2);
  EXPECT_EQ(X509_CRL_verify(crl.get(), X509_get0_pubkey(ca.get())), 1);
  ASSERT_EQ(ASN1_TIME_diff(&days, &secs, X509_CRL_get0_lastUpdate(crl.get()),
                           X509_CRL_get0_nextUpdate(crl.get())),
            1);
  EXPECT_EQ(days, 30);
  EXPECT_LE(sk_X509_REVOKED_num(X509_CRL_get_REVOKED(crl.get())), 0);  // -1: no list at all
}

TEST_F(Certs, ExpiredCertificateFailsVerification) {
  issue_node(dir_.str(), identity_for(topo_, "site-b"), expired_options());
  EXPECT_EQ(verify_node(dir_, "site-b", false), X509_V_ERR_CERT_HAS_EXPIRED);
  EXPECT_EQ(verify_node(dir_, "site-a", false), X509_V_OK);
}

TEST(CertsProvision, ExpiredFederationStillHasAValidCa) {
  TempDir dir;
  provision_federation(Topology::parse(kTopology), dir.str(), expired_options());
  for (const std::string& node : kNodes) {
    EXPECT_EQ(verify_node(dir, node, false), X509_V_ERR_CERT_HAS_EXPIRED) << node;
  }
}

TEST_F(Certs, RevokedCertificateFailsCrlCheckOthersStillVerify) {
  const std::string serial = serial_of(dir_, "site-a");
  revoke_node(dir_.str(), "site-a");

  CrlPtr ca_crl = crl_from(slurp(dir_ / "ca" / "crl.pem"));
  ASSERT_TRUE(ca_crl);
  ASSERT_EQ(sk_X509_REVOKED_num(X509_CRL_get_REVOKED(ca_crl.get())), 1);
  EXPECT_EQ(slurp(dir_ / "ca" / "revoked.txt"), serial + " site-a\n");
  for (const std::string& node : kNodes) {
    SCOPED_TRACE(node);
    EXPECT_EQ(bundle_file(dir_, node, "crl.pem"), slurp(dir_ / "ca" / "crl.pem"));
    EXPECT_EQ(verify_node(dir_, node, true),
              node == "site-a" ? X509_V_ERR_CERT_REVOKED : X509_V_OK);
  }
  // Without a CRL check the certificate itself is still well formed.
  EXPECT_EQ(verify_node(dir_, "site-a", false), X509_V_OK);

  // Revoking again changes nothing but the CRL's dates and number.
  revoke_node(dir_.str(), "site-a");
  EXPECT_EQ(slurp(dir_ / "ca" / "revoked.txt"), serial + " site-a\n");
  CrlPtr again = crl_from(slurp(dir_ / "ca" / "crl.pem"));
  ASSERT_TRUE(again);
  EXPECT_EQ(sk_X509_REVOKED_num(X509_CRL_get_REVOKED(again.get())), 1);

  // A second revocation keeps the first.
  revoke_node(dir_.str(), "us");
  EXPECT_EQ(verify_node(dir_, "site-a", true), X509_V_ERR_CERT_REVOKED);
  EXPECT_EQ(verify_node(dir_, "us", true), X509_V_ERR_CERT_REVOKED);
  EXPECT_EQ(verify_node(dir_, "eu", true), X509_V_OK);
}

TEST_F(Certs, ReissueGivesNewSerialAndKey) {
  const std::string old_cert = bundle_file(dir_, "eu", "cert.pem");
  const std::string old_key = bundle_file(dir_, "eu", "key.pem");
  issue_node(dir_.str(), identity_for(topo_, "eu"));
  const std::string new_cert = bundle_file(dir_, "eu", "cert.pem");

  X509Ptr a = cert_from(old_cert), b = cert_from(new_cert);
  ASSERT_TRUE(a && b);
  EXPECT_NE(certificate_serial_hex(a.get()), certificate_serial_hex(b.get()));
  PkeyPtr ka = key_from(old_key), kb = key_from(bundle_file(dir_, "eu", "key.pem"));
  ASSERT_TRUE(ka && kb);
  EXPECT_NE(EVP_PKEY_eq(ka.get(), kb.get()), 1);
  EXPECT_EQ(X509_check_private_key(b.get(), kb.get()), 1);
  EXPECT_EQ(verify_node(dir_, "eu", true), X509_V_OK);
  EXPECT_EQ(identity_from_pem(new_cert).node_id, "eu");
  EXPECT_EQ(mode_of(dir_ / "eu" / "key.pem"), 0600u);
  const std::string serials = slurp(dir_ / "ca" / "serial");
  EXPECT_NE(serials.find(certificate_serial_hex(a.get()) + " eu\n"), std::string::npos);
  EXPECT_NE(serials.find(certificate_serial_hex(b.get()) + " eu\n"), std::string::npos);
}

TEST_F(Certs, RevokeThenReissueRejoinsWithTheNewCertificate) {
  const std::string old_cert = bundle_file(dir_, "site-d", "cert.pem");
  revoke_node(dir_.str(), "site-d");
  issue_node(dir_.str(), identity_for(topo_, "site-d"));
  // The fresh bundle carries the CRL that revokes its predecessor.
  const std::string ca_pem = slurp(dir_ / "ca" / "ca.pem");
  const std::string crl = bundle_file(dir_, "site-d", "crl.pem");
  EXPECT_EQ(verify_error(ca_pem, bundle_file(dir_, "site-d", "cert.pem"), crl), X509_V_OK);
  EXPECT_EQ(verify_error(ca_pem, old_cert, crl), X509_V_ERR_CERT_REVOKED);
}

TEST_F(Certs, ForeignCaDoesNotVerify) {
  TempDir other;
  provision_federation(topo_, other.str());  // same job, different CA
  const std::string ca_pem = slurp(dir_ / "ca" / "ca.pem");
  EXPECT_EQ(verify_error(ca_pem, bundle_file(other, "site-a", "cert.pem")),
            X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY);
  // ...and this CA refuses to revoke what it did not issue.
  fs::copy_file(other / "site-a" / "cert.pem", dir_ / "site-a" / "cert.pem",
                fs::copy_options::overwrite_existing);
  EXPECT_THROW(revoke_node(dir_.str(), "site-a"), CryptoError);
}

TEST_F(Certs, ProvisionRefusesExistingDirectoryWithoutOverwrite) {
  const std::string old_ca = slurp(dir_ / "ca" / "ca.pem");
  try {
    provision_federation(topo_, dir_.str());
    FAIL() << "provisioned over an existing federation";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(dir_ / "ca" / "ca.pem"), old_ca);

  const std::string old_cert = bundle_file(dir_, "root", "cert.pem");
  revoke_node(dir_.str(), "site-a");
  provision_federation(topo_, dir_.str(), {}, /*overwrite=*/true);
  const std::string new_ca = slurp(dir_ / "ca" / "ca.pem");
  EXPECT_NE(new_ca, old_ca);
  EXPECT_EQ(slurp(dir_ / "ca" / "revoked.txt"), "");
  EXPECT_NE(verify_error(new_ca, old_cert), X509_V_OK);
  for (const std::string& node : kNodes) EXPECT_EQ(verify_node(dir_, node, true), X509_V_OK);
}

TEST_F(Certs, IdentityForFollowsTheTopology) {
  NodeIdentity root = identity_for(topo_, "root");
  EXPECT_EQ(root.role, Role::kRoot);
  EXPECT_EQ(root.region, "");
  NodeIdentity us = identity_for(topo_, "us");
  EXPECT_EQ(us.role, Role::kRegion);
  EXPECT_EQ(us.region, "us");
  NodeIdentity site = identity_for(topo_, "site-b");
  EXPECT_EQ(site.role, Role::kSite);
  EXPECT_EQ(site.region, "eu");
  EXPECT_EQ(site.job, "certs-test");
  EXPECT_THROW(identity_for(topo_, "mars"), ConfigError);
  // The root's certificate has no L.
  X509Ptr cert = cert_from(bundle_file(dir_, "root", "cert.pem"));
  EXPECT_EQ(X509_NAME_get_index_by_NID(X509_get_subject_name(cert.get()), NID_localityName, -1),
            -1);
}

TEST_F(Certs, RejectsUnknownNodesAndUnsafeIds) {
  EXPECT_THROW(revoke_node(dir_.str(), "mars"), ConfigError);
  NodeIdentity id = identity_for(topo_, "site-a");
  for (const char* bad : {"..", ".", "ca", "a/b", ""}) {
    id.node_id = bad;
    EXPECT_THROW(issue_node(dir_.str(), id), ConfigError) << bad;
    if (*bad != '\0') EXPECT_THROW(revoke_node(dir_.str(), bad), ConfigError) << bad;
  }
  IssueOptions zero;
  zero.validity = std::chrono::seconds(0);
  EXPECT_THROW(issue_node(dir_.str(), identity_for(topo_, "eu"), zero), ConfigError);
  IssueOptions too_long;
  too_long.validity = std::chrono::hours(24 * 3650 * 2);  // outlives the CA
  EXPECT_THROW(issue_node(dir_.str(), identity_for(topo_, "eu"), too_long), ConfigError);
  TempDir empty;
  EXPECT_THROW(issue_node(empty.str(), identity_for(topo_, "eu")), ConfigError);
  // Refused before anything is written.
  EXPECT_THROW(provision_federation(topo_, empty.str(), too_long), ConfigError);
  EXPECT_FALSE(fs::exists(empty / "ca"));
}

TEST_F(Certs, IssuedIdentitiesNeedNotMatchTheTopology) {
  // Tests of the TLS layer rely on this to make certificates that lie.
  NodeIdentity liar = identity_for(topo_, "site-a");
  liar.role = Role::kRoot;
  liar.region = "";
  issue_node(dir_.str(), liar);
  EXPECT_EQ(verify_node(dir_, "site-a", true), X509_V_OK);
  const NodeIdentity got = identity_from_pem(bundle_file(dir_, "site-a", "cert.pem"));
  EXPECT_EQ(got.role, Role::kRoot);
  EXPECT_EQ(got.region, "");
}

TEST_F(Certs, SummaryMatchesTheCertificate) {
  const std::string pem = bundle_file(dir_, "site-b", "cert.pem");
  const CertificateSummary s = summary_from_pem(pem);
  EXPECT_EQ(s.identity.node_id, "site-b");
  EXPECT_EQ(s.serial_hex, serial_of(dir_, "site-b"));
  ASSERT_EQ(s.not_before.size(), 20u) << s.not_before;
  EXPECT_EQ(s.not_before[10], 'T');
  EXPECT_EQ(s.not_before.back(), 'Z');
  EXPECT_LT(s.not_before, s.not_after);
  EXPECT_THROW(summary_from_pem(slurp(dir_ / "ca" / "ca.pem")), CryptoError);  // no node identity
}

TEST(CertsProvision, LongestJobNameRoundTrips) {
  // "fedwan " + a 64-character job is longer than RFC 5280's bound on O.
  const std::string job(64, 'j');
  std::string yaml = kTopology;
  yaml.replace(yaml.find("certs-test"), 10, job);
  TempDir dir;
  provision_federation(Topology::parse(yaml), dir.str());
  EXPECT_EQ(verify_node(dir, "site-a", true), X509_V_OK);
  EXPECT_EQ(identity_from_pem(bundle_file(dir, "site-a", "cert.pem")).job, job);
}

}  // namespace
}  // namespace fedwan::security
