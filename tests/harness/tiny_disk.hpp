// A real, tiny file system for tests of what a node does when its disk is
// full: a tmpfs of a few KiB mounted on a private directory (root only;
// tests GTEST_SKIP() when the mount is refused), which fill() fills to the
// last byte and free() empties again.
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "harness/temp_dir.hpp"

namespace fedwan::testing {

class TinyDisk {
 public:
  explicit TinyDisk(size_t bytes = 64 * 1024) {
    mounted_ =
        ::geteuid() == 0 && ::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                                    ("size=" + std::to_string(bytes) + ",mode=0700").c_str()) == 0;
  }
  ~TinyDisk() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  TinyDisk(const TinyDisk&) = delete;
  TinyDisk& operator=(const TinyDisk&) = delete;

  bool mounted() const { return mounted_; }
  std::filesystem::path path() const { return dir_.path(); }

  // Writes a filler file until the disk refuses another byte.
  void fill() {
    FILE* f = std::fopen((dir_.path() / ".filler").c_str(), "ab");
    if (f == nullptr) return;
    std::setvbuf(f, nullptr, _IONBF, 0);
    const char block[512] = {};
    while (std::fwrite(block, 1, sizeof block, f) == sizeof block) {
    }
    while (std::fwrite(block, 1, 1, f) == 1) {
    }
    std::fclose(f);
  }
  void free() { std::filesystem::remove(dir_.path() / ".filler"); }

 private:
  TempDir dir_;
  bool mounted_ = false;
};

}  // namespace fedwan::testing
