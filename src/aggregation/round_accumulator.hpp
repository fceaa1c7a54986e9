// Per-round bookkeeping of an aggregator: which child delivered which chunk,
// and one fp32 accumulator per chunk *in flight* (allocated on the first
// arrival of chunk i, released by take()). Memory is O(chunks in flight),
// never O(children x model). Pure: no sockets, no clocks. Not thread safe.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "fedwan/codec.hpp"
#include "tensor/chunk_plan.hpp"

namespace fedwan {

enum class AddOutcome {
  kAccepted,       // accumulated
  kDuplicate,      // (round, sender, chunk) already counted: ignored
  kStale,          // for a round that is closed
  kFuture,         // for a round not open yet
  kUnknownSender,  // not one of this aggregator's children
  kBadChunk,       // chunk index or element count disagrees with the plan
  kBadPayload,     // codec says the payload is malformed or not finite
};
const char* add_outcome_name(AddOutcome o);

struct ChunkSum {
  uint32_t index = 0;
  std::vector<float> mean;  // weighted mean of the children's chunk values
  double weight = 0;        // total weight behind the mean
};

class RoundAccumulator {
 public:
  // `children` are the wire sender ids whose chunks complete a round.
  RoundAccumulator(ChunkPlan plan, std::vector<uint32_t> children);

  void open(uint64_t round);  // starts `round`; drops anything left of the last
  uint64_t round() const { return round_; }
  bool is_open() const { return open_; }

  struct Result {
    AddOutcome outcome;
    bool chunk_complete = false;  // every child's chunk `chunk` is in
  };
  // Validates and accumulates one child's chunk (a weighted mean + weight).
  Result add(uint64_t round, uint32_t sender, uint32_t chunk, uint32_t element_count,
             double weight, const Codec& codec, const uint8_t* payload, size_t bytes);

  // Releases a complete chunk's accumulator as the weighted mean.
  ChunkSum take(uint32_t chunk);

  bool round_complete() const { return open_ && chunks_done_ == plan_.count(); }
  // Children that have not delivered every chunk of the open round.
  std::vector<uint32_t> missing_children() const;
  // Accumulators alive right now (for memory accounting and tests).
  size_t chunks_in_flight() const { return inflight_.size(); }
  const ChunkPlan& plan() const { return plan_; }

 private:
  struct Inflight {
    std::vector<float> sum;
    double weight = 0;
    uint32_t arrivals = 0;
  };
  int child_slot(uint32_t sender) const;

  ChunkPlan plan_;
  std::vector<uint32_t> children_;
  uint64_t round_ = 0;
  bool open_ = false;
  // seen_[slot][chunk]: whether that child's chunk arrived this round.
  std::vector<std::vector<bool>> seen_;
  std::vector<uint32_t> delivered_;  // chunks per child slot this round
  std::unordered_map<uint32_t, Inflight> inflight_;
  std::vector<bool> taken_;
  uint32_t chunks_done_ = 0;
};

// out[i] = sum[i] / weight, rounded the same way everywhere.
void finalize_mean(float* sum, size_t n, double weight);

}  // namespace fedwan
