// Threads that open received frames (decrypt and authenticate them) for a
// link's owner, so that opening frame k+1 overlaps with what the owner does
// with frame k (an aggregator: check, decode and add it), and frames from
// several children are opened on several cores. The owner detaches a frame
// (ChannelSecurity::detach), submits it here, and takes it back, opened or
// refused, in the order it submitted frames (ChildrenLink::recv).
//
// Each thread keeps a cipher of its own, rekeyed for every frame; a job
// holds its frame's bytes and its key's copy until the owner takes it back.
// Thread safety: submit(), wait() and done() from the owner's thread; the
// pool's threads touch only the jobs they run.
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

#include "transport/channel_security.hpp"

namespace fedwan::transport {

class OpeningWorkers {
 public:
  // One frame to open. The owner keeps it (and its bytes) alive until
  // done() says so, or until the pool is gone.
  struct Job {
    const DetachedFrame* frame = nullptr;
    uint8_t* data = nullptr;
    bool authenticated = false;  // valid once done
    std::exception_ptr error;    // a failure of the crypto library
   private:
    friend class OpeningWorkers;
    bool done_ = false;  // under the pool's lock
  };

  // `threads` at least 1 (0 throws ConfigError).
  explicit OpeningWorkers(size_t threads);
  // Jobs still queued are left unrun; running ones finish first.
  ~OpeningWorkers();
  OpeningWorkers(const OpeningWorkers&) = delete;
  OpeningWorkers& operator=(const OpeningWorkers&) = delete;

  void submit(Job* job);
  // Whether `job` ran; waits at most `timeout` for it.
  bool wait(const Job* job, std::chrono::milliseconds timeout);
  bool done(const Job* job) const;
  size_t threads() const { return threads_.size(); }

  // How many threads a link opens frames with by default: what
  // FEDWAN_OPENING_THREADS says (0 to kMaxThreads; anything else is a
  // ConfigError), or else one fewer than the cores this process may use, at
  // most 3 (more add nothing at the pace one owner thread takes frames),
  // none on a single core.
  static constexpr size_t kMaxThreads = 16;
  static size_t default_threads();

 private:
  void work();

  mutable std::mutex mu_;
  std::condition_variable wake_;  // a job queued, or stop
  std::condition_variable ran_;   // a job ran
  std::deque<Job*> queued_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace fedwan::transport
