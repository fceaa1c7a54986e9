// Certificate identities (security/identity.hpp): what identity_from_pem
// refuses in certificates fedwan would never issue, and mutated certificates
// that end in an identity or a CryptoError, never a crash.
#include <gtest/gtest.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "certs_test_util.hpp"
#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "harness/error_message.hpp"
#include "security/identity.hpp"

namespace fedwan::security {
namespace {

// A self-signed certificate with the given subject entries (UTF-8), for
// identities fedwan itself would never issue.
std::string self_signed(const std::vector<std::pair<int, std::string>>& subject) {
  PkeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  X509Ptr cert(X509_new());
  OpenSslPtr<X509_NAME, X509_NAME_free> name(X509_NAME_new());
  if (!key || !cert || !name) return "";
  for (const auto& [nid, value] : subject) {
    X509_NAME_add_entry_by_NID(name.get(), nid, MBSTRING_UTF8,
                               reinterpret_cast<const unsigned char*>(value.data()),
                               static_cast<int>(value.size()), -1, 0);
  }
  X509_set_version(cert.get(), X509_VERSION_3);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 7);
  X509_set_subject_name(cert.get(), name.get());
  X509_set_issuer_name(cert.get(), name.get());
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
  X509_set_pubkey(cert.get(), key.get());
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) return "";
  BioPtr bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(bio.get(), cert.get());
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string crypto_error_of(const std::string& pem) {
  return testing::crypto_error([&] { identity_from_pem(pem); });
}

TEST(IdentityFromPem, RejectsGarbage) {
  for (const std::string& input :
       {std::string(), std::string("hello"), std::string(1000, '\0'),
        std::string("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"),
        std::string("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
        std::string("-----BEGIN CERTIFICATE-----\n")}) {
    EXPECT_FALSE(crypto_error_of(input).empty()) << input;
  }
}

TEST(IdentityFromPem, RejectsCertificateWithoutOu) {
  const std::string pem =
      self_signed({{NID_organizationName, "fedwan job"}, {NID_commonName, "site-a"}});
  ASSERT_FALSE(pem.empty());
  const std::string err = crypto_error_of(pem);
  EXPECT_NE(err.find("no OU"), std::string::npos) << err;
}

TEST(IdentityFromPem, RejectsUnknownRole) {
  const std::string pem = self_signed({{NID_organizationName, "fedwan job"},
                                       {NID_organizationalUnitName, "emperor"},
                                       {NID_commonName, "site-a"}});
  const std::string err = crypto_error_of(pem);
  EXPECT_NE(err.find("unknown role OU 'emperor'"), std::string::npos) << err;
}

TEST(IdentityFromPem, RejectsOtherMalformedSubjects) {
  const std::vector<std::vector<std::pair<int, std::string>>> bad = {
      {{NID_organizationName, "fedwan job"}, {NID_organizationalUnitName, "site"}},  // no CN
      {{NID_organizationName, "acme job"},                                           // not fedwan
       {NID_organizationalUnitName, "site"},
       {NID_commonName, "a"}},
      {{NID_organizationName, "fedwan "},  // no job
       {NID_organizationalUnitName, "site"},
       {NID_commonName, "a"}},
      {{NID_organizationalUnitName, "site"}, {NID_commonName, "a"}},  // no O
      {{NID_organizationName, "fedwan job"},                          // two CNs
       {NID_organizationalUnitName, "site"},
       {NID_commonName, "a"},
       {NID_commonName, "b"}},
  };
  for (const auto& subject : bad) EXPECT_FALSE(crypto_error_of(self_signed(subject)).empty());

  const NodeIdentity ok = identity_from_pem(self_signed({{NID_localityName, "eu"},
                                                         {NID_organizationName, "fedwan my job"},
                                                         {NID_organizationalUnitName, "region"},
                                                         {NID_commonName, "eu"}}));
  EXPECT_EQ(ok.job, "my job");
  EXPECT_EQ(ok.role, Role::kRegion);
  EXPECT_EQ(ok.region, "eu");
}

TEST(IdentityFromPem, SurvivesMutatedCertificates) {
  // A cheap stand-in for the libFuzzer target: flip, drop and insert bytes of
  // a valid certificate; every outcome is an identity or a CryptoError.
  const std::string pem = self_signed({{NID_organizationName, "fedwan job"},
                                       {NID_organizationalUnitName, "site"},
                                       {NID_commonName, "a"}});
  X509Ptr cert = cert_from(pem);
  ASSERT_TRUE(cert);
  unsigned char* der = nullptr;
  const int n = i2d_X509(cert.get(), &der);
  ASSERT_GT(n, 0);
  const std::string original(reinterpret_cast<char*>(der), static_cast<size_t>(n));
  OPENSSL_free(der);

  std::mt19937 rng(1234);
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0: bytes[at] = static_cast<char>(rng()); break;
        case 1: bytes.erase(at, 1 + rng() % 8); break;
        default: bytes.insert(at, 1, static_cast<char>(rng())); break;
      }
      if (bytes.empty()) bytes = "x";
    }
    BioPtr b64(BIO_new(BIO_f_base64()));
    BioPtr mem(BIO_new(BIO_s_mem()));
    BIO* chain = BIO_push(b64.release(), mem.release());
    BioPtr owner(chain);
    BIO_write(chain, bytes.data(), static_cast<int>(bytes.size()));
    (void)BIO_flush(chain);
    char* data = nullptr;
    const long len = BIO_get_mem_data(BIO_next(chain), &data);
    const std::string mutated = "-----BEGIN CERTIFICATE-----\n" +
                                std::string(data, static_cast<size_t>(len)) +
                                "-----END CERTIFICATE-----\n";
    try {
      identity_from_pem(mutated);
      ++parsed;
    } catch (const CryptoError&) {
    }
  }
  EXPECT_LT(parsed, 3000);  // the mutations did reach the parser's error paths
}

}  // namespace
}  // namespace fedwan::security
