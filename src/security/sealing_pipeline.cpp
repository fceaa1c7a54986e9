#include "security/sealing_pipeline.hpp"

#include <utility>

#include "fedwan/error.hpp"

namespace fedwan::security {

SealingPipeline::SealingPipeline(FrameSealer& sealer, size_t depth)
    : sealer_(sealer), depth_(depth) {
  if (depth_ == 0) throw ConfigError("SealingPipeline: depth must be at least 1");
  worker_ = std::thread([this] { work(); });
}

SealingPipeline::~SealingPipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void SealingPipeline::submit(std::vector<uint8_t> frame) {
  push(Item{std::move(frame), nullptr, false});
}

void SealingPipeline::submit(std::shared_ptr<const std::vector<uint8_t>> frame) {
  if (!frame) throw ProtocolError("SealingPipeline::submit: no frame");
  push(Item{{}, std::move(frame), false});
}

void SealingPipeline::push(Item item) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return items_.size() < depth_ || error_ != nullptr; });
  if (error_) std::rethrow_exception(error_);
  items_.push_back(std::move(item));
  lock.unlock();
  cv_.notify_all();
}

bool SealingPipeline::next(std::vector<uint8_t>* sealed, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (items_.empty()) return false;
  // After a failure the worker stops at the failed frame, which then heads
  // the queue once the frames sealed before it have been taken.
  const bool ready =
      cv_.wait_for(lock, timeout, [&] { return items_.front().sealed || error_ != nullptr; });
  if (!ready) return false;
  if (!items_.front().sealed) std::rethrow_exception(error_);
  *sealed = std::move(items_.front().bytes);
  items_.pop_front();
  --next_to_seal_;
  lock.unlock();
  cv_.notify_all();
  return true;
}

size_t SealingPipeline::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

// The frame is moved out of the queue while it is sealed so the owner can
// queue and take other frames meanwhile. Its slot is found again through
// next_to_seal_: the owner only pops sealed frames from the front (and
// decrements next_to_seal_ when it does) and only appends at the back.
void SealingPipeline::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || next_to_seal_ < items_.size(); });
    if (stop_) return;
    std::vector<uint8_t> frame = std::move(items_[next_to_seal_].bytes);
    std::shared_ptr<const std::vector<uint8_t>> kept = std::move(items_[next_to_seal_].kept);
    lock.unlock();
    std::exception_ptr error;
    try {
      if (kept) {
        frame = sealer_.sealed(*kept);
      } else {
        sealer_.seal(frame);
      }
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    items_[next_to_seal_].bytes = std::move(frame);
    if (error) {
      // Sequence numbers must follow submission order, so nothing after a
      // failed frame may be sealed: the pipeline stays failed.
      error_ = error;
      cv_.notify_all();
      return;
    }
    items_[next_to_seal_].sealed = true;
    ++next_to_seal_;
    cv_.notify_all();
  }
}

}  // namespace fedwan::security
