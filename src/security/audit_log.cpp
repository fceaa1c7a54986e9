#include "security/audit_log.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::security {
namespace {

using nlohmann::json;

const std::string kZeroHash(64, '0');
// `,"hash":"` + 64 hex + `"}`: the fixed-length tail every line ends with.
constexpr size_t kHashTailBytes = 9 + 64 + 2;

std::string errno_text(int err) { return std::system_category().message(err); }

// Owns a file descriptor (closed on destruction) until release().
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Strings are dumped with invalid UTF-8 replaced (U+FFFD) rather than
// throwing: an audit entry about a misbehaving peer must still be written.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The hashed part of a line: everything before `,"hash"`. Writer and verifier
// both build it here, so the verifier can insist a line is exactly what the
// writer would have produced for its values.
std::string entry_prefix(uint64_t seq, const std::string& time, const std::string& node,
                         const std::string& event, const json& fields, const std::string& prev) {
  std::string s = "{\"seq\":";
  s += dump(json(seq));
  s += ",\"time\":";
  s += dump(json(time));
  s += ",\"node\":";
  s += dump(json(node));
  s += ",\"event\":";
  s += dump(json(event));
  s += ",\"fields\":";
  s += dump(fields);
  s += ",\"prev\":";
  s += dump(json(prev));
  return s;
}

std::string hash_hex(const char* data, size_t n) {
  const Sha256Digest d = sha256(data, n);
  return to_hex(d.data(), d.size());
}

}  // namespace

bool audit_line_too_deep(const char* b, const char* e) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char* p = b; p != e; ++p) {
    const char c = *p;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kAuditMaxNesting) return true;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return false;
}

namespace {

bool is_lower_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// "YYYY-MM-DDTHH:MM:SS.mmmZ", the only shape the writer produces.
bool is_rfc3339_millis_utc(const std::string& s) {
  static constexpr char kShape[] = "dddd-dd-ddTdd:dd:dd.dddZ";
  if (s.size() != sizeof(kShape) - 1) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (kShape[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9') : s[i] != kShape[i]) return false;
  }
  return true;
}

std::string utc_now_millis() {
  const auto now = std::chrono::system_clock::now();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms % 1000));
  return buf;
}

std::string abbrev(const std::string& hex) { return hex.substr(0, 16) + "..."; }

// Checks a log line by line, in order, and remembers the first problem.
class ChainChecker {
 public:
  ChainChecker() { r_.last_hash = kZeroHash; }

  // [b, e) is one line without its newline; `terminated` says whether a
  // newline followed it. Returns false once a problem has been found (this
  // line's or an earlier one's); the caller stops feeding lines then.
  bool line(const char* b, const char* e, bool terminated) {
    if (!r_.ok) return false;
    ++line_no_;
    try {
      return check(b, e, terminated);
    } catch (const std::exception& ex) {
      // Only allocation or OpenSSL failures get here; report, never throw.
      return fail(std::string("could not check this entry: ") + ex.what());
    } catch (...) {
      return fail("could not check this entry: unknown error");
    }
  }

  const AuditVerifyResult& result() const { return r_; }

 private:
  bool fail(std::string problem) {
    r_.ok = false;
    r_.first_bad_line = line_no_;
    r_.problem = std::move(problem);
    return false;
  }

