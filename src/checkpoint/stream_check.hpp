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

// Checks a checkpoint fed front to back whose size is known up front.
// Version 3: keeps the head up to the end of the manifest, hashes it, then
// hashes each section against its manifest digest as its bytes come, and
// keeps the trailer. Versions 1 and 2: keeps the head bytes, hashes
// everything but the last kMaxTrailer bytes as they come, and keeps those
// (whether they are all trailer is known only once the header's flags are).
// Memory: the head with the manifest (under 40 KiB) and the trailer,
// whatever the file size (stream_check.cpp).
class StreamCheck {
 public:
  explicit StreamCheck(uint64_t total) : total_(total) {}

  // The caller never feeds more than `total` bytes in all.
  void feed(const uint8_t* p, size_t n);
  // finish() then checks the file's integrity only: not whose it is, under
  // which topology, or its signature.
  void accept_any_identity() { any_identity_ = true; }

  // nullopt, or why the file at `path` is not `node`'s intact checkpoint
  // (signed by `node` when `check` has a verifier).
  std::optional<std::string> finish(const std::filesystem::path& path, const std::string& node,
                                    const Sha256Digest& digest, CheckpointIdentity* out,
                                    const CheckpointSignerCheck& check);

  struct Section {
    uint64_t length = 0;
    Sha256Digest digest{};
  };

 private:
  enum class Mode { kUnknown, kWhole, kSections };  // versions 1-2, version 3
  void consume_whole(const uint8_t* p, size_t n);
  void consume_sections(const uint8_t* p, size_t n);
  void section_bytes(const uint8_t* p, size_t n);
  void next_section();

  uint64_t total_;
  bool any_identity_ = false;
  uint64_t offset_ = 0;
  Mode mode_ = Mode::kUnknown;
  std::vector<uint8_t> first_;  // the first bytes, until the version is in
  std::vector<uint8_t> head_;
  std::vector<uint8_t> tail_;  // versions 1-2: the last bytes fed, not hashed yet
  Sha256 hash_;
  // Version 3.
  bool parsed_ = false;             // the manifest is in head_
  std::optional<std::string> bad_;  // why the file is refused, seen on the way
  Sha256Digest header_digest_{};
  std::vector<Section> sections_;
  size_t section_ = 0;  // the section the next byte belongs to
  uint64_t left_ = 0;   // its bytes still to come
  std::vector<uint8_t> trailer_;
};

}  // namespace fedwan::checkpoint
