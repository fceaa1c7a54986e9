// `fedwan costs`: the per-round cost records nodes write (costs.jsonl,
// cost_recorder.hpp writes them, cost_schema.hpp has the schema) and the ledger that
// reads, verifies and deduplicates them. Pure: no file system (cmd_costs.cpp
// finds and opens the files), so every rule here is unit-tested on strings.
//
// Trust: a record is billed only to the node whose key signed it. With a
// CA (CostTrust::ca) every record must carry a signature by a certificate
// of that CA, not revoked, naming the record's node, role and job; anything
// else is refused and reported, and the rest still bills. Without one
// (CostTrust::on_their_word) records are taken as written, and the bill says
// so. cost_checks.hpp then checks records against each other.
//
// Thread safety: none needed; a CostLedger is built and read by one thread.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "costs/cost_schema.hpp"

namespace fedwan::security {
class SignatureVerifier;
}  // namespace fedwan::security

namespace fedwan::costs {

// A point in time from a record: seconds since 1970-01-01T00:00:00Z and the
// nanoseconds into that second.
struct UtcTime {
  int64_t seconds = 0;
  uint32_t nanos = 0;
  bool operator<(const UtcTime& o) const {
    return seconds != o.seconds ? seconds < o.seconds : nanos < o.nanos;
  }
  // Seconds from `o` to this (negative when this is earlier).
  double minus(const UtcTime& o) const {
    return static_cast<double>(seconds - o.seconds) +
           (static_cast<double>(nanos) - static_cast<double>(o.nanos)) * 1e-9;
  }
};

// "2026-11-25T07:00:12.600Z" (fraction optional, up to 9 digits, UTC only):
// false, with `why` set, for anything else or an impossible date.
bool parse_utc(const std::string& text, UtcTime* out, std::string* why);

// One node's costs in one round, as it wrote them.
struct CostRecord {
  int version = kCostSchemaVersion;  // schema
  std::string job;                   // "" in schema 1
  std::string node;
  std::string role;  // "site", "region" or "root"
  uint64_t round = 0;
  std::string start, end;  // as written
  UtcTime start_time, end_time;
  double train_seconds = 0;  // wall time the devices trained; 0 for aggregators
  uint64_t devices = 0;
  std::string device;  // "cpu" or "gpu"; empty only when no device time
  bool contributed = false;
  std::map<std::string, LinkBytes> links;  // by peer
  uint64_t device_us = 0;                  // round(train_seconds * 1e6) * devices
  std::string origin;                      // "file:line"
  // What the signature covers (costs/cost_recorder.hpp), and the signature;
  // empty when the record is unsigned.
  std::string signed_text;
  std::vector<uint8_t> signature, cert_der;

  bool is_signed() const { return !signature.empty(); }
  // Which recorded field differs from `o` ("" when none does).
  std::string first_difference(const CostRecord& o) const;
  uint64_t bytes_sent() const;
};

constexpr size_t kCostMaxLineBytes = 1 << 20;

// One JSON Lines line, schema 1 (unsigned, from earlier releases) or 2.
// Throws ConfigError "<origin>: <what is wrong>". Unknown fields are ignored.
CostRecord parse_cost_record(const std::string& line, const std::string& origin);

// Records are untrusted and messages go to a terminal: common/terminal_text.
std::string cost_printable(const std::string& s);

// How the ledger judges records.
struct CostTrust {
  // The federation CA (and CRL): every record must be signed by its node.
  const security::SignatureVerifier* ca = nullptr;
  // Without a CA: records taken as written, signed or not. One of the two.
  bool on_their_word = false;
  // The job billed; "" = the records' own (all of one job).
  std::string job;
};

// A line or record that is not billed, and why.
struct CostRefusal {
  std::string origin;  // "file:line"
  std::string node;    // "" when the line could not be read
  std::optional<uint64_t> round;
  std::string reason;
};

// One node signed two different records of one round.
struct CostConflict {
  std::string node;
  uint64_t round = 0;
  std::string billed_origin, other_origin, difference;
};

// The distinct records of a run, keyed by (node, round). Thread safety: none.
class CostLedger {
 public:
  // Throws ConfigError when `trust` has neither a CA nor on_their_word.
  explicit CostLedger(CostTrust trust);

  // A record that fails the trust rules is refused (refusals()). One seen
  // before, field for field, is counted once (a node restarted and wrote
  // its round again, or a file was given twice). One that differs from it
  // is a conflict: the record that claims more device time (then more
  // bytes sent) is billed, so a node cannot lower its bill by writing a
  // second record, and both are reported.
  void add(CostRecord r);
  // Reads JSON Lines from `in`, naming lines "<name>:<line>". Blank lines
  // carry nothing; a line that cannot be read is refused and the rest of
  // the file still counts.
  void read(std::istream& in, const std::string& name);

  const std::map<std::pair<std::string, uint64_t>, CostRecord>& records() const { return records_; }
  const std::vector<CostRefusal>& refusals() const { return refusals_; }
  const std::vector<CostConflict>& conflicts() const { return conflicts_; }
  const std::set<std::string>& jobs() const { return jobs_; }
  const CostTrust& trust() const { return trust_; }
  uint64_t lines_read() const { return lines_read_; }  // records read, duplicates included
  uint64_t duplicates() const { return duplicates_; }
  uint64_t verified() const { return verified_; }  // signatures checked (duplicates included)
  void refuse(CostRefusal r) { refusals_.push_back(std::move(r)); }

 private:
  std::optional<std::string> untrusted(const CostRecord& r) const;

  CostTrust trust_;
  std::map<std::pair<std::string, uint64_t>, CostRecord> records_;
  std::map<std::string, std::pair<std::string, std::string>> roles_;  // node -> role, origin
  std::vector<CostRefusal> refusals_;
  std::vector<CostConflict> conflicts_;
  std::set<std::string> jobs_;
  uint64_t lines_read_ = 0;
  uint64_t duplicates_ = 0;
  uint64_t verified_ = 0;
};

}  // namespace fedwan::costs
