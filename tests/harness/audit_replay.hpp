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
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregation/round_accumulator.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "fedwan/topology.hpp"
#include "security/audit_log.hpp"
#include "tensor/chunk_plan.hpp"

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
inline std::vector<AuditEntry> read_audit(const std::filesystem::path& path,
                                          size_t max_entries = std::numeric_limits<size_t>::max()) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("read_audit: cannot open " + path.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<AuditEntry> out;
  size_t pos = 0;
  for (size_t line = 1; out.size() < max_entries; ++line) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;
    const nlohmann::json j = nlohmann::json::parse(text.begin() + static_cast<std::ptrdiff_t>(pos),
                                                   text.begin() + static_cast<std::ptrdiff_t>(nl),
                                                   nullptr, /*allow_exceptions=*/false);
    pos = nl + 1;
    const bool ok = j.is_object() && j.contains("seq") && j["seq"].is_number_unsigned() &&
                    j.contains("time") && j["time"].is_string() && j.contains("node") &&
                    j["node"].is_string() && j.contains("event") && j["event"].is_string() &&
                    j.contains("fields") && j["fields"].is_object();
    if (!ok) {
      throw std::runtime_error("read_audit: " + path.string() + " line " + std::to_string(line) +
                               " is not an audit entry");
    }
    out.push_back({j["seq"].get<uint64_t>(), j["time"].get<std::string>(),
                   j["node"].get<std::string>(), j["event"].get<std::string>(), j["fields"]});
  }
  return out;
}

// One "update" entry whose decision was "accepted".
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

