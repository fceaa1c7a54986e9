// An aggregator's child table: its children (aggregator/child.hpp) in the
// order of its downlink's slots (aggregator/downlink.hpp), with the
// questions the membership asks of them (docs/operations.md, "Membership"):
// the members' weight and sites (the quorum's base), the live regions
// below, the members that have not confirmed the final model, and whether a
// site may pause now (outside its participation windows, with some slack
// for the two clocks). Vector-like access keeps the table's users plain
// loops. Pure: no sockets, no clocks (callers pass the time); unit-tested
// (tests/unit/aggregator/test_child_table.cpp). Not thread safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aggregator/child.hpp"
#include "topology/participation_window.hpp"

namespace fedwan::aggregator {

class ChildTable {
 public:
  using iterator = std::vector<Child>::iterator;
  using const_iterator = std::vector<Child>::const_iterator;

  // Within this long of a window's end a pause is taken: the site's clock
  // and the aggregator's may differ that much.
  static constexpr std::chrono::seconds kPauseClockSlack{300};

  iterator begin() { return children_.begin(); }
  iterator end() { return children_.end(); }
  const_iterator begin() const { return children_.begin(); }
  const_iterator end() const { return children_.end(); }
  size_t size() const { return children_.size(); }
  bool empty() const { return children_.empty(); }
  Child& operator[](size_t slot) { return children_[slot]; }
  const Child& operator[](size_t slot) const { return children_[slot]; }
  Child& back() { return children_.back(); }
  const Child& back() const { return children_.back(); }
  void push_back(Child c) { children_.push_back(std::move(c)); }
  // The child with topology index (wire sender id) `index`, or null.
  Child* by_index(uint32_t index) {
    for (Child& c : children_) {
      if (c.index == index) return &c;
    }
    return nullptr;
  }

  // The members' weight (the quorum's base): a site's topology weight, a
  // region's members' weight as it reported; non-members count nothing.
  double member_weight() const;
  // The member sites: a site is one, a region what it reported.
  uint32_t member_sites() const;
  // Region children that are live.
  uint32_t live_regions() const;
  // The ids, in slot order and joined by ", ", of the members that have not
  // confirmed the final model ("" when none).
  std::string unconfirmed_members() const;

  static const char* away_name(Away a);
  // Why `c`, whose participation windows are `windows`, may not pause at
  // `now_unix_s` (UTC), or nullopt: a pause is refused with no windows
  // declared, and inside a window unless within kPauseClockSlack of its end.
  static std::optional<std::string> pause_refusal(const Child& c,
                                                  const topology::ParticipationWindows& windows,
                                                  int64_t now_unix_s);

 private:
  std::vector<Child> children_;
};

}  // namespace fedwan::aggregator
