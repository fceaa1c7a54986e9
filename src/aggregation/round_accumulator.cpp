#include "aggregation/round_accumulator.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/half.hpp"
#include "common/cpu_features.hpp"
#include "fedwan/error.hpp"
#include "privacy/gaussian_mechanism.hpp"

namespace fedwan::aggregation {

#if defined(__x86_64__)
namespace {
// sum[i] / w for the whole groups of eight; returns how many it did.
__attribute__((target("avx2"))) size_t divide_avx2(float* sum, size_t n, float w) {
  const __m256 d = _mm256_set1_ps(w);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(sum + i, _mm256_div_ps(_mm256_loadu_ps(sum + i), d));
  return i;
}
}  // namespace
#endif

const char* add_outcome_name(AddOutcome o) {
  switch (o) {
    case AddOutcome::kAccepted: return "accepted";
    case AddOutcome::kDuplicate: return "duplicate";
    case AddOutcome::kStale: return "stale";
    case AddOutcome::kFuture: return "future";
    case AddOutcome::kUnknownSender: return "unknown-sender";
    case AddOutcome::kBadChunk: return "bad-chunk";
    case AddOutcome::kBadPayload: return "bad-payload";
    case AddOutcome::kRefused: return "refused";
  }
  return "?";
}

RoundAccumulator::RoundAccumulator(tensor::ChunkPlan plan, std::vector<uint32_t> children,
                                   std::shared_ptr<const AggregationRule> rule, ScreenConfig screen)
    : plan_(plan),
      children_(std::move(children)),
      rule_(rule ? std::move(rule) : make_rule(kWeightedMean)),
      screen_(screen, plan) {
  if (children_.empty()) throw ConfigError("an aggregator needs at least one child");
}

void RoundAccumulator::open(uint64_t round, double min_weight) {
  round_ = round;
  open_ = true;
  min_weight_ = min_weight;
  expected_.assign(children_.size(), true);
  seen_.assign(children_.size(), std::vector<bool>(plan_.count(), false));
  delivered_.assign(children_.size(), 0);
  inflight_.clear();
  parking_.rotate();
  taken_.assign(plan_.count(), false);
  chunks_done_ = 0;
  clip_valued_.clear();
  clip_hit_.clear();
  unclipped_reports_.clear();
}

uint64_t RoundAccumulator::privacy_unclipped_senders() const {
  uint64_t n = 0;
  for (uint32_t s : clip_valued_) {
    n += clip_hit_.count(s) == 0 && clip_reporters_.count(s) == 0 ? 1 : 0;
  }
  for (const auto& [sender, sites] : unclipped_reports_) n += sites;
  return n;
}

void RoundAccumulator::report_unclipped(uint32_t sender, uint64_t sites) {
  unclipped_reports_[sender] = sites;
}

void RoundAccumulator::add_child(uint32_t sender) {
  if (child_slot(sender) >= 0) return;
  children_.push_back(sender);
  if (!open_) return;  // open() sizes the per-round state
  expected_.push_back(false);
  seen_.emplace_back(plan_.count(), false);
  delivered_.push_back(0);
}

void RoundAccumulator::clip_copies_of(uint32_t sender, double whole_bound, bool counts_itself) {
  if (!(whole_bound > 0) || !std::isfinite(whole_bound)) {
    throw ConfigError("a privacy clip must be finite and > 0");
  }
  clip_[sender] = whole_bound;
  if (counts_itself) {
    clip_reporters_.erase(sender);
  } else {
    clip_reporters_.insert(sender);
  }
}

int RoundAccumulator::child_slot(uint32_t sender) const {
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i] == sender) return static_cast<int>(i);
  }
  return -1;
}

