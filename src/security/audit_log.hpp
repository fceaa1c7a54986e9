// Tamper-evident audit trail: append-only JSONL, one object per line, each
// hash-chained to the previous one.
//
// Line format (keys in this order, compact JSON, no spaces):
//   {"seq":N,"time":"2026-11-22T10:00:00.123Z","node":"eu","event":"update",
//    "fields":{...event-specific...},"prev":"<64 hex>","hash":"<64 hex>"}
// seq starts at 0; prev of entry 0 is 64 zeros; hash = SHA-256 over the line
// exactly as written up to and including `"prev":"<hex>"` (i.e. the bytes
// before `,"hash"`), hex. `fedwan audit verify` recomputes the chain.
//
// What the chain detects: an edited entry (its hash no longer matches), an
// entry inserted, removed or moved anywhere but at the very end (seq and prev
// stop following on), entries removed from the beginning (the first entry is
// not seq 0 with a zero prev) and a torn last entry (no trailing newline, as a
// crash during write leaves it).
//
// Signed heads anchor the chain. With the node's key (AuditOptions::key) the
// writer adds a signed entry when it opens the log (audit_opened for a new
// log, audit_resumed with the head it continues from), every head_interval
// while entries keep coming (audit_head) and when it closes (audit_closed).
// A signed entry's fields hold "signer" (the node id), "cert_sha256" and
// "sig", a signature (node_key.hpp, domain kAuditHeadDomain) over
// "<node>\n<seq>\n<prev>" of that very entry: it vouches for every entry
// before it. The first signed entry a process writes also holds "cert", its
// certificate (base64 DER). Removing the tail of a log, or rewriting and
// re-hashing it, cannot forge those signatures: `fedwan audit verify --ca`
// checks them, and `--expect-head HASH` checks that a hash recorded earlier
// is still in the chain. A log that does not end in audit_closed was cut
// short, or its node is running or crashed.
//
// Failures are alarms, not exceptions. A write that fails (disk full, I/O
// error) cuts the file back to its last whole entry; the entry waits in
// memory (up to AuditOptions::max_waiting_entries / max_waiting_bytes) and
// every later append, sync() and retry() tries again, writing the waiting
// entries in order. Entries that do not fit are counted by event; once the
// file takes writes again an audit_outage entry records the outage (from,
// to, failed writes, entries lost per event, the error). health() tells the
// node, which raises its alarm and keeps serving.
//
// A torn last entry (no trailing newline: a crash mid-write) is recovered
// when the log is opened: the torn bytes move to "<path>.torn-<seq>" and an
// audit_recovered entry records their size and SHA-256. Any other damage
// still makes the log refuse to open (it is evidence; start a new one).
//
// Thread safety: one AuditLog may be shared by threads (calls are
// serialised). Durability: each entry is written with one write(2) on an
// O_APPEND file descriptor; sync() fsyncs (called at round boundaries).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace fedwan::security {

class NodeKey;
class SignatureVerifier;

// Limits of the format, enforced by the writer (append throws ConfigError) and
// the verifier (the entry is malformed), so that verifying any input takes
// bounded memory and stack: the length of one line without its newline, and
// how deeply `[` and `{` may nest in it (the entry object itself is level 1).
inline constexpr size_t kAuditMaxLineBytes = size_t{1} << 20;
inline constexpr size_t kAuditMaxNesting = 64;
inline constexpr const char* kAuditHeadDomain = "fedwan-audit-head-v1";

// True when `[` and `{` nest deeper than kAuditMaxNesting outside strings in
// [b, e). Readers check this before parsing a line: dump() and comparison of a
// parsed value recurse once per level.
bool audit_line_too_deep(const char* b, const char* e);

// What a signed head signs: "<node>\n<seq>\n<prev>".
std::string audit_head_message(const std::string& node, uint64_t seq, const std::string& prev);

struct AuditOptions {
  std::shared_ptr<const NodeKey> key;      // null: no signed heads
  std::chrono::seconds head_interval{60};  // audit_head at most this often
  size_t max_waiting_entries = 10000;      // held in memory while writes fail
  size_t max_waiting_bytes = size_t{16} << 20;
  // While writes fail, how often an append tries the disk again (each try
  // costs a failed write(2)); retry() and sync() always try.
  std::chrono::milliseconds retry_every{1000};
};

struct AuditHealth {
  bool writable = true;        // the last write or fsync succeeded
  uint64_t failed_writes = 0;  // writes and fsyncs that failed, in all
  uint64_t waiting = 0;        // entries in memory, not on disk yet
  uint64_t lost = 0;           // entries that did not fit in memory, in all
  std::string last_error;
};

