// SHA-256 of several byte ranges on helper threads while the caller does
// other work with the same bytes: a checkpoint writer hashes the sections
// it holds in memory while it writes them, so that writing one takes the
// longer of the disk's time and the hash's (SHA-256 and a direct write run
// at about the same 2 GB/s on a small VM), not their sum; and where there
// are more cores, sections are hashed side by side.
//
// Each range goes to one thread (a range's digest is sequential), in the
// order given; wait() takes on this thread what no helper has started, so
// no range waits for a helper that is busy. Ranges are hashed in pieces of
// 16 MiB: stopping (an error, the destructor) waits for at most one piece.
//
// Thread safety: one owner. The ranges' bytes must stay unchanged, and
// mapped, until wait() returns or the hasher is destroyed; they are only
// read, so the owner may read them meanwhile.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/sha256.hpp"

namespace fedwan {

class BackgroundSha256 {
 public:
  struct Range {
    const void* data = nullptr;
    size_t size = 0;
  };

  // Starts hashing `ranges` on min(threads, ranges.size()) helpers; none
  // for no ranges or threads == 0 (wait() then hashes them all).
  explicit BackgroundSha256(std::vector<Range> ranges, unsigned threads = default_threads());
  // Stops the helpers at the end of their pieces and joins them.
  ~BackgroundSha256();
  BackgroundSha256(const BackgroundSha256&) = delete;
  BackgroundSha256& operator=(const BackgroundSha256&) = delete;

  // Hashes here what no helper has taken, then waits for the helpers,
  // pulsing this thread's KeepAlive meanwhile (common/keep_alive.hpp).
  // Returns the digests in the ranges' order; throws what a helper threw
  // (a CryptoError from OpenSSL). Once only.
  std::vector<Sha256Digest> wait();

  // One fewer than the cores (the caller's thread has its own work), at
  // least one.
  static unsigned default_threads();
  // Ranges smaller than this are cheaper hashed on the caller's thread than
  // handed to a helper.
  static constexpr size_t kWorthFrom = size_t{4} << 20;

 private:
  // Takes ranges until none is left or stop is set.
  void work();

  std::vector<Range> ranges_;
  std::vector<Sha256Digest> digests_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable helper_done_;
  unsigned running_ = 0;      // helpers not yet out of work(); under mu_
  std::exception_ptr error_;  // the first failure; under mu_
  std::vector<std::thread> helpers_;
  bool waited_ = false;
};

}  // namespace fedwan
