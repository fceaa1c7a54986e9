// Large byte buffers used again instead of allocated afresh: a frame of a
// chunk (hundreds of KiB) made new for every chunk is zero-filled by the
// allocator and, since glibc hands freed blocks of that size back to the
// kernel, faulted in page by page again (the kernel zeroing each page once
// more). The buffers a node frees (a frame once it is sealed and sent) are
// kept here, a few at a time, and the next frame of a round is written
// into one of them. Thread safe: zmq's I/O thread gives back what the node's
// thread took.
//
// The process's pool keeps nothing until something allows it. A site
// does (SiteCore), where the frames of its update are made: where they
// stay in memory for resends, as many buffers as its update has frames, so
// each round writes into the pages the last one faulted in; those for as
// long as the site lives (a Lease), eight of its sealed frames for the
// process (a little over 4 MiB for fp16 at the default 1 MiB chunk). An aggregator
// does not: what the pool holds would count against the memory bound its
// role keeps (docs/architecture.md), and buffers kept at the top of the
// heap keep the allocator from handing back the freed memory below them
// (with eight, 4 MiB, the demo's regions peaked at 644 MiB, over their
// 636 MiB bound at 100M parameters: docs/benchmarks.md).
//
// A buffer taken holds whatever it held before: the caller writes every
// byte of it (a frame's header, then its payload: every codec writes all
// of its encoded_size bytes), so nothing of an earlier frame goes out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace fedwan {

class BytePool {
 public:
  struct Options {
    size_t max_buffers = 8;              // kept at most...
    size_t max_bytes = size_t{4} << 20;  // ...holding at most this many bytes
    size_t min_size = size_t{64} << 10;  // smaller ones are not worth keeping
  };

  BytePool() : BytePool(Options{}) {}
  explicit BytePool(Options o);
  BytePool(const BytePool&) = delete;
  BytePool& operator=(const BytePool&) = delete;

  // The process's pool: keeps nothing until allow() is called.
  static BytePool& shared();

  // Lets the pool keep up to this many buffers and bytes (it never keeps
  // less than it was allowed before).
  void allow(size_t max_buffers, size_t max_bytes);

  // The same for as long as the returned lease lives: the pool keeps the
  // most that allow() or any live lease lets it, and when a lease ends,
  // frees what it keeps beyond what is still allowed (a site's frames do
  // not outlive the site). Leases of one pool may end on any thread; none
  // may outlive its pool (the process's never goes).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : pool_(o.pool_), id_(o.id_) { o.pool_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { end(); }
    void end() noexcept;

   private:
    friend class BytePool;
    Lease(BytePool* pool, uint64_t id) : pool_(pool), id_(id) {}
    BytePool* pool_ = nullptr;
    uint64_t id_ = 0;
  };
  [[nodiscard]] Lease lease(size_t max_buffers, size_t max_bytes);

  // `size` bytes, their contents unspecified: a kept buffer when one is
  // large enough (the smallest such), otherwise a new one.
  std::vector<uint8_t> take(size_t size);
  // The same, owned by a shared pointer that gives the buffer back when
  // its last holder lets go (a frame kept for resends and sealed).
  std::shared_ptr<std::vector<uint8_t>> take_shared(size_t size);
  // Keeps `bytes` for a later take if it is large enough and there is room;
  // otherwise it is freed.
  void give(std::vector<uint8_t>&& bytes) noexcept;

  size_t kept_buffers() const;
  size_t kept_bytes() const;

 private:
  void end_lease(uint64_t id) noexcept;

  mutable std::mutex mu_;
  Options opt_;   // what is allowed now: the most of base_ and the leases
  Options base_;  // max_buffers and max_bytes grow with allow()
  std::map<uint64_t, std::pair<size_t, size_t>> leases_;  // buffers, bytes
  uint64_t next_lease_ = 1;
  std::vector<std::vector<uint8_t>> kept_;
  size_t kept_bytes_ = 0;  // their capacities
};

}  // namespace fedwan
