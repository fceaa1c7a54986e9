// Per-round bookkeeping of an aggregator: which child delivered which chunk,
// and one combiner of the round's aggregation rule per chunk *in flight*
// (made on the first arrival of chunk i, released by take()). Every copy is
// judged by the update screen (update_screen.hpp) before the rule sees it:
// an fp16 copy from its measure, taken a block at a time in cache, and
// decoded only where the rule or the screen needs its values (the weighted
// mean decodes it into its sum; a copy set aside is not decoded at all). With a streaming rule (the
// default weighted mean) memory is O(chunks in flight), never O(children x model); a buffered rule,
// or a round whose norm bound has no history yet, holds O(fan-in) copies per chunk in flight. Pure:
// no sockets, no clocks. Not thread safe.
//
// Refused copies: a copy the screen or the rule refuses has been delivered.
// Its weight is *excused*: it counts toward the quorum (the round does not
// wait for that child again) and stands behind no values. So does the
// excused weight a region reports with its own copy (its children's copies
// it refused). A chunk whose every copy was refused closes empty.
//
// Fault tolerance: a chunk is ready once every *expected* child delivered it
// (a child lost mid-round is no longer expected) and its weight reaches the
// round's minimum; at a deadline, any chunk whose weight reaches the minimum
// may be closed without the others. A chunk once taken is closed: later
// arrivals for it are stale. Every (round, sender, chunk) counts at most once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "aggregation/aggregation_rule.hpp"
#include "aggregation/chunk_parking.hpp"
#include "aggregation/update_screen.hpp"
#include "fedwan/codec.hpp"
#include "tensor/chunk_plan.hpp"

namespace fedwan::aggregation {

enum class AddOutcome {
  kAccepted,       // accumulated
  kDuplicate,      // (round, sender, chunk) already counted: ignored
  kStale,          // for a round that is closed
  kFuture,         // for a round not open yet
  kUnknownSender,  // not one of this aggregator's children
  kBadChunk,       // chunk index or element count disagrees with the plan
  kBadPayload,     // weight not finite and > 0
  kRefused,        // delivered, and refused (the verdict says why): excused
};
const char* add_outcome_name(AddOutcome o);

// A copy judged only when its chunk closed (held copies, copies a rule
// left out), for the audit log and the counters.
struct LateVerdict {
  uint32_t sender = 0;  // wire id
  double weight = 0;
  CopyVerdict verdict;
};

// What the caller knows of a payload already, worked out where it cost
// less (its SHA-256 for the audit log; on the thread that opened its
// frame): each is taken in place of working it out again.
struct PayloadFacts {
  // Its SHA-256: the replay check takes its first 8 bytes (payload_digest).
  const Sha256Digest* sha = nullptr;
  // Else payload_digest(payload, bytes).
  std::optional<uint64_t> fingerprint;
  // The codec's validate() passed for these bytes and this element count.
  bool valid = false;
  // measure_payload's answer for these bytes and this element count.
  std::optional<ValueMeasure> measure;
};

struct ChunkSum {
  uint32_t index = 0;
  // The children's chunk values combined by the rule; empty when every copy
  // was refused (the chunk closes with no values).
  std::vector<float> mean;
  double weight = 0;             // total weight behind the mean
  double excused = 0;            // weight delivered but refused (here or below)
  std::vector<uint32_t> behind;  // the children whose copies stand behind the mean (wire ids)
  std::vector<LateVerdict> late;
};

class RoundAccumulator {
 public:
  // `children` are the wire sender ids whose chunks complete a round;
  // `rule` combines their copies of a chunk (null: the weighted mean);
  // `screen` judges each copy first (the default checks nothing).
  RoundAccumulator(tensor::ChunkPlan plan, std::vector<uint32_t> children,
                   std::shared_ptr<const AggregationRule> rule = nullptr,
                   ScreenConfig screen = ScreenConfig::none());

  // Starts `round` with every child expected; drops anything left of the
  // last. A chunk becomes ready only with at least `min_weight` behind it.
  void open(uint64_t round, double min_weight = 0);
  uint64_t round() const { return round_; }
  // Changes the open round's minimum weight (the membership changed): chunks
  // taken stay taken; ready_chunks() judges the others by the new minimum.
  void set_min_weight(double min_weight) { min_weight_ = min_weight; }
  bool is_open() const { return open_; }

  struct Result {
    AddOutcome outcome = AddOutcome::kAccepted;
    bool chunk_complete = false;  // every expected child's chunk `chunk` is in
    CopyVerdict verdict;          // kAccepted and kRefused: the screen's (or kDeferred)
  };
  // Validates one child's chunk (a weighted mean + weight), screens it and
  // hands it to the chunk's combiner. `excused`: weight below the child
  // that delivered this chunk and was refused there (a region's); with no
  // values (`payload` null, `bytes` 0, `weight` 0) the copy is that alone.
  // A payload the codec finds malformed is refused like a screened copy.
  // `known`: what the caller knows of the payload already (PayloadFacts).
  Result add(uint64_t round, uint32_t sender, uint32_t chunk, uint32_t element_count, double weight,
             const Codec& codec, const uint8_t* payload, size_t bytes, double excused = 0,
             const PayloadFacts& known = {});