  bool check(const char* b, const char* e, bool terminated) {
    const size_t n = static_cast<size_t>(e - b);
    if (n > kAuditMaxLineBytes) {
      return fail("malformed entry: line is longer than " + std::to_string(kAuditMaxLineBytes) +
                  " bytes");
    }
    if (!terminated) {
      r_.incomplete_last_line = true;
      return fail("last entry is incomplete (no trailing newline), likely a crash during write");
    }
    if (n == 0) return fail("malformed entry: empty line");
    if (audit_line_too_deep(b, e)) {
      return fail("malformed entry: nested more than " + std::to_string(kAuditMaxNesting) +
                  " levels deep");
    }
    const json j = json::parse(b, e, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return fail("malformed entry: not valid JSON");
    if (!j.is_object()) return fail("malformed entry: not a JSON object");

    static const char* const kKeys[] = {"seq", "time", "node", "event", "fields", "prev", "hash"};
    for (const char* key : kKeys) {
      if (!j.contains(key)) return fail(std::string("malformed entry: no \"") + key + "\" key");
    }
    if (j.size() != std::size(kKeys)) {
      for (const auto& item : j.items()) {
        bool known = false;
        for (const char* key : kKeys) known = known || item.key() == key;
        if (!known) return fail("malformed entry: unexpected key " + dump(json(item.key())));
      }
    }
    const json& seq = j["seq"];
    const json& time = j["time"];
    const json& node = j["node"];
    const json& event = j["event"];
    const json& fields = j["fields"];
    const json& prev = j["prev"];
    const json& hash = j["hash"];
    if (!seq.is_number_unsigned()) {
      return fail("malformed entry: \"seq\" must be an unsigned 64-bit integer");
    }
    if (!time.is_string() || !is_rfc3339_millis_utc(time.get_ref<const std::string&>())) {
      return fail(
          "malformed entry: \"time\" must be a UTC RFC 3339 time with milliseconds, "
          "like 2026-11-22T10:00:00.123Z");
    }
    if (!node.is_string()) return fail("malformed entry: \"node\" must be a string");
    if (!event.is_string()) return fail("malformed entry: \"event\" must be a string");
    if (!fields.is_object()) return fail("malformed entry: \"fields\" must be an object");
    if (!prev.is_string() || !is_lower_hex64(prev.get_ref<const std::string&>())) {
      return fail("malformed entry: \"prev\" must be 64 lower-case hex digits");
    }
    if (!hash.is_string() || !is_lower_hex64(hash.get_ref<const std::string&>())) {
      return fail("malformed entry: \"hash\" must be 64 lower-case hex digits");
    }
    const std::string& hash_s = hash.get_ref<const std::string&>();
    const std::string tail = ",\"hash\":\"" + hash_s + "\"}";
    if (n < tail.size() || std::string(e - tail.size(), e) != tail) {
      return fail("malformed entry: the line does not end with its \"hash\" member");
    }
    const char* prefix_end = e - kHashTailBytes;
    if (hash_hex(b, static_cast<size_t>(prefix_end - b)) != hash_s) {
      return fail("entry was edited (hash mismatch)");
    }
    const uint64_t seq_v = seq.get<uint64_t>();
    const std::string& prev_s = prev.get_ref<const std::string&>();
    const std::string canonical =
        entry_prefix(seq_v, time.get_ref<const std::string&>(), node.get_ref<const std::string&>(),
                     event.get_ref<const std::string&>(), fields, prev_s);
    if (canonical.size() != static_cast<size_t>(prefix_end - b) ||
        canonical.compare(0, canonical.size(), b, canonical.size()) != 0) {
      return fail(
          "malformed entry: not in the form the writer produces (key order, spacing or "
          "number and string formatting differ)");
    }
    if (r_.entries == 0) {
      if (seq_v != 0 || prev_s != kZeroHash) {
        return fail(
            "first entry is not the start of the chain: entries were removed from the "
            "beginning (found seq " +
            std::to_string(seq_v) + ", prev " + abbrev(prev_s) +
            "; the start has seq 0 and a prev of 64 zeros)");
      }
    } else if (seq_v != r_.entries || prev_s != r_.last_hash) {
      return fail("an entry was inserted or removed before this line (expected seq " +
                  std::to_string(r_.entries) + ", prev " + abbrev(r_.last_hash) + "; found seq " +
                  std::to_string(seq_v) + ", prev " + abbrev(prev_s) + ")");
    }
    ++r_.entries;
    r_.last_hash = hash_s;
    return true;
  }

  AuditVerifyResult r_;
  uint64_t line_no_ = 0;
};

// write(2) until all of `s` is written, retrying on EINTR and partial writes.
// Returns 0, or the errno of the failure and in `*written` how much got out.
int write_fully(int fd, const std::string& s, size_t* written) {
  *written = 0;
  while (*written < s.size()) {
    const ssize_t k = ::write(fd, s.data() + *written, s.size() - *written);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (k == 0) return EIO;  // no progress on a regular file: treat as an I/O error
    *written += static_cast<size_t>(k);
  }
  return 0;
}

}  // namespace

AuditVerifyResult verify_audit_text(const std::string& text) {
  ChainChecker checker;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const bool terminated = nl != std::string::npos;
    const size_t end = terminated ? nl : text.size();
    if (!checker.line(text.data() + pos, text.data() + end, terminated)) break;
    pos = end + 1;
  }
  return checker.result();
}

