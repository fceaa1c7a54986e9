#include "security/identity.hpp"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <climits>
#include <ctime>
#include <optional>

#include "common/openssl_check.hpp"
#include "common/utc_time.hpp"
#include "fedwan/error.hpp"

namespace fedwan::security {
namespace {

using detail::openssl_check_ptr;
using detail::OpenSslPtr;

constexpr char kJobPrefix[] = "fedwan ";

// OPENSSL_free is a macro; OpenSslPtr needs a function.
void free_openssl_chars(char* p) { OPENSSL_free(p); }
void free_openssl_bytes(unsigned char* p) { OPENSSL_free(p); }

// Refuses to prompt on the terminal for a passphrase: certificates are never
// encrypted, and a fuzzed "encrypted" PEM must fail, not block.
int no_passphrase(char*, int, int, void*) { return 0; }

// The single value of `nid` in the subject as UTF-8, or nullopt when absent.
// A repeated attribute is refused: which of two CNs names the node would be
// the verifier's guess.
std::optional<std::string> subject_field(X509_NAME* name, int nid, const char* label) {
  const int first = X509_NAME_get_index_by_NID(name, nid, -1);
  if (first < 0) return std::nullopt;  // -1: absent (not an OpenSSL error)
  if (X509_NAME_get_index_by_NID(name, nid, first) >= 0) {
    throw CryptoError(std::string("certificate subject has more than one ") + label +
                      "; a fedwan node certificate carries exactly one");
  }
  X509_NAME_ENTRY* entry =
      openssl_check_ptr(X509_NAME_get_entry(name, first), "X509_NAME_get_entry");
  ASN1_STRING* data =
      openssl_check_ptr(X509_NAME_ENTRY_get_data(entry), "X509_NAME_ENTRY_get_data");
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, data);
  if (n < 0) {
    throw CryptoError(std::string("certificate subject ") + label +
                      " is not valid text: " + detail::openssl_error_string());
  }
  OpenSslPtr<unsigned char, free_openssl_bytes> owner(utf8);
  std::string value(reinterpret_cast<const char*>(utf8), static_cast<size_t>(n));
  if (value.find('\0') != std::string::npos) {
    throw CryptoError(std::string("certificate subject ") + label + " contains a NUL byte");
  }
  return value;
}

std::string iso8601(const ASN1_TIME* t, const char* label) {
  std::tm tm{};
  FEDWAN_OPENSSL_CHECK(ASN1_TIME_to_tm(t, &tm));
  std::string text = utc_text(tm);
  if (text.empty()) throw CryptoError(std::string("certificate ") + label + " is out of range");
  return text;
}

OpenSslPtr<X509, X509_free> parse_pem(const std::string& pem) {
  if (pem.size() > static_cast<size_t>(INT_MAX)) {
    throw CryptoError("PEM input of " + std::to_string(pem.size()) +
                      " bytes is too large to be a certificate");
  }
  OpenSslPtr<BIO, BIO_free_all> bio(openssl_check_ptr(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), "BIO_new_mem_buf"));
  X509* cert = PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr);
  if (cert == nullptr) {
    throw CryptoError("not a PEM certificate (expected a '-----BEGIN CERTIFICATE-----' block): " +
                      detail::openssl_error_string());
  }
  return OpenSslPtr<X509, X509_free>(cert);
}

}  // namespace

const char* role_ou(Role role) {
  switch (role) {
    case Role::kRoot: return "root";
    case Role::kRegion: return "region";
    case Role::kSite: return "site";
  }
  return "unknown";
}

bool role_from_ou(const std::string& ou, Role* out) {
  for (Role r : {Role::kRoot, Role::kRegion, Role::kSite}) {
    if (ou == role_ou(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

namespace {

NodeIdentity parse_identity(X509* cert, bool allow_admin) {
  if (cert == nullptr) throw CryptoError("identity_from_certificate: no certificate");
  X509_NAME* subject = openssl_check_ptr(X509_get_subject_name(cert), "X509_get_subject_name");
  NodeIdentity id;

  std::optional<std::string> cn = subject_field(subject, NID_commonName, "CN");
  if (!cn || cn->empty()) {
    throw CryptoError("certificate subject has no CN (the node id); it is not a fedwan node "
                      "certificate");
  }
  id.node_id = *cn;

  std::optional<std::string> ou = subject_field(subject, NID_organizationalUnitName, "OU");
  if (!ou) {
    throw CryptoError("certificate of '" + id.node_id +
                      "' has no OU (the node's role: root, region or site); it is not a fedwan "
                      "node certificate (a CA certificate has none)");
  }
  if (*ou == kAdminOu) {
    if (!allow_admin) {
      throw CryptoError("certificate of '" + id.node_id +
                        "' is the federation's admin certificate; it signs topology versions "
                        "and cannot run or reach a node");
    }
    id.admin = true;
  } else if (!role_from_ou(*ou, &id.role)) {
    throw CryptoError("certificate of '" + id.node_id + "' has unknown role OU '" + *ou +
                      "'; expected root, region or site");
  }

  std::optional<std::string> o = subject_field(subject, NID_organizationName, "O");
  const size_t prefix = sizeof(kJobPrefix) - 1;
  if (!o || o->size() <= prefix || o->compare(0, prefix, kJobPrefix) != 0) {
    throw CryptoError("certificate of '" + id.node_id + "' has O '" + o.value_or("") +
                      "'; a fedwan node certificate has O 'fedwan <job>'");
  }
  id.job = o->substr(prefix);

  std::optional<std::string> l = subject_field(subject, NID_localityName, "L");
  if (l) {
    if (l->empty()) {
      throw CryptoError("certificate of '" + id.node_id +
                        "' has an empty L (region); omit L or name the region");
    }
    id.region = *l;
  }
  return id;
}

}  // namespace

NodeIdentity identity_from_certificate(X509* cert) { return parse_identity(cert, false); }

NodeIdentity signer_identity_from_certificate(X509* cert) { return parse_identity(cert, true); }

NodeIdentity identity_from_pem(const std::string& pem) {
  OpenSslPtr<X509, X509_free> cert = parse_pem(pem);
  return identity_from_certificate(cert.get());
}

std::string certificate_serial_hex(X509* cert) {
  const ASN1_INTEGER* serial =
      openssl_check_ptr(X509_get0_serialNumber(cert), "X509_get0_serialNumber");
  OpenSslPtr<BIGNUM, BN_free> bn(
      openssl_check_ptr(ASN1_INTEGER_to_BN(serial, nullptr), "ASN1_INTEGER_to_BN"));
  OpenSslPtr<char, free_openssl_chars> hex(openssl_check_ptr(BN_bn2hex(bn.get()), "BN_bn2hex"));
  return hex.get();
}

CertificateSummary summarize_certificate(X509* cert) {
  CertificateSummary s;
  s.identity = signer_identity_from_certificate(cert);
  s.serial_hex = certificate_serial_hex(cert);
  s.not_before =
      iso8601(openssl_check_ptr(X509_get0_notBefore(cert), "X509_get0_notBefore"), "notBefore");
  s.not_after =
      iso8601(openssl_check_ptr(X509_get0_notAfter(cert), "X509_get0_notAfter"), "notAfter");
  return s;
}

CertificateSummary summary_from_pem(const std::string& pem) {
  OpenSslPtr<X509, X509_free> cert = parse_pem(pem);
  return summarize_certificate(cert.get());
}

}  // namespace fedwan::security
