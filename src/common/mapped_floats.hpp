// A float array in memory, or in a shared mapping of an unnamed file, for
// a large buffer a node touches only a few times a round (a site's anchor):
// the kernel keeps its pages while memory is plentiful and writes them out
// and drops them when it is short, so the node's anonymous memory does not
// hold it. The file's blocks are allocated when it is sized (fallocate), so
// writing through the mapping never fails for want of space; where the
// file cannot be made, sized or mapped, the array is in memory and why()
// says so. Not thread safe, like a std::vector.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace fedwan {

class MappedFloats {
 public:
  MappedFloats() = default;
  ~MappedFloats();
  MappedFloats(const MappedFloats&) = delete;
  MappedFloats& operator=(const MappedFloats&) = delete;

  // Arrays of at least `from_bytes` bytes go to a file in `dir` (the
  // temporary directory when empty) from the next sizing on; SIZE_MAX:
  // never.
  void place(std::filesystem::path dir, size_t from_bytes);

  // The values of [first, last), which must not lie in this array; the
  // array is resized to their count.
  void assign(const float* first, const float* last);
  void assign(const std::vector<float>& v) { assign(v.data(), v.data() + v.size()); }
  // Sized to n values whose contents are unspecified, for the caller to
  // fill (from a file, without a copy beside): returns data().
  float* reset(size_t n) {
    resize(n);
    return data_;
  }
  void clear();

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float& operator[](size_t i) { return data_[i]; }
  const float& operator[](size_t i) const { return data_[i]; }

  bool in_file() const { return map_ != nullptr; }
  // Why the last sizing that should have gone to a file did not (empty
  // when it did, or when it was not due).
  const std::string& why() const { return why_; }
  // A hint that the values are not needed for a while: their pages are the
  // first the kernel writes out and drops (in a file only).
  void cool();

 private:
  void resize(size_t n);  // contents unspecified
  void unmap();
  bool map_file(size_t bytes);

  std::filesystem::path dir_;
  size_t from_bytes_ = static_cast<size_t>(-1);
  std::vector<float> memory_;
  float* map_ = nullptr;
  size_t mapped_bytes_ = 0;
  float* data_ = nullptr;
  size_t size_ = 0;
  std::string why_;
};

}  // namespace fedwan
