// The streaming check of a checkpoint file (checkpoint_file.hpp format) fed
// front to back, never held whole: check_checkpoint_stream (replica_store.hpp)
// runs it over a stored file, CheckpointAssembly over pieces as they arrive.
// Not thread safe: one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "common/sha256.hpp"

namespace fedwan::checkpoint {

struct CheckpointIdentity;

// Checks a checkpoint fed front to back whose size is known up front: keeps
// the head bytes, hashes everything but the last kMaxTrailer bytes as they
// come, and keeps those (whether they are all trailer is known only once the
// header's flags are). Memory: kHeadSize + 2 * kMaxTrailer bytes whatever
// the file size (stream_check.cpp).
class StreamCheck {
 public:
  explicit StreamCheck(uint64_t total) : total_(total) {}

  // The caller never feeds more than `total` bytes in all.
  void feed(const uint8_t* p, size_t n);

  // nullopt, or why the file at `path` is not `node`'s intact checkpoint
  // (signed by `node` when `check` has a verifier).
  std::optional<std::string> finish(const std::filesystem::path& path, const std::string& node,
                                    const Sha256Digest& digest, CheckpointIdentity* out,
                                    const CheckpointSignerCheck& check);

 private:
  uint64_t total_;
  uint64_t offset_ = 0;
  std::vector<uint8_t> head_;
  std::vector<uint8_t> tail_;  // the last bytes fed, not hashed yet
  Sha256 hash_;
};

}  // namespace fedwan::checkpoint
