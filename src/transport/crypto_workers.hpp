// Threads that do a link's cryptography beside its owner's thread. They
// open received frames (decrypt and authenticate them), so that opening
// frame k+1 overlaps with what the owner does with frame k (an aggregator:
// check, decode and add it) and frames from several children are opened on
// several cores: the owner detaches a frame (ChannelSecurity::detach),
// submits it here, and takes it back, opened or refused, in the order it
// submitted frames (ChildrenLink::recv), with what the owner's
// FrameInspector worked out from its opened bytes. And they seal: the frames of one
// turn for several children (each its own sealer) at once
// (ChildrenLink::seal_ahead). And the owner's own work split in parts
// (run_parts: the root's commit of a chunk).
//
// Each thread keeps a cipher of its own for opening, rekeyed for every
// frame; a job holds its frame's bytes and its key's copy until the owner
// takes it back. Thread safety: submit(), wait() and done() from the
// owner's thread; the pool's threads touch only the jobs they run.
#pragma once

#include <any>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/channel_security.hpp"

namespace fedwan::transport {

// What an owner works out from a frame's opened bytes on the thread that
// opened it, while they are in its cache (a digest, a check of the
// payload): a pure function of the bytes, run on any of the threads, at
// once on several frames. Its answer goes back with the frame
// (Incoming::inspected); an empty one, or one it threw, is none, and the
// owner works it out itself. The frame may yet be refused after it ran.
using FrameInspector = std::function<std::any(const uint8_t* frame, size_t size)>;

class CryptoWorkers {
 public:
  // One frame to open (`frame` and `data`), or any other `task`. The owner
  // keeps it (and its bytes) alive until done() says so, or until the pool
  // is gone.
  struct Job {
    const DetachedFrame* frame = nullptr;
    uint8_t* data = nullptr;
    const FrameInspector* inspect = nullptr;  // run on the frame once it verified
    std::function<void()> task;               // run instead, when set
    bool authenticated = false;               // valid once done
    std::any inspected;                       // what `inspect` answered, once done
    std::exception_ptr error;  // what the job threw (a failure of the crypto library)
   private:
    friend class CryptoWorkers;
    bool done_ = false;  // under the pool's lock
  };

  // `threads` at least 1 (0 throws ConfigError).
  explicit CryptoWorkers(size_t threads);
  // Jobs still queued are left unrun; running ones finish first.
  ~CryptoWorkers();
  CryptoWorkers(const CryptoWorkers&) = delete;
  CryptoWorkers& operator=(const CryptoWorkers&) = delete;

  void submit(Job* job);
  // Runs fn(0) .. fn(parts - 1), each once, on this thread and the pool's,
  // and returns when every one ran; rethrows the exception of the first
  // part (in part order) that threw. The parts go ahead of the frames
  // queued to be opened (the owner waits for them), and a part no thread
  // has started by the time this thread is free runs here: the owner never
  // waits for a thread busy elsewhere. The parts must be independent.
  void run_parts(size_t parts, const std::function<void(size_t)>& fn);
  // Whether `job` ran; waits at most `timeout` for it.
  bool wait(const Job* job, std::chrono::milliseconds timeout);
  bool done(const Job* job) const;
  size_t threads() const { return threads_.size(); }

  // How many threads a link has by default: what
  // FEDWAN_CRYPTO_THREADS says (0 to kMaxThreads; anything else is a
  // ConfigError), or else one fewer than the cores this process may use, at
  // most 3 (more add nothing at the pace one owner thread takes frames),
  // none on a single core.
  static constexpr size_t kMaxThreads = 16;
  static size_t default_threads();

 private:
  void work();
  // The job's inspector on its opened frame; none when it threw.
  static std::any inspect(const Job& job);

  mutable std::mutex mu_;
  std::condition_variable wake_;  // a job queued, or stop
  std::condition_variable ran_;   // a job ran
  std::deque<Job*> queued_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace fedwan::transport
