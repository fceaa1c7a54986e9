// The cost record's schema, in one place for its writer (cost_recorder.hpp)
// and its reader (cost_ledger.hpp): the version, what the signature covers
// and the per-link byte counts. docs/operations.md, "Cost accounting",
// describes the fields.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace fedwan::costs {

// The schema a node writes; a reader refuses records of a later one.
inline constexpr int kCostSchemaVersion = 2;
// The signature domain of a record (security/node_key.hpp).
inline constexpr const char* kCostRecordDomain = "fedwan-cost-record-v1";

// What a record's signature covers: every field but "sig" and "cert",
// compact JSON with keys in byte order (nlohmann::json's own order), so the
// writer and any reader derive the same bytes from the same values.
std::string cost_record_signed_text(nlohmann::json record);

// Bytes a node counted on one of its links in one record.
struct LinkBytes {
  uint64_t sent = 0;  // billed to the record's node
  uint64_t received = 0;
  bool operator==(const LinkBytes& o) const { return sent == o.sent && received == o.received; }
};

}  // namespace fedwan::costs