  // Releases a chunk's combiner with what the rule made of its copies (held
  // copies judged first); the chunk must have at least one arrival and not
  // be taken yet.
  ChunkSum take(uint32_t chunk);

  // Differential privacy, central mode (docs/security.md, "Differential
  // privacy"): every copy `sender` (a site) sends is clipped, after the
  // screen, to its chunk's share of `whole_bound` (privacy::chunk_share), so
  // the site's whole update has at most that L2 norm. Not a verdict: counted
  // in privacy_clipped(). A region's copies (counts_itself false) are bounded
  // the same way, but the sites it stands for are counted by its
  // report_unclipped(), not by its copies.
  void clip_copies_of(uint32_t sender, double whole_bound, bool counts_itself = true);
  // Copies scaled down by the privacy clip since this accumulator was made.
  uint64_t privacy_clipped() const { return privacy_clipped_; }
  // Adaptive clipping over regions: `sender` (a region) counted `sites`
  // below it whose update for the open round was not clipped (the last
  // report of the round stands).
  void report_unclipped(uint32_t sender, uint64_t sites);
  // This round: the senders that count themselves (see clip_copies_of) that
  // had a copy of any chunk valued and none of them clipped, plus the sites
  // the others reported (adaptive clipping's count).
  uint64_t privacy_unclipped_senders() const;

  // A child added while the federation runs (a new topology version): not
  // expected in the open round; every round it is opened with after.
  // Adding one already there does nothing.
  void add_child(uint32_t sender);
  // Whether `sender` must deliver for chunks to be ready (all are at open).
  void set_expected(uint32_t sender, bool expected);
  bool expected(uint32_t sender) const;
  // Chunks not taken whose every expected child delivered, with enough
  // weight (accepted and excused alike).
  std::vector<uint32_t> ready_chunks() const;
  // Chunks not taken with at least the minimum weight (deadline closing).
  std::vector<uint32_t> quorate_chunks() const;
  bool chunk_taken(uint32_t chunk) const { return taken_.at(chunk); }
  // Not taken, with at least the minimum weight (one of quorate_chunks()).
  bool chunk_quorate(uint32_t chunk) const;
  double chunk_weight(uint32_t chunk) const;  // delivered: accepted, held and excused
  // Children whose chunk `chunk` is in (wire ids), refused copies included.
  std::vector<uint32_t> contributors(uint32_t chunk) const;
  // Whether `sender` delivered every chunk not yet taken.
  bool delivered_all(uint32_t sender) const;
  // How many chunks `sender` delivered this round (grows while its update
  // arrives), and which it still owes: not delivered, not taken (ascending).
  uint32_t delivered(uint32_t sender) const;
  std::vector<uint32_t> missing_chunks(uint32_t sender) const;

  bool round_complete() const { return open_ && chunks_done_ == plan_.count(); }
  // Expected children that have not delivered every chunk of the open round.
  std::vector<uint32_t> missing_children() const;
  // Expected children that still owe a chunk not taken: what the open round
  // waits for. Empty once every child still expected delivered (a round
  // then closes only if its chunks have the minimum weight).
  std::vector<uint32_t> owing_children() const;
  // Chunks not taken whose weight is below the minimum (or that no child
  // delivered): with no child owing, only more weight closes them.
  std::vector<uint32_t> short_chunks() const;
  double min_weight() const { return min_weight_; }
  // Combiners alive right now, and the bytes they hold (memory accounting).
  size_t chunks_in_flight() const { return inflight_.size(); }
  size_t bytes_in_flight() const;
  // Beyond `budget` bytes of combiners in memory, a parkable one (the
  // streamed mean's sum) waits for its next copy in a file in `dir`
  // (aggregation/chunk_parking.hpp), or the payload of its one copy; the
  // arithmetic is unchanged.
  void park_beyond(size_t budget, const std::string& dir, const std::string& log_name) {
    parking_.enable(budget, dir, log_name);
  }
  // Hands back a vector a taken chunk's values came in (ChunkSum::mean),
  // once the caller is done with it: the next chunk's combiner state, or a
  // parked state read back, is written into it instead of a new zeroed
  // one. At most kSpares are kept, those large enough for any chunk.
  void recycle(std::vector<float>&& values);
  static constexpr size_t kSpares = 2;
  size_t spares() const { return spares_.size(); }
  uint64_t chunks_parked() const { return parking_.parked(); }
  uint64_t bytes_parked() const { return parking_.bytes_parked(); }
  const AggregationRule& rule() const { return *rule_; }
  const UpdateScreen& screen() const { return screen_; }
  const tensor::ChunkPlan& plan() const { return plan_; }

