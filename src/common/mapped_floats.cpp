#include "common/mapped_floats.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "common/errno_text.hpp"
#include "common/keep_alive.hpp"
#include "common/unnamed_file.hpp"

namespace fedwan {
MappedFloats::~MappedFloats() { unmap(); }

void MappedFloats::place(std::filesystem::path dir, size_t from_bytes) {
  dir_ = std::move(dir);
  from_bytes_ = from_bytes;
}

void MappedFloats::unmap() {
  if (map_) ::munmap(map_, mapped_bytes_);
  map_ = nullptr;
  mapped_bytes_ = 0;
}

bool MappedFloats::map_file(size_t bytes) {
  std::string where;
  const int fd = open_unnamed_file(dir_, &where);
  if (fd < 0) {
    why_ = where + ": " + errno_text(errno);
    return false;
  }
  // The blocks now, so a page written later never meets a full disk
  // (which a shared mapping reports as SIGBUS).
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* p =
      err == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (err != 0 || p == MAP_FAILED) {
    why_ = where + ": " + errno_text(err != 0 ? err : map_errno);
    return false;
  }
  map_ = static_cast<float*>(p);
  mapped_bytes_ = bytes;
  return true;
}

void MappedFloats::resize(size_t n) {
  if (n == size_) return;
  const size_t bytes = n * sizeof(float);
  unmap();
  why_.clear();
  if (n > 0 && bytes >= from_bytes_ && map_file(bytes)) {
    std::vector<float>().swap(memory_);
    data_ = map_;
  } else {
    memory_.resize(n);
    memory_.shrink_to_fit();
    data_ = memory_.data();
  }
  size_ = n;
}

void MappedFloats::assign(const float* first, const float* last) {
  const size_t n = static_cast<size_t>(last - first);
  resize(n);
  // In pieces: seconds into a file at a billion parameters, and a node
  // that has a KeepAlive open goes on heartbeating meanwhile.
  if (n > 0) KeepAlive::copy(data_, first, n * sizeof(float));
}

void MappedFloats::clear() {
  unmap();
  std::vector<float>().swap(memory_);
  data_ = nullptr;
  size_ = 0;
}

void MappedFloats::cool() {
  if (map_) ::madvise(map_, mapped_bytes_, MADV_COLD);
}

}  // namespace fedwan
