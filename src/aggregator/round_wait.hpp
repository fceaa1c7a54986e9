// What an open round is waiting for, judged from its accumulator and the
// members it does not expect right now (docs/operations.md, "Quorum and
// deadlines"). A chunk is ready once every expected child delivered it and
// its weight reaches the quorum; so once no expected child owes anything,
// the round either closes at once or needs weight that only absent members
// (lost, or welcomed back at a boundary) can bring:
//   * kDeliveries: expected children still owe chunks (they are named);
//   * kAbsentMembers: nothing is owed, the quorum needs the weight of
//     absent members, and together they could bring it: the round waits for
//     them to rejoin, up to the round timeout (they are named, with why);
//   * kNever: nothing is owed and no member that could still come brings
//     enough weight: the round can never close (`reason` says why);
//   * kNothing: the round is complete or has chunks ready to close.
// The "still waiting for" list is therefore never empty while a round waits.
// Also whether the round's last anchor chunk waits for the root's standby.
// Pure: no sockets, no clocks; unit-tested
// (tests/unit/aggregator/test_round_wait.cpp). Not thread safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "aggregation/round_accumulator.hpp"

namespace fedwan::aggregator {

// A member of the federation that the open round does not expect now but
// that may still deliver to it (it rejoins and is welcomed mid-round).
struct AbsentMember {
  uint32_t index = 0;  // wire id, as in the accumulator
  std::string id;
  double weight = 0;  // what it would add to each chunk
  std::string why;    // "lost", "rejoining", ...
};

struct RoundWait {
  enum class State { kNothing, kDeliveries, kAbsentMembers, kNever };
  State state = State::kNothing;
  // What the round waits for, one entry per child: "site-0", or
  // "site-1 (lost; its weight is needed for quorum 1)". Empty only for
  // kNothing and kNever.
  std::vector<std::string> waiting_for;
  std::string reason;  // kNever: why the round cannot close
};

// `name(index)` gives a child's id; `quorum` is the share of the members'
// weight a chunk needs (for the messages; the accumulator's minimum weight
// decides).
RoundWait judge_round_wait(const aggregation::RoundAccumulator& acc,
                           const std::vector<AbsentMember>& absent, double quorum,
                           const std::function<std::string(uint32_t)>& name);

// "a, b, c".
std::string join_names(const std::vector<std::string>& names);

// The root's standby as a round's last anchor chunk sees it: the chunk
// leaves once a standby it waits for holds the round's checkpoint.
struct StandbyLink {
  using Clock = std::chrono::steady_clock;
  bool linked = false;            // a standby is configured and a link to it is open
  bool seen = false;              // it answered on this link
  bool warned = false;            // it was found missing and has not answered since
  Clock::time_point heard;        // its last frame
  Clock::time_point link_opened;  // when this link was opened
};

// Live: it answered on this link within `timeout`.
bool standby_live(const StandbyLink& s, StandbyLink::Clock::time_point now,
                  StandbyLink::Clock::duration timeout);
// Waited for: live, or, until it is first found missing, linked less than
// `timeout` ago and silent so far (a root started beside its standby, or
// before it, commits no round that the standby does not hold).
bool standby_awaited(const StandbyLink& s, StandbyLink::Clock::time_point now,
                     StandbyLink::Clock::duration timeout);

}  // namespace fedwan::aggregator
