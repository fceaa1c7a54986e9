#include "common/keep_alive.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <future>
#include <utility>

#include "common/log.hpp"

namespace fedwan {
namespace {

thread_local KeepAlive* innermost = nullptr;

}  // namespace

KeepAlive::KeepAlive(Clock::duration period, std::function<void()> beat, Clock::duration limit)
    : period_(period),
      beat_(std::move(beat)),
      opened_(Clock::now()),
      limit_(limit),
      due_(opened_ + period),
      outer_(innermost) {
  innermost = this;
}

KeepAlive::~KeepAlive() { innermost = outer_; }

void KeepAlive::pulse() {
  KeepAlive* k = innermost;
  if (k == nullptr) return;
  k->maybe_beat(Clock::now());
}

int KeepAlive::during(const std::function<int()>& call) {
  KeepAlive* k = innermost;
  if (k == nullptr) return call();
  std::future<int> done = std::async(std::launch::async, call);
  // A quarter of the period, so that a beat is never much later than due.
  const auto poll = std::clamp<Clock::duration>(k->period_ / 4, std::chrono::milliseconds(5),
                                                std::chrono::milliseconds(250));
  while (done.wait_for(poll) != std::future_status::ready) pulse();
  return done.get();
}

void KeepAlive::copy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kPiece = 16 << 20;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  while (bytes > 0) {
    const size_t k = std::min(bytes, kPiece);
    std::memcpy(d, s, k);
    d += k;
    s += k;
    bytes -= k;
    pulse();
  }
}

void KeepAlive::maybe_beat(Clock::time_point now) {
  if (beating_ || now < due_ || !beat_ || gave_up_) return;
  if (now - opened_ > limit_) {
    gave_up_ = true;
    log().warn("busy for over {} ms: no longer saying so; its peers will take it for lost",
               std::chrono::duration_cast<std::chrono::milliseconds>(limit_).count());
    return;
  }
  beating_ = true;
  try {
    beat_();
  } catch (const std::exception& e) {
    log().debug("a heartbeat during long work did not go: {}", e.what());
  }
  beating_ = false;
  beats_ += 1;
  // From the beat's end: a beat that took long (a full socket) is not
  // followed at once by another.
  due_ = Clock::now() + period_;
}

}  // namespace fedwan
