#include "common/keep_alive.hpp"

#include <exception>
#include <utility>

#include "common/log.hpp"

namespace fedwan {
namespace {

thread_local KeepAlive* innermost = nullptr;

}  // namespace

KeepAlive::KeepAlive(Clock::duration period, std::function<void()> beat)
    : period_(period), beat_(std::move(beat)), due_(Clock::now() + period), outer_(innermost) {
  innermost = this;
}

KeepAlive::~KeepAlive() { innermost = outer_; }

void KeepAlive::pulse() {
  KeepAlive* k = innermost;
  if (k == nullptr) return;
  k->maybe_beat(Clock::now());
}

void KeepAlive::maybe_beat(Clock::time_point now) {
  if (beating_ || now < due_ || !beat_) return;
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
