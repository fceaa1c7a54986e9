// Seals frames on a worker thread so the caller can encode the next chunk
// while the previous one is encrypted: encode and encrypt overlap, and a
// sender runs at the speed of the slower of the two rather than their sum.
// Frames come out sealed in submission order (sequence numbers follow it).
//
// Thread safety: one owner calls submit() and next(); a producer thread
// calling submit() and a consumer thread calling next() also works, and
// in_flight() may be called from anywhere. A single owner thread must take a
// frame with next() whenever in_flight() == depth, because submit() into a
// full pipeline waits for a next() that only another thread could make. The
// sealer is used only by the worker while the pipeline lives. A sealing
// failure is final: frames sealed before it still come out of next() in
// order, then next() and submit() rethrow it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "security/frame_protector.hpp"

namespace fedwan::security {

class SealingPipeline {
 public:
  // At most `depth` frames are queued or sealed-but-not-taken at once;
  // depth 0 throws ConfigError. Starts the worker thread.
  explicit SealingPipeline(FrameSealer& sealer, size_t depth = 2);
  ~SealingPipeline();  // stops the worker; frames not taken are dropped
  SealingPipeline(const SealingPipeline&) = delete;
  SealingPipeline& operator=(const SealingPipeline&) = delete;

  // Queues a frame for sealing; blocks while `depth` frames are in the
  // pipeline (the caller should take finished ones with next()). Rethrows
  // an earlier sealing failure instead of queueing.
  void submit(std::vector<uint8_t> frame);
  // The same for a frame the caller keeps (for resends): it is sealed across
  // into new bytes and left as it is; the pipeline holds a reference until
  // then.
  void submit(std::shared_ptr<const std::vector<uint8_t>> frame);
  // Takes the oldest frame once sealed; blocks at most `timeout`. Returns
  // false on timeout or when nothing is in the pipeline. Rethrows the
  // worker's exception (a sealing failure) here.
  bool next(std::vector<uint8_t>* sealed, std::chrono::milliseconds timeout);
  size_t in_flight() const;
  size_t depth() const { return depth_; }

 private:
  void work();

  FrameSealer& sealer_;
  const size_t depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Item {
    std::vector<uint8_t> bytes;  // the frame, sealed in place; or the sealed copy of `kept`
    std::shared_ptr<const std::vector<uint8_t>> kept;
    bool sealed = false;
  };
  void push(Item item);
  std::deque<Item> items_;
  size_t next_to_seal_ = 0;  // index into items_ of the first unsealed frame
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace fedwan::security
