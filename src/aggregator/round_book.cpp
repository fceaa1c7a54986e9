#include "aggregator/round_book.hpp"

#include <algorithm>

namespace fedwan::aggregator {

RoundBook::Telemetry RoundBook::add_telemetry(uint64_t round, uint32_t child,
                                              const node::Traffic& t) {
  // Only a round whose report still waits takes telemetry: late telemetry of
  // a round already reported (a region that was lost) has nowhere to go,
  // and a region reports a round only after relaying the next one's anchor.
  if (is_root_ ? pending_.count(round) == 0 : round < sent_through_ || round >= relayed_through_) {
    return !is_root_ && round >= relayed_through_ ? Telemetry::kNotRelayedYet
                                                  : Telemetry::kNoRoundWaits;
  }
  Subtree& s = subtree_[round];
  if (std::find(s.reporters.begin(), s.reporters.end(), child) != s.reporters.end()) {
    return Telemetry::kAgain;
  }
  s.reporters.push_back(child);
  s.traffic += t;
  return Telemetry::kTaken;
}

bool RoundBook::ready(uint64_t round, uint32_t live_regions, bool force) const {
  if (is_root_) {
    auto rep = pending_.find(round);
    if (rep == pending_.end() || !rep->second.complete) return false;
  } else if (round >= relayed_through_ || round < sent_through_) {
    return false;
  }
  auto sub = subtree_.find(round);
  const size_t reports = sub == subtree_.end() ? 0 : sub->second.reporters.size();
  return reports >= live_regions || force;
}

node::Traffic RoundBook::take_subtree(uint64_t round) {
  node::Traffic t;
  auto sub = subtree_.find(round);
  if (sub != subtree_.end()) {
    t = sub->second.traffic;
    subtree_.erase(sub);
  }
  return t;
}

RoundReport RoundBook::take_report(uint64_t round) {
  RoundReport out;
  auto rep = pending_.find(round);
  if (rep != pending_.end()) {
    out = rep->second.report;
    pending_.erase(rep);
  }
  out.round = round;
  return out;
}

std::vector<uint64_t> RoundBook::owed() const {
  std::vector<uint64_t> rounds;
  if (is_root_) {
    for (const auto& [r, p] : pending_) rounds.push_back(r);
  } else {
    for (uint64_t r = sent_through_; r < relayed_through_; ++r) rounds.push_back(r);
  }
  return rounds;
}

}  // namespace fedwan::aggregator