namespace audit_detail {

template <typename T>
std::optional<T> unsigned_field(const nlohmann::json& f, const char* key) {
  auto it = f.find(key);
  if (it == f.end() || !it->is_number_unsigned()) return std::nullopt;
  const uint64_t v = it->get<uint64_t>();
  if (v > std::numeric_limits<T>::max()) return std::nullopt;
  return static_cast<T>(v);
}

inline std::optional<std::string> string_field(const nlohmann::json& f, const char* key) {
  auto it = f.find(key);
  if (it == f.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

inline std::string where(const AuditEntry& e) { return "entry " + std::to_string(e.seq); }

}  // namespace audit_detail

// Applies the "resumed" markers. Entries from a node other than `node`
// (when not empty) are skipped and reported.
inline EffectiveAudit effective_audit(const std::vector<AuditEntry>& entries,
                                      const std::string& node = "") {
  using namespace audit_detail;
  EffectiveAudit out;
  bool foreign_reported = false;
  for (const AuditEntry& e : entries) {
    if (!node.empty() && e.node != node) {
      if (!foreign_reported) {
        out.problems.push_back(where(e) + " is from node '" + e.node + "', not '" + node +
                               "' (skipped, and any others)");
        foreign_reported = true;
      }
      continue;
    }
    if (e.event == "resumed") {
      const auto r = unsigned_field<uint64_t>(e.fields, "round");
      if (!r) {
        out.problems.push_back(where(e) + ": \"resumed\" without a round");
        continue;
      }
      const size_t before = out.accepted.size();
      std::vector<AuditUpdate> kept;
      for (AuditUpdate& u : out.accepted) {
        if (u.round < *r) kept.push_back(std::move(u));
      }
      out.accepted = std::move(kept);
      out.discarded += before - out.accepted.size();
      out.closed_rounds.erase(out.closed_rounds.lower_bound(*r), out.closed_rounds.end());
      out.resumed.push_back(*r);
    } else if (e.event == "round_closed") {
      const auto r = unsigned_field<uint64_t>(e.fields, "round");
      if (!r) {
        out.problems.push_back(where(e) + ": \"round_closed\" without a round");
        continue;
      }
      out.closed_rounds.insert(*r);
    } else if (e.event == "update") {
      if (string_field(e.fields, "decision").value_or("") != "accepted") continue;
      AuditUpdate u;
      u.seq = e.seq;
      const auto round = unsigned_field<uint64_t>(e.fields, "round");
      const auto chunk = unsigned_field<uint32_t>(e.fields, "chunk");
      const auto sender = string_field(e.fields, "sender");
      const auto sha = string_field(e.fields, "sha256");
      auto w = e.fields.find("weight");
      if (!round || !chunk || !sender || !sha || w == e.fields.end() || !w->is_number()) {
        out.problems.push_back(where(e) +
                               ": accepted update without round, chunk, sender, sha256 or weight");
        continue;
      }
      u.round = *round;
      u.chunk = *chunk;
      u.sender = *sender;
      u.sha256 = *sha;
      u.weight = w->get<double>();
      u.chunks = unsigned_field<uint32_t>(e.fields, "chunks");
      u.bytes = unsigned_field<uint64_t>(e.fields, "bytes");
      u.codec = string_field(e.fields, "codec");
      u.elements = unsigned_field<uint32_t>(e.fields, "elements");
      out.accepted.push_back(std::move(u));
    }
  }
  return out;
}

using UpdateKey = std::tuple<uint64_t, std::string, uint32_t>;  // (round, sender, chunk)

// (round, sender, chunk) accepted more than once.
inline std::set<UpdateKey> duplicate_acceptances(const std::vector<AuditUpdate>& accepted) {
  std::set<UpdateKey> seen;
  std::set<UpdateKey> twice;
  for (const AuditUpdate& u : accepted) {
    UpdateKey k{u.round, u.sender, u.chunk};
    if (!seen.insert(k).second) twice.insert(std::move(k));
  }
  return twice;
}

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
inline ReplayResult replay_root_audits(const Topology& topo, std::vector<float> initial_model,
                                       const std::vector<std::filesystem::path>& audit_logs,
                                       const std::filesystem::path& store_dir) {
  ReplayResult res;
  std::vector<AuditEntry> entries;
  for (const std::filesystem::path& audit_jsonl : audit_logs) {
    const security::AuditVerifyResult chain = security::verify_audit_file(audit_jsonl.string());
    if (!chain.ok) {
      res.problems.push_back(audit_jsonl.string() + ": audit chain fails at line " +
                             std::to_string(chain.first_bad_line) + ": " + chain.problem +
                             " (replaying the " + std::to_string(chain.entries) +
                             " entries before it)");
    }
    const std::vector<AuditEntry> part = read_audit(audit_jsonl, chain.entries);
    entries.insert(entries.end(), part.begin(), part.end());
  }
  EffectiveAudit eff = effective_audit(entries, topo.root().id);
  res.problems.insert(res.problems.end(), eff.problems.begin(), eff.problems.end());
  res.accepted = eff.accepted.size();
  res.discarded = eff.discarded;
  res.rounds_committed = eff.closed_rounds.size();
  for (const AuditUpdate& u : eff.accepted) res.accepted_by_round_sender[{u.round, u.sender}] += 1;
  for (const UpdateKey& k : duplicate_acceptances(eff.accepted)) {
    res.problems.push_back("round " + std::to_string(std::get<0>(k)) + ", sender '" +
                           std::get<1>(k) + "', chunk " + std::to_string(std::get<2>(k)) +
                           " was accepted more than once");
  }

  const size_t n = initial_model.size();
  const ChunkPlan plan = ChunkPlan::from_bytes(n, topo.federation().chunk_bytes);
  std::unique_ptr<OuterOptimizer> outer = make_outer_optimizer(topo.federation().outer, n);
  res.global = std::move(initial_model);

  // The usable updates, per (round, chunk), in audit order.
  struct Usable {
    const Codec* codec;
    uint32_t elements;
    double weight;
    std::vector<uint8_t> payload;
  };
  std::map<std::pair<uint64_t, uint32_t>, std::vector<Usable>> by_chunk;
  bool defaulted_codec = false;
  for (const AuditUpdate& u : eff.accepted) {
    const std::string what = "round " + std::to_string(u.round) + " chunk " +
                             std::to_string(u.chunk) + " from '" + u.sender + "' (entry " +
                             std::to_string(u.seq) + ")";
    if (u.chunk >= plan.count() || (u.chunks && *u.chunks != plan.count())) {
      res.problems.push_back(what + ": chunk outside the plan of " + std::to_string(plan.count()) +
                             " chunks");
      continue;
    }
    const uint32_t elements = u.elements.value_or(plan.size(u.chunk));
    if (elements != plan.size(u.chunk)) {
      res.problems.push_back(what + ": " + std::to_string(elements) + " elements, the plan has " +
                             std::to_string(plan.size(u.chunk)));
      continue;
    }
    const Codec* codec = nullptr;
    try {
      defaulted_codec = defaulted_codec || !u.codec;
      codec = &codec_by_name(u.codec.value_or(topo.federation().codec));
    } catch (const std::exception& e) {
      res.problems.push_back(what + ": " + e.what());
      continue;
    }
    const std::filesystem::path file = store_dir / u.sha256;
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      res.problems.push_back(what + ": payload " + file.string() + " is missing");
      continue;
    }
    std::vector<uint8_t> payload((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
    const Sha256Digest d = sha256(payload.data(), payload.size());
    if (to_hex(d.data(), d.size()) != u.sha256) {
      res.problems.push_back(what + ": payload " + file.string() + " does not hash to its name");
      continue;
    }
    if (u.bytes && *u.bytes != payload.size()) {
      res.problems.push_back(what + ": the log says " + std::to_string(*u.bytes) +
                             " bytes, the payload has " + std::to_string(payload.size()));
      continue;
    }
    if (!codec->validate(payload.data(), payload.size(), elements)) {
      res.problems.push_back(what + ": payload is not valid " + std::string(codec->name()) +
                             " for " + std::to_string(elements) + " elements");
      continue;
    }
    by_chunk[{u.round, u.chunk}].push_back({codec, elements, u.weight, std::move(payload)});
  }
  if (defaulted_codec) {
    res.notes.push_back("some updates name no codec: assumed the topology's '" +
                        topo.federation().codec + "'");
  }

  std::set<uint64_t> rounds = eff.closed_rounds;
  for (const auto& [key, list] : by_chunk) rounds.insert(key.first);
  for (const AuditUpdate& u : eff.accepted) rounds.insert(u.round);
  for (uint64_t round : rounds) {
    const bool closed = eff.closed_rounds.count(round) > 0;
    if (!closed) {
      res.notes.push_back("round " + std::to_string(round) +
                          " has accepted updates but no round_closed entry; its chunks are "
                          "replayed (the root steps a chunk as soon as it completes)");
    }
    outer->begin_round(round);
    for (uint32_t c = 0; c < plan.count(); ++c) {
      auto it = by_chunk.find({round, c});
      if (it == by_chunk.end()) {
        if (closed) {
          res.problems.push_back("round " + std::to_string(round) + " closed, but chunk " +
                                 std::to_string(c) + " has no usable accepted update");
        }
        continue;
      }
      const uint32_t elements = plan.size(c);
      std::vector<float> sum(elements, 0.0f);
      double weight = 0;
      for (const Usable& u : it->second) {
        u.codec->decode_accumulate(u.payload.data(), elements, static_cast<float>(u.weight),
                                   sum.data());
        weight += u.weight;
      }
      finalize_mean(sum.data(), elements, weight);
      const uint64_t off = plan.offset(c);
      outer->step(res.global.data() + off, sum.data(), off, elements);
    }
  }
  return res;
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
