// Fuzzes the cost ledger (`fedwan costs`), which reads costs.jsonl files
// that each node writes about itself and any node may have crafted: the
// input is one file of JSON Lines, read once on the records' word and once
// against the test CA of fuzz/keys/.
//
// CostLedger::read promises never to throw for any input: a line it cannot
// use is refused with a reason and the rest still counts. Beyond that this
// checks what the bill relies on: against a CA only signed records are
// billed, and each one was verified; every record billed came from a line
// read; every message the bill prints about a line, once escaped for the
// terminal, holds no control character.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include "costs/cost_ledger.hpp"
#include "security/node_key.hpp"

namespace {

using fedwan::costs::CostLedger;
using fedwan::costs::CostTrust;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_cost_records: %s\n", what);
  std::abort();
}

const fedwan::security::SignatureVerifier& ca() {
  static const auto v = std::make_shared<fedwan::security::SignatureVerifier>(
      std::string(FEDWAN_FUZZ_KEYS) + "/ca.pem");
  return *v;
}

// C0 controls and DEL, and C1 controls as UTF-8 (U+0080..U+009F).
void check_printable(const std::string& text) {
  const std::string s = fedwan::costs::cost_printable(text);
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) fail("a control character survives cost_printable");
    if (c == 0xc2 && i + 1 < s.size()) {
      const auto d = static_cast<unsigned char>(s[i + 1]);
      if (d >= 0x80 && d <= 0x9f) fail("a C1 control survives cost_printable");
    }
  }
}

void check_ledger(const CostLedger& ledger, bool with_ca) {
  if (ledger.records().size() + ledger.duplicates() > ledger.lines_read()) {
    fail("more records billed than lines read");
  }
  for (const auto& [key, r] : ledger.records()) {
    if (key.first != r.node || key.second != r.round) fail("a record filed under another key");
    if (with_ca && !r.is_signed()) fail("an unsigned record billed against a CA");
    check_printable(r.node);
    check_printable(r.origin);
  }
  if (with_ca && ledger.verified() < ledger.records().size()) {
    fail("a record billed against a CA without its signature checked");
  }
  for (const auto& refusal : ledger.refusals()) {
    if (refusal.reason.empty()) fail("a refusal without a reason");
    check_printable(refusal.reason);
    check_printable(refusal.node);
    check_printable(refusal.origin);
  }
  for (const auto& c : ledger.conflicts()) {
    check_printable(c.node);
    check_printable(c.difference);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const bool with_ca : {false, true}) {
    CostTrust trust;
    if (with_ca) {
      trust.ca = &ca();
    } else {
      trust.on_their_word = true;
    }
    CostLedger ledger(trust);
    std::istringstream in(text);
    try {
      ledger.read(in, "costs.jsonl");
    } catch (...) {
      fail("CostLedger::read threw");
    }
    check_ledger(ledger, with_ca);
  }
  return 0;
}
