// Fuzzes what a node parses from its credentials bundle and `fedwan certs
// show` reads: a PEM certificate (identity_from_pem, summary_from_pem) and
// the PEM CRLs of crl.pem, read as TlsContext does (every CRL in the file
// into an X509_STORE).
//
// Garbage must come back as fedwan::Error, never as a crash or another
// exception; a certificate that parses must give the same identity to both
// readers.
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "fedwan/error.hpp"
#include "security/identity.hpp"

namespace {

using fedwan::security::NodeIdentity;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_certs: %s\n", what);
  std::abort();
}

// A fuzzed "ENCRYPTED" PEM must fail, not prompt on the terminal.
int no_passphrase(char*, int, int, void*) { return 0; }

void read_crls(const uint8_t* data, size_t size) {
  BIO* bio = BIO_new_mem_buf(data, static_cast<int>(size));
  X509_STORE* store = X509_STORE_new();
  if (bio == nullptr || store == nullptr) fail("out of memory creating a BIO or store");
  while (X509_CRL* crl = PEM_read_bio_X509_CRL(bio, nullptr, no_passphrase, nullptr)) {
    // What a node looks at in a CRL it accepted: issuer, dates, revoked serials.
    (void)X509_CRL_get_issuer(crl);
    (void)X509_CRL_get0_lastUpdate(crl);
    (void)X509_CRL_get0_nextUpdate(crl);
    if (STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(crl)) {
      for (int i = 0; i < sk_X509_REVOKED_num(revoked); ++i) {
        (void)X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(revoked, i));
      }
    }
    (void)X509_STORE_add_crl(store, crl);
    X509_CRL_free(crl);
  }
  X509_STORE_free(store);
  BIO_free(bio);
  ERR_clear_error();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > INT_MAX) return 0;
  const std::string pem(reinterpret_cast<const char*>(data), size);

  std::optional<NodeIdentity> identity;
  try {
    identity = fedwan::security::identity_from_pem(pem);
  } catch (const fedwan::Error&) {
  }
  if (identity) {
    if (identity->node_id.empty()) fail("accepted a certificate without a node id");
    if (identity->job.empty()) fail("accepted a certificate without a job");
    try {
      const fedwan::security::CertificateSummary s = fedwan::security::summary_from_pem(pem);
      if (s.identity.node_id != identity->node_id || s.identity.role != identity->role ||
          s.identity.region != identity->region || s.identity.job != identity->job) {
        fail("summary_from_pem and identity_from_pem disagree on the identity");
      }
    } catch (const fedwan::Error&) {
      // Validity dates outside what the summary can print: an expected refusal.
    }
  }

  read_crls(data, size);
  ERR_clear_error();
  return 0;
}
