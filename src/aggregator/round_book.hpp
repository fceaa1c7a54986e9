// The round-indexed bookkeeping of an aggregator's reports: which finished
// rounds still wait for their region children's traffic, what each region
// reported (once per child and round), and how far telemetry has gone up.
// A root reports a round once its global model is final and every live
// region reported; a region sends its telemetry up once it relayed the next
// round's anchor and every live region child reported. Pure: no sockets, no
// clocks; unit-tested (tests/unit/aggregator/test_round_book.cpp). Not
// thread safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "node/traffic.hpp"

namespace fedwan::aggregator {

class RoundBook {
 public:
  explicit RoundBook(bool is_root) : is_root_(is_root) {}

  // Root: the report of `round`, created on first use (its weight is set
  // when the round closes).
  RoundReport& report(uint64_t round) { return pending_[round].report; }
  // Root: the global model of `round` is final.
  void complete(uint64_t round) { pending_[round].complete = true; }

  // A node resumed from its checkpoint at `round` owes nothing before it.
  void resume_at(uint64_t round) { relayed_through_ = sent_through_ = round; }
  // Region: the anchor of every round < `through` has been relayed down.
  void relayed_through(uint64_t through) { relayed_through_ = through; }
  uint64_t relayed_through() const { return relayed_through_; }
  // Region: telemetry went up for every round < `through` (a region that
  // resumes or joins later owes none for the rounds before).
  void sent_through(uint64_t through) { sent_through_ = std::max(sent_through_, through); }
  uint64_t sent_through() const { return sent_through_; }

  enum class Telemetry {
    kTaken,          // counted for its round
    kNoRoundWaits,   // late or unknown: nowhere to go, dropped quietly
    kNotRelayedYet,  // region: a round whose anchor it has not relayed: refused
    kAgain,          // this child reported this round already: refused
  };
  Telemetry add_telemetry(uint64_t round, uint32_t child, const node::Traffic& t);

  // Whether `round` can be reported (root) or sent up (region) now: it
  // waits for nothing, or for `live_regions` reports, unless `force` (the
  // federation is finishing without lost children's traffic).
  bool ready(uint64_t round, uint32_t live_regions, bool force) const;
  // The federation is finishing without lost children's traffic: from now
  // on every round is ready as if forced.
  void report_without_lost() { forced_ = true; }
  bool ready(uint64_t round, uint32_t live_regions) const {
    return ready(round, live_regions, forced_);
  }
  // Takes what the round's region children reported (and forgets them).
  node::Traffic take_subtree(uint64_t round);
  // Root: takes the report of a ready round.
  RoundReport take_report(uint64_t round);

  // Rounds still owed: the root's unreported ones, a region's unsent ones.
  std::vector<uint64_t> owed() const;
  bool nothing_owed() const {
    return is_root_ ? pending_.empty() : sent_through_ >= relayed_through_;
  }

 private:
  struct Pending {
    RoundReport report;
    bool complete = false;  // the global model of the round is final
  };
  struct Subtree {
    std::vector<uint32_t> reporters;  // children that reported (each counts once)
    node::Traffic traffic;
  };

  bool is_root_;
  std::map<uint64_t, Pending> pending_;  // root
  std::map<uint64_t, Subtree> subtree_;
  uint64_t relayed_through_ = 0;  // region: anchors relayed for rounds < this
  uint64_t sent_through_ = 0;     // region: telemetry sent for rounds < this
  bool forced_ = false;           // report_without_lost()
};

}  // namespace fedwan::aggregator
