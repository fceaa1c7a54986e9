#include "security/replay_window.hpp"

namespace fedwan::security {
namespace {

constexpr uint64_t kWords = ReplayWindow::kSize / 64;
static_assert(ReplayWindow::kSize % 64 == 0, "the bitmap is whole 64-bit words");

}  // namespace

ReplayWindow::Verdict ReplayWindow::check(uint64_t seq) const {
  if (!any_ || seq > highest_) return Verdict::kFresh;
  const uint64_t d = highest_ - seq;
  if (d >= kSize) return Verdict::kTooOld;
  return (bits_[d / 64] >> (d % 64)) & 1u ? Verdict::kReplay : Verdict::kFresh;
}

void ReplayWindow::accept(uint64_t seq) {
  if (!any_ || seq > highest_) {
    // Slide: every recorded distance grows by `shift`. A shift of kSize or
    // more leaves nothing recorded; below that, whole words move by
    // shift / 64 and bits carry across words by shift % 64 (a shift by 64
    // would be undefined, hence the separate case for bit == 0).
    const uint64_t shift = any_ ? seq - highest_ : kSize;
    if (shift >= kSize) {
      for (uint64_t& w : bits_) w = 0;
    } else {
      const uint64_t words = shift / 64, bit = shift % 64;
      for (uint64_t i = kWords; i-- > 0;) {
        uint64_t w = 0;
        if (i >= words) {
          w = bits_[i - words] << bit;
          if (bit != 0 && i > words) w |= bits_[i - words - 1] >> (64 - bit);
        }
        bits_[i] = w;
      }
    }
    highest_ = seq;
    any_ = true;
    bits_[0] |= 1u;
    return;
  }
  const uint64_t d = highest_ - seq;
  // Too old to record: check() already refuses it, and stays refusing it.
  if (d >= kSize) return;
  bits_[d / 64] |= uint64_t{1} << (d % 64);
}

}  // namespace fedwan::security
