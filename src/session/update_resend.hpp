// When a child (a site, or a region for its aggregate) sends its round's
// update again, the same for both: only when its parent says it still lacks
// part of it (a heartbeat with kFlagNeedUpdate), only the chunks the parent
// names, and only once the parent's count of chunks received has stopped
// growing for `patience` (a heartbeat timeout). A slow link that still
// delivers is never mistaken for a lost update: its count keeps growing, and
// each chunk that arrives moves the point from which the patience runs. A
// parent that says nothing of progress (an empty payload) is answered with
// every chunk, once `patience` has passed since the update went out.
// Pure: no sockets, no clocks of its own. Not thread safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "wire/frame.hpp"

namespace fedwan::session {

class UpdateResend {
 public:
  using Clock = std::chrono::steady_clock;

  explicit UpdateResend(std::chrono::milliseconds patience = std::chrono::milliseconds(10000))
      : patience_(patience) {}

  // The update of `round` starts going out (progress starts from nothing).
  void begin(uint64_t round, Clock::time_point now);
  // The child handed its last chunk to the link: the patience runs from
  // here at the earliest (a transfer is not late before it is sent).
  void handed_over(Clock::time_point now);
  // A heartbeat from the parent in `round` saying `need`: the chunks to send
  // again now (ascending; empty: wait). Chunks it returns are not named again
  // before another `patience` without progress.
  std::vector<uint32_t> on_need(uint64_t round, const wire::NeedUpdatePayload& need,
                                Clock::time_point now);

 private:
  std::chrono::milliseconds patience_;
  uint64_t round_ = 0;
  bool active_ = false;
  uint32_t delivered_ = 0;  // the most the parent said it received
  Clock::time_point progress_at_;
};

}  // namespace fedwan::session
