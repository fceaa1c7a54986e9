#include "common/byte_pool.hpp"

#include <algorithm>
#include <utility>

namespace fedwan {

BytePool::BytePool(Options o) : opt_(o), base_(o) { kept_.reserve(opt_.max_buffers); }

BytePool& BytePool::shared() {
  // Never destroyed: zmq's I/O threads may give a buffer back while the
  // process's statics go.
  static BytePool* pool = [] {
    Options o;
    o.max_buffers = 0;
    o.max_bytes = 0;
    return new BytePool(o);
  }();
  return *pool;
}

void BytePool::allow(size_t max_buffers, size_t max_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  base_.max_buffers = std::max(base_.max_buffers, max_buffers);
  base_.max_bytes = std::max(base_.max_bytes, max_bytes);
  opt_.max_buffers = std::max(opt_.max_buffers, max_buffers);
  opt_.max_bytes = std::max(opt_.max_bytes, max_bytes);
  kept_.reserve(opt_.max_buffers);
}

BytePool::Lease BytePool::lease(size_t max_buffers, size_t max_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_lease_++;
  leases_[id] = {max_buffers, max_bytes};
  opt_.max_buffers = std::max(opt_.max_buffers, max_buffers);
  opt_.max_bytes = std::max(opt_.max_bytes, max_bytes);
  kept_.reserve(opt_.max_buffers);
  return Lease(this, id);
}

BytePool::Lease& BytePool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    end();
    pool_ = o.pool_;
    id_ = o.id_;
    o.pool_ = nullptr;
  }
  return *this;
}

void BytePool::Lease::end() noexcept {
  if (pool_ != nullptr) pool_->end_lease(id_);
  pool_ = nullptr;
}

void BytePool::end_lease(uint64_t id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  leases_.erase(id);
  opt_.max_buffers = base_.max_buffers;
  opt_.max_bytes = base_.max_bytes;
  for (const auto& entry : leases_) {
    opt_.max_buffers = std::max(opt_.max_buffers, entry.second.first);
    opt_.max_bytes = std::max(opt_.max_bytes, entry.second.second);
  }
  while (!kept_.empty() && (kept_.size() > opt_.max_buffers || kept_bytes_ > opt_.max_bytes)) {
    kept_bytes_ -= kept_.back().capacity();
    kept_.pop_back();
  }
}

std::vector<uint8_t> BytePool::take(size_t size) {
  if (size >= opt_.min_size) {
    std::vector<uint8_t> found;
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t best = kept_.size();
      for (size_t i = 0; i < kept_.size(); ++i) {
        const size_t cap = kept_[i].capacity();
        if (cap < size) continue;
        if (best == kept_.size() || cap < kept_[best].capacity() ||
            (cap == kept_[best].capacity() && kept_[i].size() > kept_[best].size())) {
          best = i;
        }
      }
      if (best != kept_.size()) {
        found = std::move(kept_[best]);
        kept_[best] = std::move(kept_.back());
        kept_.pop_back();
        kept_bytes_ -= found.capacity();
      }
    }
    if (found.capacity() >= size) {
      // Down: no byte written. Up (a buffer last used for a smaller frame):
      // only the bytes past its old end are zeroed.
      found.resize(size);
      return found;
    }
  }
  return std::vector<uint8_t>(size);
}

std::shared_ptr<std::vector<uint8_t>> BytePool::take_shared(size_t size) {
  // Were the control block not to be had, the deleter runs on `held`.
  return std::shared_ptr<std::vector<uint8_t>>(new std::vector<uint8_t>(take(size)),
                                               [this](std::vector<uint8_t>* v) {
                                                 give(std::move(*v));
                                                 delete v;
                                               });
}

void BytePool::give(std::vector<uint8_t>&& bytes) noexcept {
  const size_t cap = bytes.capacity();
  if (cap < opt_.min_size) return;  // min_size never changes
  std::lock_guard<std::mutex> lock(mu_);
  if (kept_.size() >= opt_.max_buffers || cap > opt_.max_bytes - kept_bytes_) return;
  if (kept_.capacity() == kept_.size()) return;  // room is reserved up front
  kept_.push_back(std::move(bytes));
  kept_bytes_ += cap;
}

size_t BytePool::kept_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_.size();
}

size_t BytePool::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_bytes_;
}

}  // namespace fedwan
