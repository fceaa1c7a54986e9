// The audit log's writer: appending, signed heads, failures held in memory
// and the torn-tail recovery (audit_log.hpp). The verifier is audit_verify.cpp.
#include "security/audit_log.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "common/atomic_file.hpp"
#include "common/crash_point.hpp"
#include "common/errno_text.hpp"
#include "common/keep_alive.hpp"
#include "common/sha256.hpp"
#include "common/utc_time.hpp"
#include "fedwan/error.hpp"
#include "security/audit_format.hpp"
#include "security/node_key.hpp"

namespace fedwan::security {
namespace {

using nlohmann::json;
using namespace audit_format;
using SteadyClock = std::chrono::steady_clock;

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

// The line for an entry, or ConfigError when it breaks the format's limits.
std::string make_line(uint64_t seq, const std::string& time, const std::string& node,
                      const std::string& event, const json& fields, const std::string& prev,
                      std::string* hash) {
  const std::string prefix = entry_prefix(seq, time, node, event, fields, prev);
  *hash = hash_hex(prefix.data(), prefix.size());
  std::string line;
  line.reserve(prefix.size() + kHashTailBytes + 1);
  line += prefix;
  line += ",\"hash\":\"";
  line += *hash;
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
  return line;
}

}  // namespace

AuditLog::AuditLog(const std::string& path, std::string node_id, AuditOptions options)
    : path_(path), node_(std::move(node_id)), options_(std::move(options)), prev_hex_(kZeroHash) {
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
  const bool torn = !r.ok && r.incomplete_last_line;
  if (!r.ok && !torn) {
    throw CryptoError("audit log " + path_ + " fails verification at line " +
                      std::to_string(r.first_bad_line) + ": " + r.problem +
                      "; refusing to append to a tampered log; move it aside, keep it as "
                      "evidence, and start a new log");
  }
  fd_ = fd.release();
  next_seq_ = r.entries;
  prev_hex_ = r.last_hash;
  size_ = r.good_bytes;
  const std::lock_guard<std::mutex> lock(mu_);
  if (torn) recover_torn_tail(r.good_bytes, r.entries);
  if (options_.key) {
    json fields = json::object();
    if (next_seq_ > 0) {
      fields["from_seq"] = next_seq_ - 1;
      fields["from_hash"] = prev_hex_;
    }
    enqueue(signed_marker(next_seq_ > 0 ? kResumed : kOpened, std::move(fields)));
  }
}

AuditLog::~AuditLog() {
  try {
    close();
  } catch (...) {
    // A destructor cannot report; health() said what failed.
  }
  if (fd_ < 0) return;
  ::fsync(fd_);  // best effort
  ::close(fd_);
}

void AuditLog::recover_torn_tail(uint64_t good_bytes, uint64_t entries) {
  // Keep the torn bytes for the operator, then cut the file back to its
  // last whole entry; the recovery itself is the next entry.
  std::string torn;
  {
    UniqueFd in(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (in.get() < 0 || ::fstat(in.get(), &st) != 0) {
      throw TransportError("cannot read the torn end of audit log " + path_ + ": " +
                           errno_text(errno));
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    torn.resize(static_cast<size_t>(size - good_bytes));
    const ssize_t k = ::pread(in.get(), torn.data(), torn.size(), static_cast<off_t>(good_bytes));
    if (k < 0 || static_cast<size_t>(k) != torn.size()) {
      throw TransportError("cannot read the torn end of audit log " + path_ + ": " +
                           errno_text(errno));
    }
  }
  const std::string kept = path_ + ".torn-" + std::to_string(entries);
  write_file_atomic(kept, torn, 0600);
  if (::ftruncate(fd_, static_cast<off_t>(good_bytes)) != 0 || ::fsync(fd_) != 0) {
    throw TransportError("cannot cut the torn end off audit log " + path_ + ": " +
                         errno_text(errno));
  }
  const Sha256Digest d = sha256(torn.data(), torn.size());
  Pending p;
  p.event = kRecovered;
  p.fields = {
      {"torn_bytes", torn.size()}, {"torn_sha256", to_hex(d.data(), d.size())}, {"kept_as", kept}};
  p.time = utc_now_ms();
  enqueue(std::move(p));
}

AuditLog::Pending AuditLog::signed_marker(const std::string& event, json fields) {
  Pending p;
  p.event = event;
  p.fields = std::move(fields);
  p.time = utc_now_ms();
  p.sign = options_.key != nullptr;
  return p;
}

void AuditLog::append(const std::string& event, const json& fields) {
  if (!fields.is_object()) {
    throw ConfigError("audit event '" + event + "': fields must be a JSON object, not " +
                      fields.type_name());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw ConfigError("audit log " + path_ + " is closed; nothing more is appended");
  Pending p;
  p.event = event;
  p.fields = fields;
  // The time is taken under the lock so times never go backwards down the
  // file (unless the system clock does).
  p.time = utc_now_ms();
  // Refuse an entry that can never be written before it waits anywhere.
  std::string ignored;
  (void)make_line(next_seq_, p.time, node_, event, p.fields, prev_hex_, &ignored);
  enqueue(std::move(p));
  // A head now and then while entries keep coming.
  if (options_.key && next_seq_ > signed_through_ &&
      SteadyClock::now() - last_signed_ >= options_.head_interval) {
    enqueue(signed_marker(kHead, json::object()));
  }
}

void AuditLog::enqueue(Pending p) {
  p.cost = audit_format::dump(p.fields).size() + p.event.size() + 128;
  const bool due = SteadyClock::now() >= next_retry_;
  if (!waiting_.empty() && (waiting_.size() >= options_.max_waiting_entries ||
                            waiting_bytes_ + p.cost > options_.max_waiting_bytes)) {
    // Writes are failing and memory is full: count what is lost.
    lost_by_event_[p.event] += 1;
    health_.lost += 1;
    if (due) flush_waiting();
    return;
  }
  waiting_bytes_ += p.cost;
  waiting_.push_back(std::move(p));
  health_.waiting = waiting_.size();
  // While writes fail, what comes in waits for the next try.
  if (waiting_.size() == 1 || due) flush_waiting();
}

void AuditLog::flush_waiting() {
  std::string error;
  while (!waiting_.empty()) {
    Pending& p = waiting_.front();
    if (!write_entry(p, &error)) {
      if (health_.writable) outage_since_ = p.time;
      health_.writable = false;
      health_.failed_writes += 1;
      health_.last_error = error;
      health_.waiting = waiting_.size();
      next_retry_ = SteadyClock::now() + options_.retry_every;
      return;
    }
    waiting_bytes_ -= std::min(waiting_bytes_, p.cost);
    waiting_.pop_front();
  }
  health_.waiting = 0;
  waiting_bytes_ = 0;
  if (health_.writable) return;
  // Writable again: the outage goes on the record, with what it cost.
  health_.writable = true;
  Pending p;
  p.event = kOutage;
  p.fields = {{"since", outage_since_},
              {"failed_writes", health_.failed_writes},
              {"lost", lost_by_event_},
              {"error", health_.last_error}};
  p.time = utc_now_ms();
  lost_by_event_.clear();
  if (!write_entry(p, &error)) {
    health_.writable = false;
    health_.failed_writes += 1;
    health_.last_error = error;
    next_retry_ = SteadyClock::now() + options_.retry_every;
    p.cost = 0;
    waiting_.push_back(std::move(p));
    health_.waiting = waiting_.size();
  }
}

bool AuditLog::write_entry(Pending& p, std::string* error) {
  if (p.sign) {
    // Signed over this entry's own seq and prev: it vouches for every entry
    // before it.
    const std::vector<uint8_t> sig =
        options_.key->sign(kAuditHeadDomain, audit_head_message(node_, next_seq_, prev_hex_));
    p.fields[kSigner] = node_;
    p.fields[kCertSha] = options_.key->cert_sha256_hex();
    if (!cert_written_) p.fields[kCert] = base64_encode(options_.key->cert_der());
    p.fields[kSig] = base64_encode(sig);
  }
  std::string hash;
  const std::string line = make_line(next_seq_, p.time, node_, p.event, p.fields, prev_hex_, &hash);
  size_t written = 0;
  if (const int err = write_fully(fd_, line, &written); err != 0) {
    *error = "cannot append to audit log " + path_ + ": " + errno_text(err);
    // Cut a partial entry off, so the file still ends on a whole one.
    if (written > 0 && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      *error += "; a partial entry could not be cut off: " + errno_text(errno);
    }
    if (p.sign) {
      // Signed again when it is written: its seq or prev may differ then.
      for (const char* k : {kSigner, kCertSha, kCert, kSig}) p.fields.erase(k);
    }
    return false;
  }
  size_ += line.size();
  ++next_seq_;
  prev_hex_ = hash;
  if (p.sign) {
    cert_written_ = true;
    signed_through_ = next_seq_;
    last_signed_ = SteadyClock::now();
  }
  return true;
}

void AuditLog::retry() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!waiting_.empty()) flush_waiting();
}

bool AuditLog::sync() {
  // The fsync goes on a copy of the descriptor with the lock released: a
  // disk slow to flush holds it for seconds, during which the node's loop
  // beats (common/keep_alive.hpp) and what it does may append here.
  int dup_err = 0;
  const UniqueFd own([this, &dup_err] {
    std::lock_guard<std::mutex> lock(mu_);
    if (!waiting_.empty()) flush_waiting();
    const int fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    dup_err = errno;
    return fd;
  }());
  if (own.get() < 0) {
    std::lock_guard<std::mutex> lock(mu_);
    health_.failed_writes += 1;
    health_.last_error = "fsync of audit log " + path_ + " failed: " + errno_text(dup_err);
    return false;
  }
  const int err = KeepAlive::during([fd = own.get()] {
    stall_point("audit.sync");  // a slow disk's flush, for liveness tests
    while (::fsync(fd) != 0) {
      if (errno != EINTR) return errno;
    }
    return 0;
  });
  std::lock_guard<std::mutex> lock(mu_);
  if (err != 0) {
    health_.failed_writes += 1;
    health_.last_error = "fsync of audit log " + path_ + " failed: " + errno_text(err);
    return false;
  }
  return waiting_.empty();
}

void AuditLog::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  if (options_.key) {
    next_retry_ = {};  // one last try for everything waiting
    enqueue(signed_marker(kClosed, json::object()));
  } else if (!waiting_.empty()) {
    flush_waiting();
  }
  closed_ = true;
}

uint64_t AuditLog::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_;
}