AuditVerifyResult verify_audit_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw ConfigError("cannot read audit log " + path + ": " + errno_text(errno));
  }
  ChainChecker checker;
  std::string pending;  // the start of a line whose newline has not been read yet
  std::string block(size_t{1} << 16, '\0');
  for (;;) {
    const ssize_t k = ::read(fd.get(), block.data(), block.size());
    if (k < 0) {
      if (errno == EINTR) continue;
      throw ConfigError("cannot read audit log " + path + ": " + errno_text(errno));
    }
    if (k == 0) break;
    pending.append(block.data(), static_cast<size_t>(k));
    size_t pos = 0;
    for (size_t nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', pos)) {
      if (!checker.line(pending.data() + pos, pending.data() + nl, true)) {
        return checker.result();
      }
      pos = nl + 1;
    }
    pending.erase(0, pos);
    // A line already over the limit fails whatever follows: stop buffering it.
    if (pending.size() > kAuditMaxLineBytes) {
      checker.line(pending.data(), pending.data() + pending.size(), false);
      return checker.result();
    }
  }
  if (!pending.empty()) checker.line(pending.data(), pending.data() + pending.size(), false);
  return checker.result();
}

AuditLog::AuditLog(const std::string& path, std::string node_id)
    : path_(path), node_(std::move(node_id)), prev_hex_(kZeroHash) {
  UniqueFd fd(::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (fd.get() < 0) {
    throw TransportError("cannot open audit log " + path_ + " for appending: " + errno_text(errno) +
                         "; check the directory exists and is writable");
  }
  // Two writers would each continue the chain from the same entry and fork it.
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      throw ConfigError("audit log " + path_ +
                        " is already open for appending (by this or another process); give "
                        "each node its own audit log file");
    }
    throw TransportError("cannot lock audit log " + path_ + ": " + errno_text(errno));
  }
  const AuditVerifyResult r = verify_audit_file(path_);
  if (!r.ok) {
    const std::string where = "audit log " + path_ + " fails verification at line " +
                              std::to_string(r.first_bad_line) + ": " + r.problem;
    if (r.incomplete_last_line) {
      throw CryptoError(
          where + "; refusing to append after a torn entry; move the file aside (the " +
          std::to_string(r.entries) + " entries before that line verify) and start a new log");
    }
    throw CryptoError(where +
                      "; refusing to append to a tampered log; move it aside, keep it as "
                      "evidence, and start a new log");
  }
  next_seq_ = r.entries;
  prev_hex_ = r.last_hash;
  fd_ = fd.release();
}

AuditLog::~AuditLog() {
  if (fd_ < 0) return;
  ::fsync(fd_);  // best effort: a destructor cannot report the failure
  ::close(fd_);
}

void AuditLog::append(const std::string& event, const nlohmann::json& fields) {
  if (!fields.is_object()) {
    throw ConfigError("audit event '" + event + "': fields must be a JSON object, not " +
                      fields.type_name());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (torn_) {
    throw TransportError("audit log " + path_ +
                         ": an earlier write failed part-way, leaving a torn last entry; "
                         "nothing more is appended (move the file aside and start a new log)");
  }
  // The time is taken under the lock so times never go backwards down the file
  // (unless the system clock does).
  const std::string prefix =
      entry_prefix(next_seq_, utc_now_millis(), node_, event, fields, prev_hex_);
  const std::string hash = hash_hex(prefix.data(), prefix.size());
  std::string line;
  line.reserve(prefix.size() + kHashTailBytes + 1);
  line += prefix;
  line += ",\"hash\":\"";
  line += hash;
  line += "\"}";
  if (line.size() > kAuditMaxLineBytes) {
    throw ConfigError("audit event '" + event + "' is " + std::to_string(line.size()) +
                      " bytes, over the " + std::to_string(kAuditMaxLineBytes) +
                      "-byte limit; record a digest of large values instead");
  }
  if (audit_line_too_deep(line.data(), line.data() + line.size())) {
    throw ConfigError("audit event '" + event + "': fields nest more than " +
                      std::to_string(kAuditMaxNesting - 1) + " levels deep");
  }
  line += '\n';
  size_t written = 0;
  if (const int err = write_fully(fd_, line, &written); err != 0) {
    torn_ = written > 0;
    throw TransportError(
        "cannot append to audit log " + path_ + ": " + errno_text(err) +
        (torn_ ? " (after a partial write; the log now ends in a torn entry)" : ""));
  }
  ++next_seq_;
  prev_hex_ = hash;
}

void AuditLog::sync() {
  std::lock_guard<std::mutex> lock(mu_);
  while (::fsync(fd_) != 0) {
    if (errno == EINTR) continue;
    throw TransportError("fsync of audit log " + path_ + " failed: " + errno_text(errno));
  }
}

uint64_t AuditLog::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_;
}

}  // namespace fedwan::security
