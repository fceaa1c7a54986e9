// How a round's children's copies of one chunk combine into the chunk an
// aggregator forwards (a region) or steps the outer optimizer with (the
// root). RoundAccumulator (round_accumulator.hpp) keeps the round's
// bookkeeping (who delivered which chunk, weights, quorum, stale and
// duplicate copies) and hands every copy it accepts to the chunk's
// combiner; the rule decides only the arithmetic. Pure: no sockets, no
// clocks. A rule is immutable and may be shared; a combiner belongs to one
// chunk of one round and is not thread safe.
//
// Memory contract (docs/architecture.md, "Aggregation rules"):
//   kStreaming  each copy is folded in as it arrives; a combiner holds
//               O(chunk) whatever the fan-in (today's weighted mean).
//   kBuffered   every child's decoded copy is kept until the chunk closes:
//               O(fan-in x chunk) per chunk in flight (a coordinate-wise
//               median or trimmed mean needs every copy of a coordinate).
// bytes_held() says what a combiner holds right now.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fedwan/codec.hpp"

namespace fedwan::aggregation {

enum class RuleMemory { kStreaming, kBuffered };
const char* rule_memory_name(RuleMemory m);

// A copy the rule left out of the combined chunk (a robust rule that
// selects or excludes whole copies): its weight is delivered, not counted.
struct LeftOut {
  uint32_t slot = 0;
  std::string reason;
};

struct Combined {
  std::vector<float> values;
  double weight = 0;  // the weight of the copies that stand behind `values`
  std::vector<LeftOut> left_out;
};

class ChunkCombiner {
 public:
  virtual ~ChunkCombiner() = default;
  // One child's copy, decoded and screened (update_screen.hpp): `values`
  // holds the chunk's element count of finite values; `weight` finite and
  // > 0; `slot` the child's place among the aggregator's children, each
  // slot at most once per chunk (usually below the fan-in given to
  // begin_chunk, but a child added by a topology version during the round
  // may bring a higher one). The combiner may keep a copy; `values` is the
  // caller's.
  virtual void add(uint32_t slot, const float* values, double weight) = 0;
  // The same copy as the payload `codec` decodes to those values (valid
  // for the chunk's `elements`): the default decodes it into `scratch` and
  // calls add(); a rule may fold it in as it decodes (the weighted mean:
  // Codec::decode_accumulate, the same bits as add() on the decoding).
  virtual void add_encoded(uint32_t slot, const Codec& codec, const uint8_t* payload,
                           uint32_t elements, double weight, std::vector<float>& scratch);
  // The combined chunk, once, after at least one add(). A rule that leaves
  // copies out says which and why; what stands behind the values is the
  // rest (at least one copy).
  virtual Combined finish() = 0;
  virtual size_t bytes_held() const = 0;
  // A combiner whose whole state is one fp32 vector may hand it out to be
  // set aside while its chunk waits (aggregation/chunk_parking.hpp): the
  // caller writes it elsewhere and empties it, and refills it exactly
  // before the next add() or finish(). nullptr: not parkable.
  virtual std::vector<float>* parkable() { return nullptr; }
};

class AggregationRule {
 public:
  virtual ~AggregationRule() = default;
  virtual std::string name() const = 0;
  virtual RuleMemory memory() const = 0;
  // A combiner for one chunk of `elements` values; `fan_in` is how many
  // children the aggregator has when the chunk begins (a sizing hint).
  virtual std::unique_ptr<ChunkCombiner> begin_chunk(uint32_t elements, size_t fan_in) const = 0;
  // The same, offered `buffer` (at least `elements` floats once resized,
  // its contents unspecified) for the combiner's state: a rule whose
  // combiner keeps one fp32 vector may take it rather than allocate and
  // zero a new one (the accumulator hands back the vectors finish() made).
  // The default ignores it.
  virtual std::unique_ptr<ChunkCombiner> begin_chunk_reusing(uint32_t elements, size_t fan_in,
                                                             std::vector<float>&& buffer) const {
    (void)buffer;
    return begin_chunk(elements, fan_in);
  }
};

// The default rule: the weighted mean, streamed. Each copy is accumulated
// as acc + weight * x with two roundings (accumulate_weighted, as the
// codecs' decode_accumulate), and the sum is divided by the total weight
// (finalize_mean): with at most two children the result does not depend on
// arrival order, and a federation reproduces a fixed-order reference bit
// for bit.
inline constexpr const char* kWeightedMean = "weighted_mean";

// out[i] = 0 + weight * x[i]: accumulate_weighted onto zeros, the same
// operations and bits, without reading `out` (a first copy written into a
// buffer used before).
void first_weighted(float* out, const float* x, size_t n, float weight);

// Rules by name, as the topology's `federation.aggregation.rule` names them,
// with the topology's `federation.aggregation.params`. The library registers
// its own (weighted_mean, and robust_rules.hpp's median, trimmed_mean and
// multi_krum); a program (or a test) may register more before it loads a
// topology that names them. A factory throws ConfigError for parameters its
// rule does not take or out of their range.
using RuleParams = std::map<std::string, double>;
using RuleFactory = std::function<std::shared_ptr<const AggregationRule>(const RuleParams&)>;
// Throws ConfigError when `name` is empty, not [a-z0-9_], or taken.
void register_rule(const std::string& name, RuleFactory factory);
bool has_rule(const std::string& name);
// Throws ConfigError naming the known rules when `name` is not one, or the
// factory's when `params` do not suit the rule.
std::shared_ptr<const AggregationRule> make_rule(const std::string& name,
                                                 const RuleParams& params = {});
std::vector<std::string> rule_names();  // sorted

}  // namespace fedwan::aggregation
