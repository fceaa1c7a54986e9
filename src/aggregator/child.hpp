// One child of an aggregator as the aggregator sees it: who it is, whether
// it joined, is live and a member, its weight, and what came from it. The
// aggregator's child table is a vector of these in the order of its
// downlink's slots (aggregator/downlink.hpp). Plain data.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "wire/frame.hpp"

namespace fedwan::aggregator {

// Why a child is not a member (Child::away).
enum class Away : uint8_t { kNo, kLeft, kPaused, kNotYet };

struct Child {
  using Clock = std::chrono::steady_clock;

  uint32_t index = 0;
  std::string id;
  bool is_site = true;
  bool joined = false;
  bool welcomed = false;
  bool confirmed_end = false;  // said it holds the final model (kDone upward)
  wire::HelloPayload hello;
  // Liveness: heard within the heartbeat timeout. A lost child is not
  // waited for; it comes back by saying hello again.
  bool live = true;
  Clock::time_point last_heard;  // its last frame, or its welcome when later
  bool rejoin_pending = false;   // welcomed at the next round boundary
  double weight = 0;             // total site weight under it
  uint64_t elements = 0;         // the model size its hello stated
  // Membership (aggregator_membership.cpp): counted in the quorum. A
  // late_join site is not waited for at the start.
  bool late = false;
  bool member = false;
  Away away = Away::kNotYet;
  double member_weight = 0;   // a region: its members' weight as it reported (<= weight)
  uint32_t member_sites = 0;  // a region: its member sites as it reported
  // For metrics and status: what came from it, and the round it last named.
  uint64_t bytes_received = 0;
  uint64_t heartbeats = 0;
  uint64_t last_round = 0;
  // Taken out by a topology version: refused from now on.
  bool removed = false;
  // This node's verdicts on its copies (aggregation/update_screen.hpp).
  uint64_t copies_refused = 0;
  uint64_t copies_clipped = 0;
  uint64_t last_bad_round = 0;  // the last round with a copy refused or clipped
  uint32_t bad_rounds = 0;      // rounds in a row with one, up to last_bad_round
};

// A child whose copies were refused or clipped in this many rounds in a row
// is flagged (status, metrics, audit) until a round passes without.
inline constexpr uint32_t kFlagAfterBadRounds = 3;

// Counts a refused or clipped copy of `round`'s; true when the child has just
// become flagged.
inline bool note_bad_copy(Child& c, uint64_t round, bool refused) {
  (refused ? c.copies_refused : c.copies_clipped) += 1;
  if (c.bad_rounds > 0 && c.last_bad_round == round) return false;
  c.bad_rounds = c.bad_rounds > 0 && c.last_bad_round + 1 == round ? c.bad_rounds + 1 : 1;
  c.last_bad_round = round;
  return c.bad_rounds == kFlagAfterBadRounds;
}

// Flagged in `round`: the streak reaches the threshold and is not over (its
// last bad round is this one or the one before).
inline bool flagged(const Child& c, uint64_t round) {
  return c.bad_rounds >= kFlagAfterBadRounds && c.last_bad_round + 1 >= round;
}

}  // namespace fedwan::aggregator
