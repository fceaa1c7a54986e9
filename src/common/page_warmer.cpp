#include "common/page_warmer.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "common/log.hpp"

namespace fedwan {
namespace {

constexpr size_t kPiece = size_t{64} << 20;

}  // namespace

PageWarmer::PageWarmer(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return;
  state_ = std::make_unique<State>();
  State* s = state_.get();
  // madvise takes a page-aligned start; the range's own pages are those
  // from the page it starts in.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(data) / page * page;
  const size_t span = reinterpret_cast<uintptr_t>(data) + bytes - first;
  s->thread = std::thread([s, first, span] {
    pthread_setname_np(pthread_self(), "fedwan-warm");
#ifdef MADV_POPULATE_WRITE
    for (size_t off = 0; off < span && !s->stop.load(); off += kPiece) {
      const size_t n = std::min(kPiece, span - off);
      // NOLINTNEXTLINE(performance-no-int-to-ptr): the range's own address
      if (::madvise(reinterpret_cast<void*>(first + off), n, MADV_POPULATE_WRITE) != 0) {
        // EINVAL: a kernel before 5.14; ENOMEM: no memory for them now.
        // The pages then come as they are written.
        log().debug("pages not warmed ahead ({} of {} bytes done): errno {}", off, span, errno);
        break;
      }
      s->warmed.fetch_add(n);
    }
#endif
    s->done.store(true);
  });
}

PageWarmer& PageWarmer::operator=(PageWarmer&& o) noexcept {
  if (this != &o) {
    stop();
    state_ = std::move(o.state_);
  }
  return *this;
}

void PageWarmer::stop() {
  if (state_ == nullptr) return;
  state_->stop.store(true);
  if (state_->thread.joinable()) state_->thread.join();
  state_.reset();
}

}  // namespace fedwan
