#include "common/background_sha256.hpp"

#include <algorithm>
#include <chrono>
#include <system_error>

#include "common/keep_alive.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

constexpr size_t kPiece = 16 << 20;
// How often wait() pulses while the helpers finish: well under any
// heartbeat period.
constexpr auto kPulseEvery = std::chrono::milliseconds(20);

}  // namespace

unsigned BackgroundSha256::default_threads() {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 1 ? cores - 1 : 1;
}

BackgroundSha256::BackgroundSha256(std::vector<Range> ranges, unsigned threads)
    : ranges_(std::move(ranges)), digests_(ranges_.size()) {
  const size_t n = std::min<size_t>(threads, ranges_.size());
  helpers_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++running_;
    }
    try {
      helpers_.emplace_back([this] {
        work();
        std::lock_guard<std::mutex> lock(mu_);
        --running_;
        helper_done_.notify_all();
      });
    } catch (const std::system_error&) {
      // A thread the system would not give: those started go on, and
      // wait() takes the rest.
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
      break;
    }
  }
}

BackgroundSha256::~BackgroundSha256() {
  stop_ = true;
  for (std::thread& t : helpers_) t.join();
}

void BackgroundSha256::work() {
  try {
    for (size_t i = next_++; i < ranges_.size() && !stop_; i = next_++) {
      Sha256 hash;
      const auto* p = static_cast<const uint8_t*>(ranges_[i].data);
      size_t left = ranges_[i].size;
      while (left > 0 && !stop_) {
        const size_t k = std::min(left, kPiece);
        hash.update(p, k);
        p += k;
        left -= k;
        KeepAlive::pulse();  // on a helper, nothing
      }
      digests_[i] = hash.finish();
    }
  } catch (...) {
    stop_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
}

std::vector<Sha256Digest> BackgroundSha256::wait() {
  if (waited_) throw Error("BackgroundSha256::wait called twice");
  waited_ = true;
  work();  // what no helper has taken, pulsing between pieces
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (running_ > 0) {
      helper_done_.wait_for(lock, kPulseEvery);
      lock.unlock();
      KeepAlive::pulse();
      lock.lock();
    }
  }
  KeepAlive::pulse();
  for (std::thread& t : helpers_) t.join();
  helpers_.clear();
  if (error_) std::rethrow_exception(error_);
  return std::move(digests_);
}

}  // namespace fedwan
