// How far ahead of the slowest of its children an aggregator lets each site
// child's update run (docs/protocol.md, "Pacing"). Chunk i of a round can
// close only once every expected child delivered it; a site a whole update
// ahead of another has each of its chunks wait at the aggregator for the
// other's copy, beyond the in-flight budget on disk (parked, then read back).
// So the aggregator tells each site how many chunks of the open round it may
// have sent: `window` past the fewest any child still owing has delivered,
// the whole round once no other child owes anything. The laggard itself
// always has `window` chunks of room past what it delivered. A site that
// ignores it is parked as before; a site over a long link does not wait
// (site_sync.cpp), where an idle link costs more than a parked chunk.
// Pure: no sockets, no clocks. Not thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fedwan::aggregator {

class UplinkPacer {
 public:
  // `window`: chunks a site may run ahead of the slowest owing child (at
  // least 2: the allowance moves every window / 2 chunks).
  explicit UplinkPacer(uint32_t window = 4);

  // One child as the open round sees it.
  struct Progress {
    uint32_t slot = 0;       // the caller's index for the child
    uint32_t delivered = 0;  // chunks of the round it delivered
    bool owing = false;      // expected, and owes chunks not yet closed
    bool paced = false;      // a live site: it is told its allowance
  };
  // An allowance to tell a child.
  struct Grant {
    uint32_t slot = 0;
    uint32_t allowed = 0;  // chunks of the round it may have sent
  };

  // A round of `chunk_count` chunks opened for `slots` children: every
  // allowance starts untold.
  void open(uint64_t round, uint32_t chunk_count, size_t slots);
  uint64_t round() const { return round_; }
  bool is_open() const { return open_; }
  // The allowances that moved enough to be told (the first of a round
  // always, then every window / 2 chunks, and the whole round once no other
  // child owes), given every child's progress.
  std::vector<Grant> update(const std::vector<Progress>& children);
  // The whole round for every child told less (a deadline, the round's
  // end): what to tell them.
  std::vector<Grant> lift();
  // The allowance last told `slot` (0: none this round).
  uint32_t told(uint32_t slot) const { return slot < told_.size() ? told_[slot] : 0; }
  uint32_t window() const { return window_; }

 private:
  uint32_t window_;
  uint64_t round_ = 0;
  bool open_ = false;
  uint32_t count_ = 0;
  std::vector<uint32_t> told_;  // by slot
};

}  // namespace fedwan::aggregator
