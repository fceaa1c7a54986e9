// Fuzzes the audit-log verifier (`fedwan audit verify`), which reads a file
// anyone with write access to the disk may have crafted: the hash chain,
// the signed heads (base64 certificates and signatures, checked against a
// fixed test CA, fuzz/keys/) and the expected head.
//
// verify_audit_text promises never to throw and to stay within bounded
// memory and stack for any input; beyond that this checks that its result
// is self-consistent (src/security/audit_log.hpp) and that a CA or an
// expected head only ever adds checks.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "security/audit_log.hpp"
#include "security/node_key.hpp"

namespace {

using fedwan::security::AuditVerifyOptions;
using fedwan::security::AuditVerifyResult;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_audit: %s\n", what);
  std::abort();
}

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

const fedwan::security::SignatureVerifier& ca() {
  static const auto v = std::make_shared<fedwan::security::SignatureVerifier>(
      std::string(FEDWAN_FUZZ_KEYS) + "/ca.pem");
  return *v;
}

void check_consistent(const AuditVerifyResult& r, const std::string& text) {
  if (r.ok != r.problem.empty()) fail("ok disagrees with problem being empty");
  if (r.incomplete_last_line && r.ok) fail("incomplete_last_line on a log that verified");
  if (!r.ok && r.first_bad_line > 0 && r.entries >= r.first_bad_line) {
    fail("more good entries than lines before the first bad one");
  }
  if (!is_hex64(r.last_hash)) fail("last_hash is not 64 lower-case hex digits");
  // Each entry ends in a newline, so there cannot be more entries than those.
  size_t newlines = 0;
  for (char c : text) newlines += c == '\n';
  if (r.entries > newlines) fail("more entries than lines");
  if (r.good_bytes > text.size()) fail("more good bytes than the text holds");
  if (r.verified_heads > r.signed_heads) fail("more heads verified than signed");
  if (r.signed_heads > r.entries + 1) fail("more signed heads than entries");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // An exception escaping here is a finding: the verifier must not throw.
  const AuditVerifyResult plain = fedwan::security::verify_audit_text(text);
  check_consistent(plain, text);
  if (plain.ok != (plain.first_bad_line == 0)) fail("ok disagrees with first_bad_line being 0");

  AuditVerifyOptions o;
  o.ca = &ca();
  const AuditVerifyResult signed_r = fedwan::security::verify_audit_text(text, o);
  check_consistent(signed_r, text);
  if (signed_r.ok && !plain.ok) fail("a CA check passed a log the chain refuses");
  if (signed_r.ok &&
      (signed_r.signed_heads == 0 || signed_r.verified_heads != signed_r.signed_heads)) {
    fail("a log passed the CA check with heads not verified");
  }
  if (plain.ok) {
    AuditVerifyOptions e;
    e.expect_head = plain.last_hash;
    const AuditVerifyResult expect = fedwan::security::verify_audit_text(text, e);
    if (plain.entries > 0 && !expect.ok) fail("the log's own last hash was not found in it");
  }
  return 0;
}
