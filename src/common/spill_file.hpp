// An unnamed file for what a node holds only for a while and need not keep
// in memory (an aggregator's anchor frames of a round, the chunks of a mean
// waiting for their last copies): appended to, read back at offsets, gone
// with its last reference whatever the process's end (O_TMPFILE; on a file
// system without it, a named file unlinked at once). Not thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace fedwan {

class SpillFile {
 public:
  // In `dir` (made if missing; the temporary directory when empty), or
  // nullptr with the reason in *why.
  static std::shared_ptr<SpillFile> make(const std::filesystem::path& dir, std::string* why);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // Appends `size` bytes; where they went, or false (errno set) when they
  // could not all be written (the file is as before).
  bool append(const void* data, size_t size, uint64_t* offset);
  // Reads back `size` bytes at `offset`; throws TransportError when it
  // cannot (the node's own disk failing).
  void read(uint64_t offset, void* out, size_t size) const;
  uint64_t size() const { return end_; }

 private:
  explicit SpillFile(int fd) : fd_(fd) {}
  int fd_;
  uint64_t end_ = 0;
};

}  // namespace fedwan
