#include "session/update_resend.hpp"

#include <algorithm>

namespace fedwan::session {

void UpdateResend::begin(uint64_t round, Clock::time_point now) {
  round_ = round;
  active_ = true;
  delivered_ = 0;
  progress_at_ = now;
}

void UpdateResend::handed_over(Clock::time_point now) {
  progress_at_ = std::max(progress_at_, now);
}

std::vector<uint32_t> UpdateResend::on_need(uint64_t round, const wire::NeedUpdatePayload& need,
                                            Clock::time_point now) {
  if (!active_ || round != round_ || need.missing.empty()) return {};
  if (need.progress_known && need.delivered > delivered_) {
    // Still arriving: what is missing may be on its way.
    delivered_ = need.delivered;
    progress_at_ = now;
    return {};
  }
  if (now - progress_at_ <= patience_) return {};
  progress_at_ = now;  // the next resend waits another patience
  return need.missing;
}

}  // namespace fedwan::session
