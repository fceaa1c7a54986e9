#include "aggregator/child_table.hpp"

#include <cstdint>
#include <optional>
#include <string>

#include "topology/participation_window.hpp"

namespace fedwan::aggregator {

const char* ChildTable::away_name(Away a) {
  switch (a) {
    case Away::kNo: return "member";
    case Away::kLeft: return "left";
    case Away::kPaused: return "paused";
    case Away::kNotYet: return "not_joined";
  }
  return "unknown";
}

double ChildTable::member_weight() const {
  double w = 0;
  for (const Child& c : children_) {
    if (c.member) w += c.is_site ? c.weight : c.member_weight;
  }
  return w;
}

uint32_t ChildTable::member_sites() const {
  uint32_t n = 0;
  for (const Child& c : children_) {
    if (c.member) n += c.is_site ? 1 : c.member_sites;
  }
  return n;
}

uint32_t ChildTable::live_regions() const {
  uint32_t n = 0;
  for (const Child& c : children_) n += (!c.is_site && c.live) ? 1 : 0;
  return n;
}

std::string ChildTable::unconfirmed_members() const {
  std::string missing;
  for (const Child& c : children_) {
    // Children that left or paused hold no final model to confirm.
    if (!c.confirmed_end && c.member) missing += (missing.empty() ? "" : ", ") + c.id;
  }
  return missing;
}

std::optional<std::string> ChildTable::pause_refusal(const Child& c,
                                                     const topology::ParticipationWindows& windows,
                                                     int64_t now_unix_s) {
  // A pause excuses a site from the quorum only outside the windows its
  // topology entry declares; within kPauseClockSlack of a window's end it
  // is taken (the two clocks may differ that much).
  const int64_t now = now_unix_s;
  if (!windows.always() &&
      (!windows.open_at(now) || windows.seconds_until_closed(now) <= kPauseClockSlack.count())) {
    return std::nullopt;
  }
  return windows.always()
             ? "'" + c.id + "' declares no participation windows (it takes part at all times)"
             : "'" + c.id + "' is inside its participation window for " +
                   std::to_string(windows.seconds_until_closed(now)) + " s more";
}

}  // namespace fedwan::aggregator
