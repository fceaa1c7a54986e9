// Recomputes the root's global model from its audit log and the payloads it
// recorded, so a chaos test can check that what the root says it accepted is
// exactly what its model is made of: nothing counted twice, nothing lost.
//
// Inputs, as the root aggregator writes them:
//  - the audit log (security/audit_log.hpp), whose "update" entries carry
//    {"sender","round","chunk","chunks","bytes","weight","sha256","decision",
//     "codec","elements"}; "round_closed" {"round"}; and "resumed" {"round"}
//    when the aggregator restarted from its checkpoint: rounds >= that round
//    were reopened, so "update" and "round_closed" entries for them logged
//    before the marker were never committed and are discarded;
//  - the store (option record_updates_dir): <dir>/<sha256 hex> holds the exact
//    payload bytes of every accepted update.
//
// The arithmetic is the root's (aggregator/aggregator_rounds.cpp with
// aggregation/round_accumulator.cpp): rounds in increasing order, begin_round
// once per round; per chunk with at least one accepted update, a zero fp32
// sum, decode_accumulate of every accepted payload in audit order with its
// weight (as float), the weights summed in double in the same order,
// finalize_mean, then the outer optimizer's step on that chunk of the global
// model. Bit-identical to the root when the build matches (-ffp-contract=off
// lives in fedwan_core, where all of that arithmetic runs).
//
// Not thread safe per call; calls share nothing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fedwan/topology.hpp"

namespace fedwan::testing {

struct AuditEntry {
  uint64_t seq = 0;
  std::string time;
  std::string node;
  std::string event;
  nlohmann::json fields;  // an object
};

// The entries of an audit log, in file order: at most `max_entries`, and
// never a last line without its newline (a torn write). Does not verify the
// hash chain (security::verify_audit_file does). Throws std::runtime_error
// when the file cannot be read or a line is not an entry.
std::vector<AuditEntry> read_audit(const std::filesystem::path& path,
                                   size_t max_entries = std::numeric_limits<size_t>::max());

// One "update" entry whose decision was "accepted" or "clipped", or "held"
// and then accepted or clipped by its "update_verdict" entry (in the order of
// the verdicts: the root combines held copies when their chunk closes).
struct AuditUpdate {
  uint64_t seq = 0;
  uint64_t round = 0;
  std::string sender;
  uint32_t chunk = 0;
  std::optional<uint32_t> chunks;
  std::optional<uint64_t> bytes;
  double weight = 0;
  std::string sha256;
  std::optional<std::string> codec;
  std::optional<uint32_t> elements;
  double scale = 1;  // "clipped": what the root multiplied the decoded values by
};

// The accepted updates and closed rounds that count, once the "resumed"
// markers have discarded what was never committed.
struct EffectiveAudit {
  std::vector<AuditUpdate> accepted;  // audit order
  std::set<uint64_t> closed_rounds;
  std::vector<uint64_t> resumed;      // the round of each "resumed" marker, in order
  size_t discarded = 0;               // accepted updates a marker discarded
  std::vector<std::string> problems;  // malformed entries (skipped)
};

// Applies the "resumed" markers. Entries from a node other than `node`
// (when not empty) are skipped and reported.
EffectiveAudit effective_audit(const std::vector<AuditEntry>& entries,
                               const std::string& node = "");

using UpdateKey = std::tuple<uint64_t, std::string, uint32_t>;  // (round, sender, chunk)

// (round, sender, chunk) accepted more than once.
std::set<UpdateKey> duplicate_acceptances(const std::vector<AuditUpdate>& accepted);

struct ReplayResult {
  std::vector<float> global;          // the recomputed global model
  std::vector<std::string> problems;  // empty when the log and the store are consistent
  std::vector<std::string> notes;     // worth knowing, not wrong (defaults used, open rounds)
  uint64_t rounds_committed = 0;      // rounds closed in the effective log
  size_t accepted = 0;                // accepted updates in the effective log
  size_t discarded = 0;               // accepted updates discarded by "resumed" markers
  // Chunks accepted per (round, sender) in the effective log.
  std::map<std::pair<uint64_t, std::string>, int> accepted_by_round_sender;
};

// Replays the root's audit log onto `initial_model`. Problems (a broken hash
// chain, a malformed entry, a missing payload, a digest, size, codec or
// chunk mismatch, a (round, sender, chunk) accepted twice, a chunk of a
// closed round with no accepted update) are reported, never thrown; an
// update whose payload cannot be used is left out of the model. Throws
// fedwan::ConfigError for an empty model or a topology whose outer optimizer
// cannot be built, std::runtime_error when the log cannot be read.
ReplayResult replay_root_audits(const Topology& topo, std::vector<float> initial_model,
                                const std::vector<std::filesystem::path>& audit_logs,
                                const std::filesystem::path& store_dir);

// The entries of `event` in the audit log at `path`, in file order (none
// when the file does not exist yet: a node that has not started).
inline std::vector<AuditEntry> audit_events(const std::filesystem::path& path,
                                            const std::string& event) {
  std::vector<AuditEntry> out;
  if (!std::filesystem::exists(path)) return out;
  for (AuditEntry& e : read_audit(path)) {
    if (e.event == event) out.push_back(std::move(e));
  }
  return out;
}

// The "update" entries of `log` as they were settled: a copy held until its
// chunk closed (decision "held", docs/security.md "Robust aggregation")
// takes the decision, reason and bounds of its "update_verdict" entry; one
// never settled (its chunk did not close) stays "held". File order.
std::vector<AuditEntry> settled_updates(const std::vector<AuditEntry>& log);
inline std::vector<AuditEntry> settled_updates(const std::filesystem::path& path) {
  return std::filesystem::exists(path) ? settled_updates(read_audit(path))
                                       : std::vector<AuditEntry>{};
}

// The root's log alone; replay_root_audits takes the logs of a root and of
// the standby that took over from it, in that order (the standby's "resumed"
// marker discards what its checkpoint does not hold).
inline ReplayResult replay_root_audit(const Topology& topo, std::vector<float> initial_model,
                                      const std::filesystem::path& audit_jsonl,
                                      const std::filesystem::path& store_dir) {
  return replay_root_audits(topo, std::move(initial_model), {audit_jsonl}, store_dir);
}

}  // namespace fedwan::testing
