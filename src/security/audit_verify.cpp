// The audit log's verifier: the hash chain, the signed heads and an expected
// head (audit_log.hpp has the format and what each check detects).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errno_text.hpp"
#include "common/json_depth.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "security/audit_format.hpp"
#include "security/audit_log.hpp"
#include "security/node_key.hpp"

namespace fedwan::security {

namespace audit_format {
std::string hash_hex(const char* data, size_t n) {
  const Sha256Digest d = sha256(data, n);
  return to_hex(d.data(), d.size());
}
}  // namespace audit_format

namespace {

using nlohmann::json;
using namespace audit_format;

// Certificates a log may carry (one per process run that signed); more is
// not a log any node wrote.
constexpr size_t kMaxCerts = 4096;

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

std::string abbrev(const std::string& hex) { return hex.substr(0, 16) + "..."; }

// Checks a log line by line, in order, and remembers the first problem.
class ChainChecker {
 public:
  explicit ChainChecker(const AuditVerifyOptions& options) : options_(options) {
    r_.last_hash = kZeroHash;
  }

  // [b, e) is one line without its newline; `terminated` says whether a
  // newline followed it. Returns false once a problem has been found (this
  // line's or an earlier one's); the caller stops feeding lines then.
  bool line(const char* b, const char* e, bool terminated) {
    if (!r_.ok) return false;
    ++line_no_;
    try {
      if (!check(b, e, terminated)) return false;
      r_.good_bytes += static_cast<uint64_t>(e - b) + 1;
      return true;
    } catch (const std::exception& ex) {
      // Only allocation or OpenSSL failures get here; report, never throw.
      return fail(std::string("could not check this entry: ") + ex.what());
    } catch (...) {
      return fail("could not check this entry: unknown error");
    }
  }

  // The result once every line was fed.
  const AuditVerifyResult& finish() {
    if (r_.ok && options_.ca != nullptr && r_.signed_heads == 0) {
      r_.ok = false;
      r_.problem = r_.entries == 0
                       ? "the log is empty"
                       : "no signed head in " + std::to_string(r_.entries) +
                             " entries: nothing in this log can be checked against the CA "
                             "(its node ran without credentials, or the signed entries were "
                             "removed)";
    }
    if (r_.ok && !options_.expect_head.empty() && !r_.found_expected) {
      r_.ok = false;
      r_.problem = "the chain does not contain the recorded head " + abbrev(options_.expect_head) +
                   ": entries were removed from its end, or the log was rewritten";
    }
    return r_;
  }

 private:
  bool fail(std::string problem) {
    r_.ok = false;
    r_.first_bad_line = line_no_;
    r_.problem = std::move(problem);
    return false;
  }

  // A signed head (any entry whose fields hold "sig"): its signature over
  // "<node>\n<seq>\n<prev>", by a certificate the log carried earlier.
  bool check_signed(const json& fields, const std::string& node, uint64_t seq,
                    const std::string& prev) {
    if (const auto c = fields.find(kCert); c != fields.end()) {
      if (!c->is_string()) return fail("malformed signed head: \"cert\" must be base64");
      auto der = base64_decode(c->get_ref<const std::string&>(), kMaxSignerCertBytes);
      if (!der) return fail("malformed signed head: \"cert\" is not a base64 certificate");
      if (certs_.size() >= kMaxCerts) return fail("malformed log: too many certificates");
      const Sha256Digest d = sha256(der->data(), der->size());
      certs_[to_hex(d.data(), d.size())] = std::move(*der);
    }
    const auto sig = fields.find(kSig);
    if (sig == fields.end()) return true;
    const auto signer = fields.find(kSigner);
    const auto cert_sha = fields.find(kCertSha);
    if (signer == fields.end() || !signer->is_string() || cert_sha == fields.end() ||
        !cert_sha->is_string() || !is_lower_hex64(cert_sha->get_ref<const std::string&>()) ||
        !sig->is_string()) {
      return fail("malformed signed head: it needs \"signer\", \"cert_sha256\" and \"sig\"");
    }
    if (signer->get_ref<const std::string&>() != node) {
      return fail("signed head by '" + signer->get<std::string>() + "' in the log of '" + node +
                  "'");
    }
    auto sig_bytes = base64_decode(sig->get_ref<const std::string&>(), kMaxSignatureBytes);
    if (!sig_bytes) return fail("malformed signed head: \"sig\" is not a base64 signature");
    ++r_.signed_heads;
    r_.last_signed_seq = seq;
    r_.signer = node;
    if (options_.ca == nullptr) return true;
    const auto cert = certs_.find(cert_sha->get_ref<const std::string&>());
    if (cert == certs_.end()) {
      return fail("signed head names certificate " + abbrev(cert_sha->get<std::string>()) +
                  ", which the log does not carry before it");
    }
    ExpectedSigner who;
    who.node_id = node;
    if (auto bad = options_.ca->verify(cert->second, kAuditHeadDomain,
                                       audit_head_message(node, seq, prev), *sig_bytes, who)) {
      return fail("signed head does not verify: " + *bad +
                  " (the entries before it were changed, or the head was forged)");
    }
    ++r_.verified_heads;
    return true;
  }

