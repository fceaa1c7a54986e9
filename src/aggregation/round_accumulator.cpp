#include "aggregation/round_accumulator.hpp"

#include <algorithm>
#include <utility>

#include "fedwan/error.hpp"

namespace fedwan::aggregation {

const char* add_outcome_name(AddOutcome o) {
  switch (o) {
    case AddOutcome::kAccepted: return "accepted";
    case AddOutcome::kDuplicate: return "duplicate";
    case AddOutcome::kStale: return "stale";
    case AddOutcome::kFuture: return "future";
    case AddOutcome::kUnknownSender: return "unknown-sender";
    case AddOutcome::kBadChunk: return "bad-chunk";
    case AddOutcome::kBadPayload: return "bad-payload";
  }
  return "?";
}

RoundAccumulator::RoundAccumulator(tensor::ChunkPlan plan, std::vector<uint32_t> children,
                                   std::shared_ptr<const AggregationRule> rule)
    : plan_(plan),
      children_(std::move(children)),
      rule_(rule ? std::move(rule) : make_rule(kWeightedMean)) {
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
  taken_.assign(plan_.count(), false);
  chunks_done_ = 0;
}

void RoundAccumulator::add_child(uint32_t sender) {
  if (child_slot(sender) >= 0) return;
  children_.push_back(sender);
  if (!open_) return;  // open() sizes the per-round state
  expected_.push_back(false);
  seen_.emplace_back(plan_.count(), false);
  delivered_.push_back(0);
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
                                               size_t bytes) {
  const int slot = child_slot(sender);
  if (slot < 0) return {AddOutcome::kUnknownSender};
  if (!open_ || round > round_) return {AddOutcome::kFuture};
  if (round < round_) return {AddOutcome::kStale};
  if (chunk >= plan_.count() || element_count != plan_.size(chunk)) return {AddOutcome::kBadChunk};
  if (seen_[slot][chunk]) return {AddOutcome::kDuplicate};
  if (taken_[chunk]) return {AddOutcome::kStale};  // closed without this child
  if (!(weight > 0) || weight != weight || weight > 1e300) return {AddOutcome::kBadPayload};
  // Validate before touching the accumulator: a bad payload must leave no trace.
  if (!codec.validate(payload, bytes, element_count)) return {AddOutcome::kBadPayload};

  Inflight& acc = inflight_[chunk];
  if (!acc.combiner) acc.combiner = rule_->begin_chunk(element_count, children_.size());
  acc.combiner->add(static_cast<uint32_t>(slot), codec, payload, bytes, weight);
  acc.weight += weight;
  acc.arrivals += 1;
  seen_[slot][chunk] = true;
  delivered_[slot] += 1;
  return {AddOutcome::kAccepted, chunk_ready(chunk)};
}

bool RoundAccumulator::chunk_ready(uint32_t chunk) const {
  if (taken_[chunk]) return false;
  auto it = inflight_.find(chunk);
  if (it == inflight_.end() || it->second.weight < min_weight_) return false;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (expected_[i] && !seen_[i][chunk]) return false;
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
    if (!taken_[chunk] && acc.arrivals > 0 && acc.weight >= min_weight_) out.push_back(chunk);
  }
  std::sort(out.begin(), out.end());
  return out;
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
  if (it == inflight_.end() || it->second.arrivals == 0 || taken_.at(chunk)) {
    FEDWAN_THROW(Error, "chunk " + std::to_string(chunk) + " has nothing to take");
  }
  ChunkSum out;
  out.index = chunk;
  out.weight = it->second.weight;
  out.mean = it->second.combiner->finish(out.weight);
  if (out.mean.size() != plan_.size(chunk)) {
    FEDWAN_THROW(Error, "aggregation rule '" + rule_->name() + "' made " +
                            std::to_string(out.mean.size()) + " values for chunk " +
                            std::to_string(chunk) + " of " + std::to_string(plan_.size(chunk)));
  }
  inflight_.erase(it);
  taken_[chunk] = true;
  chunks_done_ += 1;
  return out;
}

size_t RoundAccumulator::bytes_in_flight() const {
  size_t total = 0;
  for (const auto& entry : inflight_) total += entry.second.combiner->bytes_held();
  return total;
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
    if (it == inflight_.end() || it->second.arrivals == 0 || it->second.weight < min_weight_) {
      out.push_back(c);
    }
  }
  return out;
}

void finalize_mean(float* sum, size_t n, double weight) {
  const float w = static_cast<float>(weight);
  for (size_t i = 0; i < n; ++i) sum[i] = sum[i] / w;
}

}  // namespace fedwan::aggregation
