// Where a RoundAccumulator sets aside the state of chunks waiting for more
// copies. A chunk's combiner lives from its first copy to its last: when
// one child runs a whole update ahead of another, that is every chunk of
// the model in fp32. Over a budget, a combiner whose state is one fp32
// vector (the streamed mean: ChunkCombiner::parkable) has it written to an
// unnamed file (common/spill_file.hpp) and released, and read back, bit
// for bit, when its next copy comes or the chunk is taken. A chunk whose
// only copy went to the combiner as it was decoded can instead have that
// copy's encoded payload written (half the bytes of the state with fp16 or
// bf16, a quarter with int8); the accumulator then rebuilds the state from
// it the same way it was first built. Off by default; a file that cannot be
// made or written leaves the state in memory (logged once a round). Not
// thread safe: the accumulator's owner's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/spill_file.hpp"

namespace fedwan::aggregation {

class ChunkParking {
 public:
  // Where one state went.
  struct Ticket {
    std::shared_ptr<const SpillFile> file;
    uint64_t offset = 0;
    size_t bytes = 0;
  };

  // Parks states while more than `budget` bytes are held in memory; files
  // in `dir` (the temporary directory when empty).
  void enable(size_t budget, std::filesystem::path dir, std::string log_name);
  bool on() const { return on_; }
  size_t budget() const { return budget_; }

  // Writes `state` to the file and releases it (moved into `freed` where
  // given, for the caller to use again; `state` is left empty); false
  // (state untouched) when the write fails.
  bool park(std::vector<float>* state, Ticket* ticket, std::vector<float>* freed = nullptr);
  // Reads a parked state back into `state` (resized to it: an empty one is
  // zero-filled first, one of that size already is only written over); the
  // ticket is spent.
  static void unpark(std::vector<float>* state, Ticket* ticket);
  // The same for `size` bytes of anything else (a copy's payload); false
  // when the write fails. unpark_bytes resizes `out` to them.
  bool park_bytes(const void* data, size_t size, Ticket* ticket);
  static void unpark_bytes(std::vector<uint8_t>* out, Ticket* ticket);
  // A new round: a new file (the old one goes with its last ticket), and a
  // store that failed tries again.
  void rotate();

  uint64_t parked() const { return parked_; }  // states and payloads written, all rounds
  uint64_t bytes_parked() const { return bytes_parked_; }  // their bytes, all rounds

 private:
  bool on_ = false;
  size_t budget_ = 0;
  std::filesystem::path dir_;
  std::string log_name_;
  std::shared_ptr<SpillFile> file_;
  SpillFiles files_;  // the last round's file, used again once it is free
  bool failed_ = false;
  bool warned_ = false;
  uint64_t parked_ = 0;
  uint64_t bytes_parked_ = 0;
  uint64_t round_parked_ = 0;  // since the last rotate()
  uint64_t round_bytes_ = 0;

  bool write(const void* data, size_t size, Ticket* ticket);
};

}  // namespace fedwan::aggregation