  // Every member present, no other, each of its type.
  bool check_members(const json& j) {
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
      return fail("malformed entry: \"time\" must be a UTC RFC 3339 time with milliseconds, "
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
    return true;
  }

  // The line [b, e) ends with its "hash" member, that hash is the line's
  // own, and the rest is byte for byte what the writer makes of the members.
  bool check_encoding(const char* b, const char* e, const json& j) {
    const size_t n = static_cast<size_t>(e - b);
    const std::string& hash_s = j["hash"].get_ref<const std::string&>();
    const std::string tail = ",\"hash\":\"" + hash_s + "\"}";
    if (n < tail.size() || std::string(e - tail.size(), e) != tail) {
      return fail("malformed entry: the line does not end with its \"hash\" member");
    }
    const char* prefix_end = e - kHashTailBytes;
    if (hash_hex(b, static_cast<size_t>(prefix_end - b)) != hash_s) {
      return fail("entry was edited (hash mismatch)");
    }
    const std::string canonical = entry_prefix(
        j["seq"].get<uint64_t>(), j["time"].get_ref<const std::string&>(),
        j["node"].get_ref<const std::string&>(), j["event"].get_ref<const std::string&>(),
        j["fields"], j["prev"].get_ref<const std::string&>());
    if (canonical.size() != static_cast<size_t>(prefix_end - b) ||
        canonical.compare(0, canonical.size(), b, canonical.size()) != 0) {
      return fail("malformed entry: not in the form the writer produces (key order, spacing or "
                  "number and string formatting differ)");
    }
    return true;
  }

  // The entry continues the chain: the first starts it, each later one
  // follows the last entry checked.
  bool check_link(uint64_t seq_v, const std::string& prev_s) {
    if (r_.entries == 0) {
      if (seq_v != 0 || prev_s != kZeroHash) {
        return fail("first entry is not the start of the chain: entries were removed from the "
                    "beginning (found seq " +
                    std::to_string(seq_v) + ", prev " + abbrev(prev_s) +
                    "; the start has seq 0 and a prev of 64 zeros)");
      }
    } else if (seq_v != r_.entries || prev_s != r_.last_hash) {
      return fail("an entry was inserted or removed before this line (expected seq " +
                  std::to_string(r_.entries) + ", prev " + abbrev(r_.last_hash) + "; found seq " +
                  std::to_string(seq_v) + ", prev " + abbrev(prev_s) + ")");
    }
    return true;
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
    if (!check_members(j) || !check_encoding(b, e, j)) return false;

    const uint64_t seq_v = j["seq"].get<uint64_t>();
    const std::string& prev_s = j["prev"].get_ref<const std::string&>();
    const std::string& node_s = j["node"].get_ref<const std::string&>();
    if (!check_link(seq_v, prev_s)) return false;
    if (!check_signed(j["fields"], node_s, seq_v, prev_s)) return false;
    const std::string& hash_s = j["hash"].get_ref<const std::string&>();
    ++r_.entries;
    r_.last_hash = hash_s;
    r_.closed = j["event"].get_ref<const std::string&>() == kClosed;
    if (hash_s == options_.expect_head) r_.found_expected = true;
    return true;
  }

  const AuditVerifyOptions& options_;
  AuditVerifyResult r_;
  uint64_t line_no_ = 0;
  std::map<std::string, std::vector<uint8_t>> certs_;  // by SHA-256 of the DER
};

// Owns a file descriptor (closed on destruction).
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

bool audit_line_too_deep(const char* b, const char* e) {
  return json_nesting_exceeds(b, e, kAuditMaxNesting);
}

std::string audit_head_message(const std::string& node, uint64_t seq, const std::string& prev) {
  return node + "\n" + std::to_string(seq) + "\n" + prev;
}

AuditVerifyResult verify_audit_text(const std::string& text, const AuditVerifyOptions& options) {
  ChainChecker checker(options);
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const bool terminated = nl != std::string::npos;
    const size_t end = terminated ? nl : text.size();
    if (!checker.line(text.data() + pos, text.data() + end, terminated)) break;
    pos = end + 1;
  }
  return checker.finish();
}

AuditVerifyResult verify_audit_file(const std::string& path, const AuditVerifyOptions& options) {
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) {
    throw ConfigError("cannot read audit log " + path + ": " + errno_text(errno));
  }
  ChainChecker checker(options);
  std::string pending;  // the start of a line whose newline has not been read yet
  std::string block(size_t{1} << 16, '\0');
  for (;;) {
    const ssize_t k = ::read(fd.fd, block.data(), block.size());
    if (k < 0) {
      if (errno == EINTR) continue;
      throw ConfigError("cannot read audit log " + path + ": " + errno_text(errno));
    }
    if (k == 0) break;
    pending.append(block.data(), static_cast<size_t>(k));
    size_t pos = 0;
    for (size_t nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', pos)) {
      if (!checker.line(pending.data() + pos, pending.data() + nl, true)) {
        return checker.finish();
      }
      pos = nl + 1;
    }
    pending.erase(0, pos);
    // A line already over the limit fails whatever follows: stop buffering it.
    if (pending.size() > kAuditMaxLineBytes) {
      checker.line(pending.data(), pending.data() + pending.size(), false);
      return checker.finish();
    }
  }
  if (!pending.empty()) checker.line(pending.data(), pending.data() + pending.size(), false);
  return checker.finish();
}

}  // namespace fedwan::security