 private:
  // A held copy's values set aside, or the payload they were decoded from.
  struct HeldParked {
    ChunkParking::Ticket ticket;
    bool payload = false;
    CodecId codec = CodecId::kFp32;
  };
  struct Inflight {
    std::unique_ptr<ChunkCombiner> combiner;
    double weight = 0;                               // delivered: what the quorum counts
    double excused = 0;                              // refused here or below, as known on arrival
    std::vector<std::pair<uint32_t, double>> added;  // (slot, weight) given the combiner
    std::vector<HeldCopy> held;                      // judged at take(): suspects, or no bound yet
    uint32_t valued = 0;          // copies with values past the value checks (streamed or held)
    ChunkParking::Ticket parked;  // the combiner's state, set aside (file set) or not
    std::vector<HeldParked> held_parked;  // by held copy, alike
    // Instead of the state, the payload of the one copy the combiner had
    // (added[0], given to it as decoded); the combiner is then gone until
    // rebuilt from it (combiner_of()).
    ChunkParking::Ticket replay;
    CodecId replay_codec = CodecId::kFp32;
    size_t fan_in = 0;  // what begin_chunk was given
  };
  // A copy's payload as add() got it, for parking it instead of the state.
  struct Payload {
    // null: the values given were not its decoding, or the codec is not
    // codec_by_id(its id)
    const Codec* codec = nullptr;
    const uint8_t* data = nullptr;
    size_t bytes = 0;
    bool held = false;  // the copy was held (the last of acc.held), not combined
  };
  // The combiner's state back in memory, if it was set aside; and the held
  // copies' values.
  void unpark(Inflight& acc);
  void unpark_held(Inflight& acc, uint32_t chunk);
  // Over the budget: acc's combiner's state (or the payload of its one
  // copy) and held copies set aside.
  void park_if_over(Inflight& acc, const Payload& last);
  // The first copy of a chunk that waits for more, over the budget: its
  // payload set aside at once, no combiner begun (true), as park_if_over
  // would have left it; false when that does not apply (nothing done).
  bool park_first_copy(Inflight& acc, uint32_t chunk, int slot, double weight, const Payload& copy);
  // acc's combiner, begun if it was not, rebuilt if its one copy waits as a
  // payload, its state back in memory. Called only for a copy that goes
  // into it (or to take the chunk): a refused copy leaves the chunk parked.
  ChunkCombiner& combiner_of(Inflight& acc, uint32_t chunk);
  // A kept vector resized to `n` (contents unspecified), or an empty one.
  std::vector<float> spare(uint32_t n);
  Result refuse(Inflight& acc, int slot, uint32_t chunk, double weight, CopyVerdict v);
  Result deliver(int slot, uint32_t chunk, Result r);
  void judge_held(Inflight& acc, uint32_t chunk, ChunkSum& out);
  void combined_into(const Inflight& acc, Combined& c, uint32_t chunk, ChunkSum& out) const;
  int child_slot(uint32_t sender) const;
  bool chunk_ready(uint32_t chunk) const;
  // Whether the chunk would be ready were `slot`'s copy delivered and its
  // weight `weight`.
  bool ready_with(uint32_t chunk, int slot, double weight) const;

  tensor::ChunkPlan plan_;
  std::vector<uint32_t> children_;
  std::shared_ptr<const AggregationRule> rule_;
  UpdateScreen screen_;
  std::vector<float> scratch_;              // one decoded copy
  std::vector<uint8_t> replay_payload_;     // one parked payload read back
  std::vector<float> replay_values_;        // a combiner's scratch to decode it
  std::vector<std::vector<float>> spares_;  // see recycle()
  ChunkParking parking_;
  bool rule_parks_ = false;     // the rule's combiners are parkable (learned from the first)
  std::vector<bool> expected_;  // by child slot
  double min_weight_ = 0;
  uint64_t round_ = 0;
  bool open_ = false;
  // seen_[slot][chunk]: whether that child's chunk arrived this round.
  std::vector<std::vector<bool>> seen_;
  std::vector<uint32_t> delivered_;  // chunks per child slot this round
  std::unordered_map<uint32_t, Inflight> inflight_;
  std::vector<bool> taken_;
  uint32_t chunks_done_ = 0;
  std::unordered_map<uint32_t, double> clip_;  // sender -> whole-update L2 bound
  uint64_t privacy_clipped_ = 0;
  // This round's senders under a clip with a valued copy, and with a copy
  // clipped (by sender).
  std::unordered_set<uint32_t> clip_valued_, clip_hit_;
  std::unordered_set<uint32_t> clip_reporters_;               // senders counted by their reports
  std::unordered_map<uint32_t, uint64_t> unclipped_reports_;  // this round's, by sender
};

// out[i] = sum[i] / weight, rounded the same way everywhere.
void finalize_mean(float* sum, size_t n, double weight);

}  // namespace fedwan::aggregation
