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
// crash during write leaves it). What it cannot detect from the file alone:
// entries removed from the end, or a whole chain rewritten and re-hashed (the
// hash is unkeyed). So `fedwan audit verify` prints the last hash, for
// operators to record somewhere else and compare later.
//
// Thread safety: one AuditLog may be shared by threads (append is serialised).
// Durability: each entry is written with one write(2) on an O_APPEND file
// descriptor; sync() fsyncs (called at round boundaries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace fedwan::security {

// Limits of the format, enforced by the writer (append throws ConfigError) and
// the verifier (the entry is malformed), so that verifying any input takes
// bounded memory and stack: the length of one line without its newline, and
// how deeply `[` and `{` may nest in it (the entry object itself is level 1).
inline constexpr size_t kAuditMaxLineBytes = size_t{1} << 20;
inline constexpr size_t kAuditMaxNesting = 64;

// True when `[` and `{` nest deeper than kAuditMaxNesting outside strings in
// [b, e). Readers check this before parsing a line: dump() and comparison of a
// parsed value recurse once per level.
bool audit_line_too_deep(const char* b, const char* e);

class AuditLog {
 public:
  // Opens (creating) the file for appending. When it already has entries the
  // chain continues from the last one, after verifying the whole file: a
  // broken chain throws CryptoError (we never append to a tampered log). The
  // file is locked (flock) while open, so a second AuditLog on it, in this
  // process or another, throws ConfigError instead of forking the chain.
  AuditLog(const std::string& path, std::string node_id);
  // Fsyncs (best effort) and closes.
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Appends one entry; `fields` must be a JSON object. Throws ConfigError
  // when it is not, or the entry would break the limits above; TransportError
  // on an I/O failure. Invalid UTF-8 in strings is written as U+FFFD. Blocks
  // on the file write (no fsync).
  void append(const std::string& event, const nlohmann::json& fields);
  // fsync(2): the entries appended so far reach the disk. Throws TransportError.
  void sync();
  uint64_t entries() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string node_;
  mutable std::mutex mu_;
  int fd_ = -1;
  uint64_t next_seq_ = 0;
  std::string prev_hex_;
  // Set when a write failed after part of an entry reached the file: the
  // file now ends in a torn line, so nothing more may be appended to it.
  bool torn_ = false;
};

struct AuditVerifyResult {
  bool ok = true;
  uint64_t entries = 0;        // well-formed entries read before the first problem
  uint64_t first_bad_line = 0; // 1-based line number of the first bad entry (0 if ok)
  std::string problem;         // "edited", "inserted or removed", "malformed", ...
                               // with details, empty when ok
  std::string last_hash;       // hash of the last good entry; 64 zeros when none
  // The problem is a last line without its newline (a crash during write).
  bool incomplete_last_line = false;
};

// Verifies a whole audit log given as text (the fuzzer feeds this directly).
// Never throws: any input, however malformed, gives a result.
AuditVerifyResult verify_audit_text(const std::string& text);
// Reads the file and verifies it; throws ConfigError if it cannot be read.
// Streams the file, so memory stays bounded by kAuditMaxLineBytes.
AuditVerifyResult verify_audit_file(const std::string& path);

}  // namespace fedwan::security
