#include "common/spill_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <system_error>

#include "common/errno_text.hpp"
#include "common/unnamed_file.hpp"
#include "fedwan/error.hpp"

namespace fedwan {

std::shared_ptr<SpillFile> SpillFile::make(const std::filesystem::path& dir, std::string* why) {
  std::string where;
  const int fd = open_unnamed_file(dir, &where);
  if (fd < 0) {
    *why = where + ": " + errno_text(errno);
    return nullptr;
  }
  return std::shared_ptr<SpillFile>(new SpillFile(fd));
}

SpillFile::~SpillFile() { ::close(fd_); }

std::shared_ptr<SpillFile> SpillFiles::next(const std::filesystem::path& dir, std::string* why) {
  // use_count() == 1: no other holder is left to copy it from, whatever
  // thread held it last.
  if (retired_ && retired_.use_count() == 1) {
    std::shared_ptr<SpillFile> f = std::move(retired_);
    f->rewind();
    return f;
  }
  return SpillFile::make(dir, why);
}

void SpillFiles::retire(std::shared_ptr<SpillFile> file) {
  if (file) retired_ = std::move(file);
}

bool SpillFile::append(const void* data, size_t size, uint64_t* offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::pwrite(fd_, p + done, size - done, static_cast<off_t>(end_ + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return false;
    }
    done += static_cast<size_t>(w);
  }
  *offset = end_;
  end_ += size;
  return true;
}

void SpillFile::read(uint64_t offset, void* out, size_t size) const {
  auto* p = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < size) {
    const ssize_t r = ::pread(fd_, p + done, size - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw TransportError("spill file: reading back " + std::to_string(size) + " bytes at " +
                           std::to_string(offset) +
                           " failed: " + (r == 0 ? std::string("short file") : errno_text(errno)));
    }
    done += static_cast<size_t>(r);
  }
}

}  // namespace fedwan
