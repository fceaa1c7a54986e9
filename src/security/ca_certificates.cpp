// The certificates the federation CA signs (ca_certificates.hpp), and
// int_hex (ca_files.hpp): a fresh serial is told apart from the recorded ones
// in the hex that int_hex writes, so both use one conversion.
#include "security/ca_certificates.hpp"

#include <openssl/bn.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>

#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"

namespace fedwan::security::ca_detail {

using detail::handed_to_openssl;
using detail::openssl_check_ptr;

namespace {

std::string bn_hex(const BIGNUM* bn) {
  OpenSslPtr<char, free_openssl_chars> hex(openssl_check_ptr(BN_bn2hex(bn), "BN_bn2hex"));
  return hex.get();
}

// A random positive 128-bit serial not among `used` (upper-case hex).
IntPtr random_serial(const std::set<std::string>& used) {
  for (;;) {
    unsigned char bytes[16];
    FEDWAN_OPENSSL_CHECK(RAND_bytes(bytes, sizeof bytes));
    BnPtr bn(openssl_check_ptr(BN_bin2bn(bytes, sizeof bytes, nullptr), "BN_bin2bn"));
    if (BN_is_zero(bn.get()) || used.count(bn_hex(bn.get())) != 0) continue;
    return IntPtr(openssl_check_ptr(BN_to_ASN1_INTEGER(bn.get(), nullptr), "BN_to_ASN1_INTEGER"));
  }
}

void add_name_entry(X509_NAME* name, int nid, const std::string& value) {
  // A UTF8String set as is, not through MBSTRING_UTF8: that path enforces the
  // RFC 5280 upper bound of 64 characters on O and CN, which "fedwan " plus a
  // 64-character job exceeds. Verifiers do not enforce the bound.
  FEDWAN_OPENSSL_CHECK(X509_NAME_add_entry_by_NID(
      name, nid, V_ASN1_UTF8STRING, reinterpret_cast<const unsigned char*>(value.data()),
      static_cast<int>(value.size()), -1, 0));
}

void add_ext(X509* cert, X509V3_CTX* ctx, int nid, const char* value) {
  ExtPtr ext(
      openssl_check_ptr(X509V3_EXT_nconf_nid(nullptr, ctx, nid, value), "X509V3_EXT_nconf_nid"));
  FEDWAN_OPENSSL_CHECK(X509_add_ext(cert, ext.get(), -1));
}

// subjectAltName URI built from its parts rather than a config string, so no
// character of the identity can be read as config syntax.
void add_uri_san(X509* cert, const std::string& uri) {
  OpenSslPtr<GENERAL_NAMES, GENERAL_NAMES_free> names(
      openssl_check_ptr(GENERAL_NAMES_new(), "GENERAL_NAMES_new"));
  OpenSslPtr<GENERAL_NAME, GENERAL_NAME_free> name(
      openssl_check_ptr(GENERAL_NAME_new(), "GENERAL_NAME_new"));
  OpenSslPtr<ASN1_IA5STRING, ASN1_IA5STRING_free> text(
      openssl_check_ptr(ASN1_IA5STRING_new(), "ASN1_IA5STRING_new"));
  FEDWAN_OPENSSL_CHECK(ASN1_STRING_set(text.get(), uri.data(), static_cast<int>(uri.size())));
  GENERAL_NAME_set0_value(name.get(), GEN_URI, text.release());
  FEDWAN_OPENSSL_CHECK(sk_GENERAL_NAME_push(names.get(), name.get()));
  handed_to_openssl(name);
  FEDWAN_OPENSSL_CHECK(
      X509_add1_ext_i2d(cert, NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT));
}

void set_validity(X509* cert, std::time_t now, int64_t not_before_offset, int64_t validity) {
  set_time(X509_getm_notBefore(cert), now, not_before_offset);
  set_time(X509_getm_notAfter(cert), now, not_before_offset + validity);
}

X509Ptr new_certificate(const std::set<std::string>& used, EVP_PKEY* key) {
  X509Ptr cert(openssl_check_ptr(X509_new(), "X509_new"));
  FEDWAN_OPENSSL_CHECK(X509_set_version(cert.get(), X509_VERSION_3));
  IntPtr serial = random_serial(used);
  FEDWAN_OPENSSL_CHECK(X509_set_serialNumber(cert.get(), serial.get()));
  FEDWAN_OPENSSL_CHECK(X509_set_pubkey(cert.get(), key));
  return cert;
}

}  // namespace

std::string int_hex(const ASN1_INTEGER* v) {
  BnPtr bn(openssl_check_ptr(ASN1_INTEGER_to_BN(v, nullptr), "ASN1_INTEGER_to_BN"));
  return bn_hex(bn.get());
}

int64_t ca_start(const IssueOptions& o) {
  return std::min<int64_t>(o.not_before_offset.count(), kCaMinBackdate);
}

X509Ptr make_ca_certificate(const std::string& job, EVP_PKEY* key, std::time_t now,
                            const IssueOptions& o) {
  X509Ptr cert = new_certificate({}, key);
  OpenSslPtr<X509_NAME, X509_NAME_free> name(openssl_check_ptr(X509_NAME_new(), "X509_NAME_new"));
  add_name_entry(name.get(), NID_organizationName, "fedwan " + job);
  add_name_entry(name.get(), NID_commonName, "fedwan CA " + job);
  FEDWAN_OPENSSL_CHECK(X509_set_subject_name(cert.get(), name.get()));
  FEDWAN_OPENSSL_CHECK(X509_set_issuer_name(cert.get(), name.get()));
  set_validity(cert.get(), now, ca_start(o), o.ca_validity.count());

  X509V3_CTX ctx{};
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  // pathlen:0: the CA signs node certificates only, never another CA.
  add_ext(cert.get(), &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_ext(cert.get(), &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
  add_ext(cert.get(), &ctx, NID_subject_key_identifier, "hash");
  FEDWAN_OPENSSL_CHECK(X509_sign(cert.get(), key, EVP_sha256()));
  return cert;
}

X509Ptr make_node_certificate(const NodeIdentity& id, EVP_PKEY* key, const Ca& ca,
                              const std::set<std::string>& used, std::time_t now,
                              const IssueOptions& o) {
  X509Ptr cert = new_certificate(used, key);
  OpenSslPtr<X509_NAME, X509_NAME_free> name(openssl_check_ptr(X509_NAME_new(), "X509_NAME_new"));
  if (!id.region.empty()) add_name_entry(name.get(), NID_localityName, id.region);
  add_name_entry(name.get(), NID_organizationName, "fedwan " + id.job);
  add_name_entry(name.get(), NID_organizationalUnitName, id.admin ? kAdminOu : role_ou(id.role));
  add_name_entry(name.get(), NID_commonName, id.node_id);
  FEDWAN_OPENSSL_CHECK(X509_set_subject_name(cert.get(), name.get()));
  FEDWAN_OPENSSL_CHECK(
      X509_set_issuer_name(cert.get(), openssl_check_ptr(X509_get_subject_name(ca.cert.get()),
                                                         "X509_get_subject_name")));
  set_validity(cert.get(), now, o.not_before_offset.count(), o.validity.count());

  const ASN1_TIME* ca_end = X509_get0_notAfter(ca.cert.get());
  const int ca_valid = X509_cmp_time(ca_end, &now);
  if (ca_valid == 0) detail::throw_openssl_error("X509_cmp_time(CA notAfter)");
  if (ca_valid < 0) {
    throw ConfigError("the federation CA has expired; provision a new federation with `fedwan "
                      "certs init --force` and redistribute every bundle");
  }
  if (ASN1_TIME_compare(X509_get0_notAfter(cert.get()), ca_end) > 0) {
    throw ConfigError("the certificate of '" + id.node_id +
                      "' would outlive the federation CA; ask for a shorter validity (--days)");
  }

  X509V3_CTX ctx{};
  X509V3_set_ctx(&ctx, ca.cert.get(), cert.get(), nullptr, nullptr, 0);
  add_ext(cert.get(), &ctx, NID_basic_constraints, "critical,CA:FALSE");
  add_ext(cert.get(), &ctx, NID_key_usage, "critical,digitalSignature");
  // Every node is a TLS client (to its parent) and/or a server (to its
  // children); the admin only signs (no TLS purpose: it cannot be a peer).
  add_ext(cert.get(), &ctx, NID_ext_key_usage, id.admin ? "codeSigning" : "serverAuth,clientAuth");
  add_ext(cert.get(), &ctx, NID_subject_key_identifier, "hash");
  add_ext(cert.get(), &ctx, NID_authority_key_identifier, "keyid:always");
  add_uri_san(cert.get(), "fedwan://" + id.job + "/" + id.node_id);
  FEDWAN_OPENSSL_CHECK(X509_sign(cert.get(), ca.key.get(), EVP_sha256()));
  return cert;
}

}  // namespace fedwan::security::ca_detail
