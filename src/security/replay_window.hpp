// Sliding anti-replay window over 64-bit sequence numbers (as in IPsec and
// DTLS): accepts each number at most once, and numbers older than the window
// are refused. Pure bookkeeping, no I/O; not thread safe.
#pragma once

#include <cstdint>

namespace fedwan::security {

class ReplayWindow {
 public:
  static constexpr uint64_t kSize = 1024;  // numbers tracked below the highest

  enum class Verdict { kFresh, kReplay, kTooOld };

  // Verdict for `seq` without recording it (check before authenticating).
  Verdict check(uint64_t seq) const;
  // Records `seq` as seen; call only after the frame authenticated and
  // check() said kFresh.
  void accept(uint64_t seq);
  uint64_t highest() const { return highest_; }
  bool empty() const { return !any_; }

 private:
  bool any_ = false;
  uint64_t highest_ = 0;
  uint64_t bits_[kSize / 64] = {};  // bit (highest - seq) set when seen
};

}  // namespace fedwan::security
