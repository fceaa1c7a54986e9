// Takes the pages of a range of anonymous memory (a ZeroedArray's) on a
// helper thread, so that the thread which later writes them finds them
// there: the kernel's page faults and clearing (about a second a GB on a
// small VM) move off the thread whose work waits on them. A node that
// makes a model-sized buffer of zeros (an outer optimizer's momentum, the
// root's residual) serves at once and warms the buffer while it waits for
// its children, rather than clearing it before it serves, or on its loop
// in the first round.
//
// The helper asks the kernel to populate the range writable
// (madvise(MADV_POPULATE_WRITE), Linux 5.14), 64 MiB at a time, which
// never changes a value: the owner may read and write the range meanwhile.
// Where the kernel does not know the call, nothing is warmed and the pages
// come as they are written. Stopping (or destroying the warmer) waits for
// the piece under way; the range must stay mapped until then.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>

namespace fedwan {

class PageWarmer {
 public:
  PageWarmer() = default;
  // Starts warming [data, data + bytes); nothing for an empty range.
  PageWarmer(void* data, size_t bytes);
  ~PageWarmer() { stop(); }
  PageWarmer(const PageWarmer&) = delete;
  PageWarmer& operator=(const PageWarmer&) = delete;
  PageWarmer(PageWarmer&&) noexcept = default;
  PageWarmer& operator=(PageWarmer&& o) noexcept;

  // Stops at the end of the piece under way, and returns when the helper
  // has.
  void stop();
  // Returns when the helper has gone through the whole range (or given
  // up); warmed() then says how far it went.
  void wait() {
    if (state_ != nullptr && state_->thread.joinable()) state_->thread.join();
  }
  // Whether the helper has gone through the whole range (or given up).
  bool done() const { return state_ == nullptr || state_->done.load(); }
  // The bytes it asked the kernel to populate so far.
  size_t warmed() const { return state_ == nullptr ? 0 : state_->warmed.load(); }

 private:
  struct State {
    std::atomic<bool> stop{false};
    std::atomic<bool> done{false};
    std::atomic<size_t> warmed{0};
    std::thread thread;
  };
  std::unique_ptr<State> state_;
};

}  // namespace fedwan
