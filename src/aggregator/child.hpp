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
};

}  // namespace fedwan::aggregator
