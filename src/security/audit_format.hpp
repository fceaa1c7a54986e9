// The line format of the audit log, shared by its writer (audit_log.cpp) and
// its verifier (audit_verify.cpp) so the verifier can insist a line is
// exactly what the writer would have produced. Private to those two files.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace fedwan::security::audit_format {

inline const std::string kZeroHash(64, '0');
// `,"hash":"` + 64 hex + `"}`: the fixed-length tail every line ends with.
inline constexpr size_t kHashTailBytes = 9 + 64 + 2;

// Strings are dumped with invalid UTF-8 replaced (U+FFFD) rather than
// throwing: an audit entry about a misbehaving peer must still be written.
inline std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The hashed part of a line: everything before `,"hash"`.
inline std::string entry_prefix(uint64_t seq, const std::string& time, const std::string& node,
                                const std::string& event, const nlohmann::json& fields,
                                const std::string& prev) {
  using nlohmann::json;
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

std::string hash_hex(const char* data, size_t n);

// Events the writer produces itself; a signed one carries these fields.
inline constexpr const char* kOpened = "audit_opened";
inline constexpr const char* kResumed = "audit_resumed";
inline constexpr const char* kHead = "audit_head";
inline constexpr const char* kClosed = "audit_closed";
inline constexpr const char* kRecovered = "audit_recovered";
inline constexpr const char* kOutage = "audit_outage";
inline constexpr const char* kSigner = "signer";
inline constexpr const char* kCertSha = "cert_sha256";
inline constexpr const char* kCert = "cert";
inline constexpr const char* kSig = "sig";

}  // namespace fedwan::security::audit_format
