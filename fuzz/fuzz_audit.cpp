// Fuzzes the audit-log verifier (`fedwan audit verify`), which reads a file
// anyone with write access to the disk may have crafted.
//
// verify_audit_text promises never to throw and to stay within bounded
// memory and stack for any input; beyond that this checks that its result
// is self-consistent (src/security/audit_log.hpp).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "security/audit_log.hpp"

namespace {

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // An exception escaping here is a finding: the verifier must not throw.
  const fedwan::security::AuditVerifyResult r = fedwan::security::verify_audit_text(text);

  if (r.ok != r.problem.empty()) fail("ok disagrees with problem being empty");
  if (r.ok != (r.first_bad_line == 0)) fail("ok disagrees with first_bad_line being 0");
  if (r.incomplete_last_line && r.ok) fail("incomplete_last_line on a log that verified");
  if (!r.ok && r.entries >= r.first_bad_line) {
    fail("more good entries than lines before the first bad one");
  }
  if (!is_hex64(r.last_hash)) fail("last_hash is not 64 lower-case hex digits");
  // Each entry ends in a newline, so there cannot be more entries than those.
  size_t newlines = 0;
  for (char c : text) newlines += c == '\n';
  if (r.entries > newlines) fail("more entries than lines");
  return 0;
}