class AuditLog {
 public:
  // Opens (creating) the file for appending. When it already has entries the
  // chain continues from the last one, after verifying the whole file: a
  // broken chain throws CryptoError (we never append to a tampered log),
  // except a torn last entry, which is recovered (see above). The file is
  // locked (flock) while open, so a second AuditLog on it, in this process
  // or another, throws ConfigError instead of forking the chain. A file that
  // cannot be opened throws TransportError.
  AuditLog(const std::string& path, std::string node_id, AuditOptions options = {});
  // close(), then fsyncs (best effort).
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Appends one entry; `fields` must be a JSON object. Throws ConfigError
  // when it is not, the entry would break the limits above, or the log was
  // closed; never for an I/O failure (see health()). Invalid UTF-8 in strings
  // is written as U+FFFD. Blocks on the file write (no fsync).
  void append(const std::string& event, const nlohmann::json& fields);
  // Writes what waits, then fsync(2). False when something is still not
  // durable (health() says why). The fsync runs without the log's lock and,
  // in a KeepAlive scope, beside the beats: entries appended meanwhile are
  // written but not covered by this call.
  bool sync();
  // Tries to write the entries waiting in memory now.
  void retry();
  // Writes the signed audit_closed head (with a key) and stops appending.
  void close();

  // Entries in the file (the next seq).
  uint64_t entries() const;
  struct Head {
    uint64_t seq = 0;
    std::string hash;
  };
  // The last entry in the file; nullopt while it is empty.
  std::optional<Head> head() const;
  // Whether the file holds entry `seq` with hash `hash` (reads the file).
  bool contains(uint64_t seq, const std::string& hash) const;
  AuditHealth health() const;
  const std::string& path() const { return path_; }

 private:
  struct Pending {
    std::string event;
    nlohmann::json fields;
    std::string time;
    bool sign = false;
    size_t cost = 0;  // what it counts against max_waiting_bytes
  };
  // Both with mu_ held.
  void enqueue(Pending p);
  void flush_waiting();
  // Writes one entry; false (file cut back to its last whole entry) on failure.
  bool write_entry(Pending& p, std::string* error);
  void recover_torn_tail(uint64_t good_bytes, uint64_t entries);
  Pending signed_marker(const std::string& event, nlohmann::json fields);

  std::string path_;
  std::string node_;
  AuditOptions options_;
  mutable std::mutex mu_;
  int fd_ = -1;
  uint64_t next_seq_ = 0;
  std::string prev_hex_;
  uint64_t size_ = 0;  // bytes of whole entries in the file
  bool closed_ = false;
  bool cert_written_ = false;  // this process wrote "cert" in a signed entry
  std::chrono::steady_clock::time_point last_signed_;
  uint64_t signed_through_ = 0;  // next_seq_ at the last signed entry
  std::deque<Pending> waiting_;
  size_t waiting_bytes_ = 0;
  std::map<std::string, uint64_t> lost_by_event_;
  std::string outage_since_;
  std::chrono::steady_clock::time_point next_retry_;
  AuditHealth health_;
};

struct AuditVerifyOptions {
  // Check every signed head against this CA (and require at least one).
  const SignatureVerifier* ca = nullptr;
  // A hash recorded earlier that the chain must still contain (lower-case hex).
  std::string expect_head;
};

struct AuditVerifyResult {
  bool ok = true;
  uint64_t entries = 0;         // well-formed entries read before the first problem
  uint64_t first_bad_line = 0;  // 1-based line number of the first bad entry (0 if ok)
  std::string problem;          // "edited", "inserted or removed", "malformed", ...
                                // with details, empty when ok
  std::string last_hash;        // hash of the last good entry; 64 zeros when none
  // The problem is a last line without its newline (a crash during write).
  bool incomplete_last_line = false;
  uint64_t good_bytes = 0;  // bytes of the entries that verified
  // Signed heads: how many, how many were checked against a CA, the last one.
  uint64_t signed_heads = 0;
  uint64_t verified_heads = 0;
  std::optional<uint64_t> last_signed_seq;
  std::string signer;           // node id of the last signed head
  bool closed = false;          // the last entry is a signed or unsigned audit_closed
  bool found_expected = false;  // AuditVerifyOptions::expect_head is in the chain
};

// Verifies a whole audit log given as text (the fuzzer feeds this directly).
// Never throws: any input, however malformed, gives a result.
AuditVerifyResult verify_audit_text(const std::string& text,
                                    const AuditVerifyOptions& options = {});
// Reads the file and verifies it; throws ConfigError if it cannot be read.
// Streams the file, so memory stays bounded by kAuditMaxLineBytes.
AuditVerifyResult verify_audit_file(const std::string& path,
                                    const AuditVerifyOptions& options = {});

}  // namespace fedwan::security
