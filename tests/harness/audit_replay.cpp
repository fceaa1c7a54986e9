#include "harness/audit_replay.hpp"

#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>

#include "aggregation/aggregation_rule.hpp"
#include "aggregator/root_model.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "security/audit_log.hpp"
#include "tensor/chunk_plan.hpp"

namespace fedwan::testing {

namespace {

template <typename T>
std::optional<T> unsigned_field(const nlohmann::json& f, const char* key) {
  auto it = f.find(key);
  if (it == f.end() || !it->is_number_unsigned()) return std::nullopt;
  const uint64_t v = it->get<uint64_t>();
  if (v > std::numeric_limits<T>::max()) return std::nullopt;
  return static_cast<T>(v);
}

std::optional<std::string> string_field(const nlohmann::json& f, const char* key) {
  auto it = f.find(key);
  if (it == f.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::string where(const AuditEntry& e) { return "entry " + std::to_string(e.seq); }

}  // namespace

std::vector<AuditEntry> read_audit(const std::filesystem::path& path, size_t max_entries) {
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

// A clipped copy's scale, from its entry; false (and a problem) without one.
bool read_scale(const AuditEntry& e, AuditUpdate& u, std::vector<std::string>& problems) {
  auto s = e.fields.find("scale");
  if (s == e.fields.end() || !s->is_number()) {
    problems.push_back(where(e) + ": clipped without a scale");
    return false;
  }
  u.scale = s->get<double>();
  return true;
}

EffectiveAudit effective_audit(const std::vector<AuditEntry>& entries, const std::string& node) {
  EffectiveAudit out;
  bool foreign_reported = false;
  // Copies held until their chunk closed: (round, sender, chunk).
  std::map<std::tuple<uint64_t, std::string, uint32_t>, AuditUpdate> held;
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
      for (auto h = held.begin(); h != held.end();) {
        h = std::get<0>(h->first) >= *r ? held.erase(h) : std::next(h);
      }
      out.closed_rounds.erase(out.closed_rounds.lower_bound(*r), out.closed_rounds.end());
      out.resumed.push_back(*r);
    } else if (e.event == "round_closed") {
      const auto r = unsigned_field<uint64_t>(e.fields, "round");
      if (!r) {
        out.problems.push_back(where(e) + ": \"round_closed\" without a round");
        continue;
      }
      out.closed_rounds.insert(*r);
    } else if (e.event == "update_verdict") {
      const std::string decision = string_field(e.fields, "decision").value_or("");
      const auto round = unsigned_field<uint64_t>(e.fields, "round");
      const auto chunk = unsigned_field<uint32_t>(e.fields, "chunk");
      const auto sender = string_field(e.fields, "sender");
      if (!round || !chunk || !sender) {
        out.problems.push_back(where(e) + ": \"update_verdict\" without round, chunk or sender");
        continue;
      }
      auto it = held.find({*round, *sender, *chunk});
      if (it == held.end()) {
        if (decision != "refused") {
          out.problems.push_back(where(e) + ": a verdict on a copy that was not held");
        }
        continue;
      }
      AuditUpdate u = std::move(it->second);
      held.erase(it);
      if (decision == "refused") continue;
      if (decision == "clipped" && !read_scale(e, u, out.problems)) continue;
      out.accepted.push_back(std::move(u));
    } else if (e.event == "update") {
      const std::string decision = string_field(e.fields, "decision").value_or("");
      if (decision != "accepted" && decision != "clipped" && decision != "held") continue;
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
      if (decision == "clipped" && !read_scale(e, u, out.problems)) continue;
      if (decision == "held") {
        held[{u.round, u.sender, u.chunk}] = std::move(u);
        continue;
      }
      out.accepted.push_back(std::move(u));
    }
  }
  return out;
}

std::vector<AuditEntry> settled_updates(const std::vector<AuditEntry>& log) {
  std::vector<AuditEntry> out;
  // Held entries by (round, sender, chunk), as indices into out.
  std::map<std::tuple<uint64_t, std::string, uint32_t>, size_t> held;
  auto key = [](const AuditEntry& e) {
    return std::make_tuple(e.fields.value("round", uint64_t{0}), e.fields.value("sender", ""),
                           e.fields.value("chunk", uint32_t{0}));
  };
  for (const AuditEntry& e : log) {
    if (e.event == "update") {
      if (e.fields.value("decision", "") == "held") held[key(e)] = out.size();
      out.push_back(e);
    } else if (e.event == "update_verdict") {
      auto it = held.find(key(e));
      if (it == held.end()) continue;
      nlohmann::json& f = out[it->second].fields;
      for (const char* k : {"decision", "reason", "norm", "bound", "scale"}) {
        if (e.fields.contains(k)) f[k] = e.fields[k];
      }
      held.erase(it);
    }
  }
  return out;
}

std::set<UpdateKey> duplicate_acceptances(const std::vector<AuditUpdate>& accepted) {
  std::set<UpdateKey> seen;
  std::set<UpdateKey> twice;
  for (const AuditUpdate& u : accepted) {
    UpdateKey k{u.round, u.sender, u.chunk};
    if (!seen.insert(k).second) twice.insert(std::move(k));
  }
  return twice;
}

ReplayResult replay_root_audits(const Topology& topo, std::vector<float> initial_model,
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
  const tensor::ChunkPlan plan = tensor::ChunkPlan::from_bytes(n, topo.federation().chunk_bytes);
  std::unique_ptr<OuterOptimizer> outer = make_outer_optimizer(topo.federation().outer, n);
  const auto rule = aggregation::make_rule(topo.federation().aggregation.rule,
                                           topo.federation().aggregation.params);
  // The root's model: the anchor its children hold plus a bf16 residual
  // (aggregator/root_model.hpp); each chunk's anchor update goes down in
  // the topology's codec and moves the anchor when the round commits.
  aggregator::RootModel model(std::move(initial_model));
  const Codec& down = codec_by_name(topo.federation().codec);

  // The usable updates, per (round, chunk), in audit order.
  struct Usable {
    const Codec* codec;
    uint32_t elements;
    double weight;
    std::vector<uint8_t> payload;
    double scale;
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
    by_chunk[{u.round, u.chunk}].push_back(
        {codec, elements, u.weight, std::move(payload), u.scale});
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
    std::vector<std::pair<uint32_t, std::vector<uint8_t>>> anchor;  // chunk, its update
    for (uint32_t c = 0; c < plan.count(); ++c) {
      const uint32_t elements = plan.size(c);
      const uint64_t off = plan.offset(c);
      std::vector<float> global(elements);
      model.global_chunk(off, elements, global.data());
      auto it = by_chunk.find({round, c});
      if (it == by_chunk.end()) {
        if (!closed) continue;  // the root steps a chunk only once it completes
        // The root keeps a chunk with no accepted copy as it is, and still
        // sends its residual down.
        res.problems.push_back("round " + std::to_string(round) + " closed, but chunk " +
                               std::to_string(c) + " has no usable accepted update");
      } else {
        // The topology's rule, fed the updates in the order they were accepted.
        auto combiner = rule->begin_chunk(elements, it->second.size());
        uint32_t slot = 0;
        std::vector<float> values(elements);
        for (const Usable& u : it->second) {
          u.codec->decode(u.payload.data(), elements, values.data());
          if (u.scale != 1) {
            const float s = static_cast<float>(u.scale);
            for (float& x : values) x *= s;
          }
          combiner->add(slot++, values.data(), u.weight);
        }
        const std::vector<float> sum = combiner->finish().values;
        outer->step(global.data(), sum.data(), off, elements);
      }
      std::vector<float> update(elements);
      for (uint32_t k = 0; k < elements; ++k) update[k] = global[k] - model.held()[off + k];
      std::vector<uint8_t> payload(down.encoded_size(elements));
      down.encode(update.data(), elements, nullptr, payload.data());
      model.settle_chunk(off, elements, global.data(), down, payload.data());
      anchor.emplace_back(c, std::move(payload));
    }
    for (const auto& [c, payload] : anchor) {
      model.apply(plan.offset(c), plan.size(c), down, payload.data());
    }
  }
  res.global = model.take_global();
  return res;
}

}  // namespace fedwan::testing