RoundAccumulator::Result RoundAccumulator::add(uint64_t round, uint32_t sender, uint32_t chunk,
                                               uint32_t element_count, double weight,
                                               const Codec& codec, const uint8_t* payload,
                                               size_t bytes, double excused,
                                               const PayloadFacts& known) {
  const int slot = child_slot(sender);
  if (slot < 0) return {AddOutcome::kUnknownSender, false, {}};
  if (!open_ || round > round_) return {AddOutcome::kFuture, false, {}};
  if (round < round_) return {AddOutcome::kStale, false, {}};
  if (chunk >= plan_.count() || element_count != plan_.size(chunk))
    return {AddOutcome::kBadChunk, false, {}};
  if (seen_[slot][chunk]) return {AddOutcome::kDuplicate, false, {}};
  if (taken_[chunk]) return {AddOutcome::kStale, false, {}};  // closed without this child
  const bool values = payload != nullptr || bytes != 0;
  if (!(excused >= 0 && excused <= 1e300) || (!values && !(excused > 0)) ||
      !(values ? weight > 0 && weight <= 1e300 : weight == 0)) {
    return {AddOutcome::kBadPayload, false, {}};
  }
  Inflight& acc = inflight_[chunk];
  acc.excused += excused;
  acc.weight += excused;
  if (!values) {
    CopyVerdict v;
    v.verdict = Verdict::kRefused;
    v.reason = "every copy below the sender was refused there";
    return deliver(slot, chunk, {AddOutcome::kRefused, false, v});
  }
  // Validate before decoding: a malformed payload leaves no trace but its weight.
  if (!known.valid && !codec.validate(payload, bytes, element_count)) {
    CopyVerdict v;
    v.verdict = Verdict::kRefused;
    v.reason = "malformed payload (the " + std::string(codec.name()) + " codec's check failed)";
    return refuse(acc, slot, chunk, weight, v);
  }
  // Decoded only when something asks for the values.
  bool decoded = false;
  const ValuesOnDemand decoded_values = [&]() -> float* {
    if (!decoded) {
      scratch_.resize(element_count);
      codec.decode(payload, element_count, scratch_.data());
      decoded = true;
    }
    return scratch_.data();
  };
  std::optional<ValueMeasure> measure =
      known.measure ? known.measure : measure_payload(codec, payload, element_count);
  if (!measure) measure = measure_values(decoded_values(), element_count);
  uint64_t digest = 0;
  if (screen_.checks_replays()) {
    digest = known.sha != nullptr ? payload_digest(*known.sha)
             : known.fingerprint  ? *known.fingerprint
                                  : payload_digest(payload, bytes);
  }
  CopyVerdict v = screen_.judge(round, chunk, static_cast<uint32_t>(slot), digest, *measure,
                                decoded_values, element_count);
  if (v.verdict == Verdict::kRefused) return refuse(acc, slot, chunk, weight, v);
  double norm = v.norm;  // of the values the rule gets
  // Whether those values are the payload's decoding, as they were made.
  bool as_decoded = v.verdict == Verdict::kAccepted || v.verdict == Verdict::kDeferred;
  if (auto it = clip_.find(sender); it != clip_.end()) {
    const double share = privacy::chunk_share(it->second, element_count, plan_.total());
    clip_valued_.insert(sender);
    if (privacy::clip_l2(decoded_values(), element_count, share) < 1) {
      privacy_clipped_ += 1;
      clip_hit_.insert(sender);
      norm = std::min(norm, share);
      as_decoded = false;
    }
  }
  acc.valued += 1;
  // A codec found again by its id (a registered codec, as every frame's
  // is) can have the payload wait in place of what it decodes to.
  const bool findable = codec_by_id(codec.id()) == &codec;
  if (v.verdict == Verdict::kDeferred) {
    decoded_values();
    acc.held.push_back({static_cast<uint32_t>(slot), weight, norm, scratch_, v.bound});
  } else {
    if (!(as_decoded && findable &&
          park_first_copy(acc, chunk, slot, weight, Payload{&codec, payload, bytes, false}))) {
      ChunkCombiner& combiner = combiner_of(acc, chunk);
      if (decoded) {
        combiner.add(static_cast<uint32_t>(slot), scratch_.data(), weight);
      } else {
        combiner.add_encoded(static_cast<uint32_t>(slot), codec, payload, element_count, weight,
                             scratch_);
      }
    }
    acc.added.emplace_back(static_cast<uint32_t>(slot), weight);
    screen_.remember(round, chunk, v.verdict == Verdict::kClipped ? std::min(v.bound, norm) : norm);
  }
  acc.weight += weight;
  Result r = deliver(slot, chunk, {AddOutcome::kAccepted, false, v});
  if (!r.chunk_complete) {  // it waits for more copies
    const bool held = v.verdict == Verdict::kDeferred;
    park_if_over(acc, as_decoded && findable ? Payload{&codec, payload, bytes, held} : Payload{});
  }
  return r;
}

RoundAccumulator::Result RoundAccumulator::refuse(Inflight& acc, int slot, uint32_t chunk,
                                                  double weight, CopyVerdict v) {
  acc.excused += weight;
  acc.weight += weight;
  return deliver(slot, chunk, {AddOutcome::kRefused, false, std::move(v)});
}

RoundAccumulator::Result RoundAccumulator::deliver(int slot, uint32_t chunk, Result r) {
  seen_[static_cast<size_t>(slot)][chunk] = true;
  delivered_[static_cast<size_t>(slot)] += 1;
  r.chunk_complete = chunk_ready(chunk);
  return r;
}

