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
  // Appends from the start again, over what the file holds (its pages stay
  // in the page cache, written over in place). Only for a file nobody
  // reads any more.
  void rewind() { end_ = 0; }

 private:
  explicit SpillFile(int fd) : fd_(fd) {}
  int fd_;
  uint64_t end_ = 0;
};

// The files of a store that writes one round's worth at a time: a round's
// file is retired when the next round begins, and taken again once nothing
// refers to it any more, instead of a new one. Writing over pages the
// page cache already holds costs half of writing into fresh ones, and
// closing a file of a few hundred MiB frees its pages one by one. The
// price: a file written over for longer than the kernel's dirty expiry
// (30 s by default) is written back to disk, as a new file held that long
// would be. Not thread safe; the files' other holders may be anywhere.
class SpillFiles {
 public:
  // A file to append to: the retired one, rewound, when only this holds
  // it; otherwise a new one (nullptr with the reason in *why).
  std::shared_ptr<SpillFile> next(const std::filesystem::path& dir, std::string* why);
  // The current round's file is done with (its readers may hold it on).
  void retire(std::shared_ptr<SpillFile> file);

 private:
  std::shared_ptr<SpillFile> retired_;
};

}  // namespace fedwan
