#include "aggregator/uplink_pacer.hpp"

#include <algorithm>
#include <limits>

namespace fedwan::aggregator {

UplinkPacer::UplinkPacer(uint32_t window) : window_(std::max<uint32_t>(window, 2)) {}

void UplinkPacer::open(uint64_t round, uint32_t chunk_count, size_t slots) {
  round_ = round;
  open_ = true;
  count_ = chunk_count;
  told_.assign(slots, 0);
}

std::vector<UplinkPacer::Grant> UplinkPacer::update(const std::vector<Progress>& children) {
  std::vector<Grant> out;
  if (!open_) return out;
  // The fewest chunks delivered by a child still owing: the laggard's own
  // room is the window past what it delivered, the others' the same.
  uint32_t least = std::numeric_limits<uint32_t>::max();
  size_t owing = 0;
  for (const Progress& p : children) {
    if (!p.owing) continue;
    owing += 1;
    least = std::min(least, p.delivered);
  }
  const uint32_t step = window_ / 2;
  for (const Progress& p : children) {
    if (!p.paced || p.slot >= told_.size()) continue;
    // Alone in owing (or owing nothing): nobody to wait for.
    uint32_t allowed = count_;
    if (p.owing && owing > 1) {
      allowed = static_cast<uint32_t>(std::min<uint64_t>(count_, uint64_t{least} + window_));
    }
    uint32_t& told = told_[p.slot];
    const bool first = told == 0;
    if (allowed > told && (first || allowed >= told + step || allowed == count_)) {
      told = allowed;
      out.push_back({p.slot, allowed});
    }
  }
  return out;
}

std::vector<UplinkPacer::Grant> UplinkPacer::lift() {
  std::vector<Grant> out;
  if (!open_) return out;
  for (uint32_t slot = 0; slot < told_.size(); ++slot) {
    if (told_[slot] == 0 || told_[slot] >= count_) continue;
    told_[slot] = count_;
    out.push_back({slot, count_});
  }
  return out;
}

}  // namespace fedwan::aggregator