bool RoundAccumulator::chunk_ready(uint32_t chunk) const {
  if (taken_[chunk]) return false;
  auto it = inflight_.find(chunk);
  if (it == inflight_.end() || it->second.weight < min_weight_) return false;  // none delivered
  for (size_t i = 0; i < children_.size(); ++i) {
    if (expected_[i] && !seen_[i][chunk]) return false;
  }
  return true;
}

bool RoundAccumulator::ready_with(uint32_t chunk, int slot, double weight) const {
  if (taken_[chunk] || weight < min_weight_) return false;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (expected_[i] && !seen_[i][chunk] && i != static_cast<size_t>(slot)) return false;
  }
  return true;
}

void RoundAccumulator::set_expected(uint32_t sender, bool expected) {
  const int slot = child_slot(sender);
  if (slot < 0) FEDWAN_THROW(Error, "unknown child " + std::to_string(sender));
  expected_[static_cast<size_t>(slot)] = expected;
}

bool RoundAccumulator::expected(uint32_t sender) const {
  const int slot = child_slot(sender);
  return slot >= 0 && expected_[static_cast<size_t>(slot)];
}

std::vector<uint32_t> RoundAccumulator::ready_chunks() const {
  std::vector<uint32_t> out;
  if (!open_) return out;
  for (uint32_t c = 0; c < plan_.count(); ++c) {
    if (chunk_ready(c)) out.push_back(c);
  }
  return out;
}

