// Signing, refreshing and distributing the federation's certificate
// revocation list (security/certs.hpp), with the CA in dir/ca.
#include <openssl/bn.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <filesystem>
#include <string>

#include "common/atomic_file.hpp"
#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"
#include "security/ca_files.hpp"
#include "security/certs.hpp"

namespace fedwan::security {
namespace ca_detail {

namespace fs = std::filesystem;
using detail::handed_to_openssl;
using detail::openssl_check_ptr;

std::string crl_pem(X509_CRL* crl) {
  BioPtr bio = write_bio();
  FEDWAN_OPENSSL_CHECK(PEM_write_bio_X509_CRL(bio.get(), crl));
  return bio_text(bio.get());
}

namespace {

CrlPtr parse_crl(const std::string& text, const fs::path& path) {
  BioPtr bio = read_bio(text);
  X509_CRL* crl = PEM_read_bio_X509_CRL(bio.get(), nullptr, no_passphrase, nullptr);
  if (crl == nullptr) {
    throw CryptoError(path.string() + " is not a PEM CRL: " + detail::openssl_error_string() +
                      "; restore it from a backup (ca/revoked.txt lists what it revoked)");
  }
  return CrlPtr(crl);
}

}  // namespace

namespace {

void check_crl_signed(X509_CRL* crl, X509* ca, const fs::path& path) {
  EVP_PKEY* ca_pub = openssl_check_ptr(X509_get0_pubkey(ca), "X509_get0_pubkey");
  if (X509_CRL_verify(crl, ca_pub) != 1) {
    throw CryptoError(path.string() + " is not signed by the federation CA (" +
                      detail::openssl_error_string() +
                      "); restore it from a backup, or revoke a node again to re-sign it");
  }
}

}  // namespace

void check_crl_validity(int64_t seconds) {
  if (seconds < kMinCrlValidity || seconds > kMaxValidity) {
    throw ConfigError("CRL validity of " + std::to_string(seconds) +
                      " s is out of range; use at least a minute and at most 100 years (the "
                      "default is 30 days)");
  }
}

CrlPtr sign_crl(const Ca& ca, X509_CRL* previous, ASN1_INTEGER* add, std::time_t now,
                int64_t validity) {
  check_crl_validity(validity);
  CrlPtr crl(openssl_check_ptr(X509_CRL_new(), "X509_CRL_new"));
  FEDWAN_OPENSSL_CHECK(X509_CRL_set_version(crl.get(), X509_CRL_VERSION_2));
  FEDWAN_OPENSSL_CHECK(X509_CRL_set_issuer_name(
      crl.get(), openssl_check_ptr(X509_get_subject_name(ca.cert.get()), "X509_get_subject_name")));
  TimePtr last(set_time(nullptr, now, kCaMinBackdate));
  TimePtr revoked_at(set_time(nullptr, now, 0));
  TimePtr next(set_time(nullptr, now, validity));
  FEDWAN_OPENSSL_CHECK(X509_CRL_set1_lastUpdate(crl.get(), last.get()));
  FEDWAN_OPENSSL_CHECK(X509_CRL_set1_nextUpdate(crl.get(), next.get()));

  BnPtr number(openssl_check_ptr(BN_new(), "BN_new"));
  FEDWAN_OPENSSL_CHECK(BN_one(number.get()));
  bool listed = false;
  if (previous != nullptr) {
    STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(previous);  // null when empty
    for (int i = 0; entries != nullptr && i < sk_X509_REVOKED_num(entries); ++i) {
      const X509_REVOKED* r = sk_X509_REVOKED_value(entries, i);
      if (add != nullptr && ASN1_INTEGER_cmp(X509_REVOKED_get0_serialNumber(r), add) == 0) {
        listed = true;
      }
      OpenSslPtr<X509_REVOKED, X509_REVOKED_free> copy(
          openssl_check_ptr(X509_REVOKED_dup(r), "X509_REVOKED_dup"));
      FEDWAN_OPENSSL_CHECK(X509_CRL_add0_revoked(crl.get(), copy.get()));
      handed_to_openssl(copy);
    }
    IntPtr prev_number(static_cast<ASN1_INTEGER*>(
        X509_CRL_get_ext_d2i(previous, NID_crl_number, nullptr, nullptr)));
    if (prev_number) {
      number.reset(
          openssl_check_ptr(ASN1_INTEGER_to_BN(prev_number.get(), nullptr), "ASN1_INTEGER_to_BN"));
      FEDWAN_OPENSSL_CHECK(BN_add_word(number.get(), 1));
    }
  }
  if (add != nullptr && !listed) {
    OpenSslPtr<X509_REVOKED, X509_REVOKED_free> entry(
        openssl_check_ptr(X509_REVOKED_new(), "X509_REVOKED_new"));
    FEDWAN_OPENSSL_CHECK(X509_REVOKED_set_serialNumber(entry.get(), add));
    FEDWAN_OPENSSL_CHECK(X509_REVOKED_set_revocationDate(entry.get(), revoked_at.get()));
    FEDWAN_OPENSSL_CHECK(X509_CRL_add0_revoked(crl.get(), entry.get()));
    handed_to_openssl(entry);
  }
  IntPtr crl_number(
      openssl_check_ptr(BN_to_ASN1_INTEGER(number.get(), nullptr), "BN_to_ASN1_INTEGER"));
  FEDWAN_OPENSSL_CHECK(
      X509_CRL_add1_ext_i2d(crl.get(), NID_crl_number, crl_number.get(), 0, X509V3_ADD_DEFAULT));
  X509V3_CTX ctx{};
  X509V3_set_ctx(&ctx, ca.cert.get(), nullptr, nullptr, crl.get(), 0);
  ExtPtr akid(openssl_check_ptr(
      X509V3_EXT_nconf_nid(nullptr, &ctx, NID_authority_key_identifier, "keyid:always"),
      "X509V3_EXT_nconf_nid"));
  FEDWAN_OPENSSL_CHECK(X509_CRL_add_ext(crl.get(), akid.get(), -1));
  FEDWAN_OPENSSL_CHECK(X509_CRL_sort(crl.get()));
  FEDWAN_OPENSSL_CHECK(X509_CRL_sign(crl.get(), ca.key.get(), EVP_sha256()));
  return crl;
}

std::string load_crl_text(const fs::path& ca_dir, X509* ca, CrlPtr* parsed) {
  const fs::path path = ca_dir / "crl.pem";
  std::string text = read_federation_file(path, "the CRL");
  CrlPtr crl = parse_crl(text, path);
  check_crl_signed(crl.get(), ca, path);
  if (parsed != nullptr) *parsed = std::move(crl);
  return text;
}

}  // namespace ca_detail

using namespace ca_detail;

void revoke_node(const std::string& dir, const std::string& node_id,
                 std::chrono::seconds crl_validity) {
  check_crl_validity(crl_validity.count());
  if (node_id != kAdminName) check_node_id(node_id);  // the admin's bundle is revocable too
  const fs::path root(dir);
  const fs::path cert_path = root / node_id / "cert.pem";
  std::error_code ec;
  if (!fs::exists(cert_path, ec)) {
    throw ConfigError("node '" + node_id + "' has no bundle in " + dir + " (no " +
                      cert_path.string() +
                      "); check the node id and that the directory is the "
                      "one `fedwan certs init` wrote");
  }
  const fs::path ca_dir = root / "ca";
  const Ca ca = load_ca(ca_dir);
  X509Ptr cert = load_cert(cert_path, "the certificate of node '" + node_id + "'");
  EVP_PKEY* ca_pub = openssl_check_ptr(X509_get0_pubkey(ca.cert.get()), "X509_get0_pubkey");
  if (X509_verify(cert.get(), ca_pub) != 1) {
    throw CryptoError(cert_path.string() + " was not issued by the CA in " + ca_dir.string() +
                      " (" + detail::openssl_error_string() +
                      "); a certificate from another CA is not trusted here and needs no "
                      "revocation");
  }
  CrlPtr previous;
  load_crl_text(ca_dir, ca.cert.get(), &previous);
  ASN1_INTEGER* serial = X509_get_serialNumber(cert.get());
  CrlPtr crl = sign_crl(ca, previous.get(), serial, std::time(nullptr), crl_validity.count());
  write_file_atomic(ca_dir / "crl.pem", crl_pem(crl.get()), kPublicMode);

  const std::string hex = int_hex(serial);
  const fs::path revoked = ca_dir / "revoked.txt";
  if (record_serials(read_record(revoked)).count(hex) == 0) append_record(revoked, hex, node_id);
  distribute_crl(dir);
}

void refresh_crl(const std::string& dir, std::chrono::seconds crl_validity, std::time_t issued_at) {
  check_crl_validity(crl_validity.count());
  const fs::path ca_dir = fs::path(dir) / "ca";
  const Ca ca = load_ca(ca_dir);
  CrlPtr previous;
  load_crl_text(ca_dir, ca.cert.get(), &previous);
  CrlPtr crl = sign_crl(ca, previous.get(), nullptr,
                        issued_at != 0 ? issued_at : std::time(nullptr), crl_validity.count());
  write_file_atomic(ca_dir / "crl.pem", crl_pem(crl.get()), kPublicMode);
  distribute_crl(dir);
}

CrlSummary crl_summary(const std::string& dir) {
  const fs::path ca_dir = fs::path(dir) / "ca";
  X509Ptr ca = load_cert(ca_dir / "ca.pem", "the CA certificate");
  CrlPtr crl;
  load_crl_text(ca_dir, ca.get(), &crl);
  CrlSummary out;
  out.last_update = asn1_time_text(X509_CRL_get0_lastUpdate(crl.get()));
  out.next_update = asn1_time_text(X509_CRL_get0_nextUpdate(crl.get()));
  IntPtr number(static_cast<ASN1_INTEGER*>(
      X509_CRL_get_ext_d2i(crl.get(), NID_crl_number, nullptr, nullptr)));
  if (number) {
    BnPtr bn(openssl_check_ptr(ASN1_INTEGER_to_BN(number.get(), nullptr), "ASN1_INTEGER_to_BN"));
    OpenSslPtr<char, free_openssl_chars> dec(openssl_check_ptr(BN_bn2dec(bn.get()), "BN_bn2dec"));
    out.number = dec.get();
  }
  STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(crl.get());
  for (int i = 0; entries != nullptr && i < sk_X509_REVOKED_num(entries); ++i) {
    out.revoked_serials.push_back(
        int_hex(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(entries, i))));
  }
  return out;
}

void distribute_crl(const std::string& dir) {
  const fs::path root(dir);
  const fs::path ca_dir = root / "ca";
  X509Ptr ca = load_cert(ca_dir / "ca.pem", "the CA certificate");
  const std::string text = load_crl_text(ca_dir, ca.get());
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const fs::path bundle = it->path();
    std::error_code entry_ec;
    if (bundle.filename() == "ca" || !fs::is_directory(bundle, entry_ec)) continue;
    if (!fs::exists(bundle / "cert.pem", entry_ec)) continue;  // not a bundle
    write_file_atomic(bundle / "crl.pem", text, kPublicMode);
  }
  if (ec) throw_file_error("list the bundles in", root, ec.value());
}

}  // namespace fedwan::security