std::optional<AuditLog::Head> AuditLog::head() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (next_seq_ == 0) return std::nullopt;
  return Head{next_seq_ - 1, prev_hex_};
}

AuditHealth AuditLog::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

bool AuditLog::contains(uint64_t seq, const std::string& hash) const {
  // Lines are canonical: `{"seq":N,` starts them and the hash ends them.
  UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return false;
  std::string pending;
  std::string block(size_t{1} << 16, '\0');
  for (;;) {
    const ssize_t k = ::read(fd.get(), block.data(), block.size());
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    pending.append(block.data(), static_cast<size_t>(k));
    size_t pos = 0;
    for (size_t nl = pending.find('\n', pos); nl != std::string::npos;
         nl = pending.find('\n', pos)) {
      const std::string_view line(pending.data() + pos, nl - pos);
      pos = nl + 1;
      constexpr std::string_view kStart = "{\"seq\":";
      if (line.size() < kStart.size() + kHashTailBytes || line.substr(0, kStart.size()) != kStart) {
        continue;
      }
      uint64_t s = 0;
      const char* first = line.data() + kStart.size();
      const auto [end, ec] = std::from_chars(first, line.data() + line.size(), s);
      if (ec != std::errc() || s != seq) continue;
      return line.substr(line.size() - 66, 64) == hash;
    }
    pending.erase(0, pos);
    if (pending.size() > kAuditMaxLineBytes) return false;
  }
}

}  // namespace fedwan::security