std::vector<uint32_t> RoundAccumulator::quorate_chunks() const {
  std::vector<uint32_t> out;
  if (!open_) return out;
  for (const auto& [chunk, acc] : inflight_) {
    if (!taken_[chunk] && acc.weight >= min_weight_) out.push_back(chunk);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool RoundAccumulator::chunk_quorate(uint32_t chunk) const {
  if (!open_ || chunk >= taken_.size() || taken_[chunk]) return false;
  auto it = inflight_.find(chunk);
  return it != inflight_.end() && it->second.weight >= min_weight_;
}

double RoundAccumulator::chunk_weight(uint32_t chunk) const {
  auto it = inflight_.find(chunk);
  return it == inflight_.end() ? 0.0 : it->second.weight;
}

std::vector<uint32_t> RoundAccumulator::contributors(uint32_t chunk) const {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (open_ && seen_[i].at(chunk)) out.push_back(children_[i]);
  }
  return out;
}

bool RoundAccumulator::delivered_all(uint32_t sender) const {
  const int slot = child_slot(sender);
  if (slot < 0 || !open_) return false;
  for (uint32_t c = 0; c < plan_.count(); ++c) {
    if (!taken_[c] && !seen_[static_cast<size_t>(slot)][c]) return false;
  }
  return true;
}

uint32_t RoundAccumulator::delivered(uint32_t sender) const {
  const int slot = child_slot(sender);
  return slot < 0 || !open_ ? 0 : delivered_[static_cast<size_t>(slot)];
}

std::vector<uint32_t> RoundAccumulator::missing_chunks(uint32_t sender) const {
  std::vector<uint32_t> out;
  const int slot = child_slot(sender);
  if (slot < 0 || !open_) return out;
  for (uint32_t c = 0; c < plan_.count(); ++c) {
    if (!taken_[c] && !seen_[static_cast<size_t>(slot)][c]) out.push_back(c);
  }
  return out;
}

ChunkSum RoundAccumulator::take(uint32_t chunk) {
  auto it = inflight_.find(chunk);
  if (it == inflight_.end() || taken_.at(chunk)) {
    FEDWAN_THROW(Error, "chunk " + std::to_string(chunk) + " has nothing to take");
  }
  Inflight& acc = it->second;
  ChunkSum out;
  out.index = chunk;
  out.excused = acc.excused;
  unpark_held(acc, chunk);
  judge_held(acc, chunk, out);
  if (acc.combiner || acc.replay.file) {
    Combined c = combiner_of(acc, chunk).finish();
    combined_into(acc, c, chunk, out);
  }
  inflight_.erase(it);
  taken_[chunk] = true;
  chunks_done_ += 1;
  return out;
}

// Held copies (no norm bound yet) are judged together, in slot order, so
// the result does not depend on the order they came in.
void RoundAccumulator::judge_held(Inflight& acc, uint32_t chunk, ChunkSum& out) {
  if (acc.held.empty()) return;
  std::sort(acc.held.begin(), acc.held.end(),
            [](const HeldCopy& a, const HeldCopy& b) { return a.slot < b.slot; });
  // Suspects (over a bound the history set) and copies held for want of
  // history never share a chunk: a chunk's bound is the same all round.
  std::vector<CopyVerdict> verdicts = acc.held.front().bound > 0
                                          ? screen_.judge_suspects(acc.held, acc.valued)
                                          : screen_.judge_held(acc.held);
  for (size_t i = 0; i < acc.held.size(); ++i) {
    HeldCopy& h = acc.held[i];
    CopyVerdict& v = verdicts[i];
    if (v.verdict != Verdict::kRefused) {
      combiner_of(acc, chunk).add(h.slot, h.values.data(), h.weight);
      acc.added.emplace_back(h.slot, h.weight);
      screen_.remember(round_, chunk, v.verdict == Verdict::kClipped ? v.bound : v.norm);
    }
    if (v.verdict == Verdict::kRefused) out.excused += h.weight;
    out.late.push_back({children_.at(h.slot), h.weight, std::move(v)});
  }
  acc.held.clear();
}

void RoundAccumulator::combined_into(const Inflight& acc, Combined& c, uint32_t chunk,
                                     ChunkSum& out) const {
  if (c.values.size() != plan_.size(chunk)) {
    FEDWAN_THROW(Error, "aggregation rule '" + rule_->name() + "' made " +
                            std::to_string(c.values.size()) + " values for chunk " +
                            std::to_string(chunk) + " of " + std::to_string(plan_.size(chunk)));
  }
  if (!(c.weight > 0)) {
    FEDWAN_THROW(Error, "aggregation rule '" + rule_->name() + "' left no copy of chunk " +
                            std::to_string(chunk) + " standing behind its values");
  }
  // One vector pass: an Inf or NaN has the largest magnitude bits of all.
  if (kernels::half_kernels().max_abs_bits(c.values.data(), nullptr, c.values.size()) >=
      kernels::kF32ExpMask) {
    // Finite copies whose combination overflows fp32: possible only with
    // max_abs off (docs/security.md, "Robust aggregation").
    const std::string where = "chunk " + std::to_string(chunk) + " of round " +
                              std::to_string(round_) + ": the '" + rule_->name() + "' rule";
    if (screen_.config().max_abs > 0) {
      throw Error(where + " made a non-finite value from finite copies within max_abs");
    }
    throw Error(where + "'s result is not finite although every copy was: a child sent values "
                        "so large their combination overflows fp32 (federation.aggregation."
                        "max_abs bounds them; it is off in this topology)");
  }
  for (LeftOut& l : c.left_out) {
    CopyVerdict v;
    v.verdict = Verdict::kRefused;
    v.reason = "left out by the " + rule_->name() + " rule: " + l.reason;
    double w = 0;
    for (const auto& [slot, weight] : acc.added) {
      if (slot == l.slot) w = weight;
    }
    out.excused += w;
    out.late.push_back({children_.at(l.slot), w, std::move(v)});
  }
  for (const auto& [slot, weight] : acc.added) {
    bool left = false;
    for (const LeftOut& l : c.left_out) left = left || l.slot == slot;
    if (!left) out.behind.push_back(children_.at(slot));
  }
  std::sort(out.behind.begin(), out.behind.end());
  out.mean = std::move(c.values);
  out.weight = c.weight;
}

std::vector<uint32_t> RoundAccumulator::missing_children() const {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (!open_ || (expected_[i] && delivered_[i] < plan_.count())) out.push_back(children_[i]);
  }
  return out;
}

std::vector<uint32_t> RoundAccumulator::owing_children() const {
  std::vector<uint32_t> out;
  if (!open_) return out;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (!expected_[i]) continue;
    for (uint32_t c = 0; c < plan_.count(); ++c) {
      if (!taken_[c] && !seen_[i][c]) {
        out.push_back(children_[i]);
        break;
      }
    }
  }
  return out;
}

std::vector<uint32_t> RoundAccumulator::short_chunks() const {
  std::vector<uint32_t> out;
  if (!open_) return out;
  for (uint32_t c = 0; c < plan_.count(); ++c) {
    if (taken_[c]) continue;
    const auto it = inflight_.find(c);
    if (it == inflight_.end() || it->second.weight < min_weight_) {
      out.push_back(c);
    }
  }
  return out;
}

void finalize_mean(float* sum, size_t n, double weight) {
  const float w = static_cast<float>(weight);
  size_t i = 0;
#if defined(__x86_64__)
  // Division is correctly rounded in every lane: the same values as the
  // scalar loop, eight at a time.
  if (cpu_has_avx2()) i = divide_avx2(sum, n, w);
#endif
  for (; i < n; ++i) sum[i] = sum[i] / w;
}

}  // namespace fedwan::aggregation
