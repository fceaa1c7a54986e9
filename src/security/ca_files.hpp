// The federation directory's files and the CA's OpenSSL plumbing, shared by
// the two halves of provisioning: certs.cpp (the CA, node certificates,
// bundles) and crl.cpp (signing and distributing the CRL). Private to them.
#pragma once

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <filesystem>
#include <set>
#include <string>

#include "common/openssl_check.hpp"

namespace fedwan::security::ca_detail {

using detail::OpenSslPtr;
using PkeyPtr = OpenSslPtr<EVP_PKEY, EVP_PKEY_free>;
using X509Ptr = OpenSslPtr<X509, X509_free>;
using CrlPtr = OpenSslPtr<X509_CRL, X509_CRL_free>;
using BioPtr = OpenSslPtr<BIO, BIO_free_all>;
using BnPtr = OpenSslPtr<BIGNUM, BN_free>;
using IntPtr = OpenSslPtr<ASN1_INTEGER, ASN1_INTEGER_free>;
using TimePtr = OpenSslPtr<ASN1_TIME, ASN1_TIME_free>;
using ExtPtr = OpenSslPtr<X509_EXTENSION, X509_EXTENSION_free>;

inline constexpr mode_t kSecretMode = 0600;
inline constexpr mode_t kPublicMode = 0644;
inline constexpr int64_t kDay = int64_t{24} * 3600;
// Past this a validity is a typo, and the day count would overflow an int.
inline constexpr int64_t kMaxValidity = int64_t{100} * 366 * kDay;
inline constexpr int64_t kCaMinBackdate = -300;  // tolerate clock skew between CA and nodes
inline constexpr int64_t kMinCrlValidity =
    60;  // seconds; shorter is a typo (tests go down to this)

// A file of the federation directory: a missing one means it was never
// provisioned, one over 16 MiB is not a credential (ConfigError).
std::string read_federation_file(const std::filesystem::path& path, const std::string& what);

int no_passphrase(char*, int, int, void*);
BioPtr read_bio(const std::string& text);
BioPtr write_bio();
std::string bio_text(BIO* bio);
void free_openssl_chars(char* p);
std::string int_hex(const ASN1_INTEGER* v);      // upper-case hex
std::string asn1_time_text(const ASN1_TIME* t);  // "2026-11-24T10:00:00Z"
// now + offset seconds, written into `t` (allocated when null).
ASN1_TIME* set_time(ASN1_TIME* t, std::time_t now, int64_t offset);
// Throws ConfigError for a node id that cannot name a bundle directory.
void check_node_id(const std::string& node_id);

struct Ca {
  X509Ptr cert;
  PkeyPtr key;
  std::string cert_pem;
};
// The CA of `ca_dir` (ca.pem and ca.key), checked to belong together.
Ca load_ca(const std::filesystem::path& ca_dir);
X509Ptr load_cert(const std::filesystem::path& path, const std::string& what);

// dir/ca/serial and revoked.txt: "serial node-id" lines.
std::set<std::string> record_serials(const std::string& text);
std::string read_record(const std::filesystem::path& path);
void append_record(const std::filesystem::path& path, const std::string& serial,
                   const std::string& node);

// ---- crl.cpp ------------------------------------------------------------------

// Throws ConfigError for a CRL validity out of range.
void check_crl_validity(int64_t seconds);
// A CRL v2 listing `previous`'s entries plus `add` (when not null and not
// yet listed), lastUpdate `now` back-dated by kCaMinBackdate, nextUpdate
// `now` + `validity` seconds, crlNumber one past the previous one.
CrlPtr sign_crl(const Ca& ca, X509_CRL* previous, ASN1_INTEGER* add, std::time_t now,
                int64_t validity);
std::string crl_pem(X509_CRL* crl);
// The CA's current CRL as PEM text, checked to be the CA's.
std::string load_crl_text(const std::filesystem::path& ca_dir, X509* ca, CrlPtr* parsed = nullptr);

}  // namespace fedwan::security::ca_detail
