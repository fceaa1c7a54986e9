// A fixed-size array of zeros that costs nothing until it is written: its
// storage is fresh anonymous pages, which the kernel gives zeroed when a
// page is first touched, so making one is instant and its memory grows as
// its pages are used. A std::vector of the same size writes every byte
// when it is made: at a billion floats that is 4 GB of page faults and
// clearing (seconds) before the first value is used (an outer optimizer's
// momentum, made before a root serves). Move-only; not thread safe, like a
// std::vector. Throws std::bad_alloc when the pages cannot be mapped.
// warm() takes the pages on a helper thread ahead of their first writes
// (common/page_warmer.hpp).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

#include "common/page_warmer.hpp"

namespace fedwan {

template <typename T>
class ZeroedArray {
  static_assert(std::is_trivial_v<T>, "the array's values are its pages' zero bytes");

 public:
  ZeroedArray() = default;
  explicit ZeroedArray(size_t n) : size_(n) {
    if (n == 0) return;
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<T*>(p);
  }
  ~ZeroedArray() { release(); }
  ZeroedArray(const ZeroedArray&) = delete;
  ZeroedArray& operator=(const ZeroedArray&) = delete;
  ZeroedArray(ZeroedArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        warmer_(std::move(o.warmer_)) {}
  ZeroedArray& operator=(ZeroedArray&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      warmer_ = std::move(o.warmer_);
    }
    return *this;
  }

  // Takes the pages on a helper thread from now on; the values do not
  // change, and the array may be read and written meanwhile.
  void warm() { warmer_ = PageWarmer(data_, bytes()); }
  PageWarmer& warmer() { return warmer_; }
  const PageWarmer& warmer() const { return warmer_; }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  size_t bytes() const { return size_ * sizeof(T); }
  void release() {
    warmer_.stop();  // before its pages go
    if (data_ != nullptr) ::munmap(data_, bytes());
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
  PageWarmer warmer_;
};

}  // namespace fedwan
