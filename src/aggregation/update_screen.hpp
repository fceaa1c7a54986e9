// What every aggregator checks on each child's decoded copy of a chunk
// before the aggregation rule sees it (docs/security.md, "Robust
// aggregation"), whatever the sender's own checks did: a dishonest sender
// skips them.
//   values   a NaN or an infinity (finite_check), or a value beyond
//            +-max_abs: refused.
//   replay   a copy byte for byte identical to one the same child sent for
//            the same chunk in the last `replay_window` rounds (all-zero
//            copies excepted: a frozen slice of the model is the same every
//            round): refused.
//   norm     the copy's L2 norm over the chunk's bound: refused or clipped
//            to the bound. The bound is absolute (a whole update's bound
//            shared out over the chunks as sqrt(chunk size / model size)),
//            or adaptive: factor x the median of the chunk's accepted norms
//            over the last `window` rounds. A copy over it is a suspect,
//            held until the chunk closes: refused (or clipped) if the
//            suspects are at most half of the chunk's copies, accepted as
//            they are if more (the honest norms moved: a site joined, the
//            model converged; the bound is stale, and a lone child is never
//            judged against its own past). With no such history (the first
//            round, a restart), the copies are held until the chunk has
//            them all and judged against factor x their own lower median
//            (of two copies, the smaller: the larger is the suspect): one
//            round with O(fan-in x chunk) per chunk in flight.
// A refused copy has still been delivered: its weight counts toward the
// quorum and stands behind no values (RoundAccumulator's excused weight).
// Pure: no sockets, no clocks. Not thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "tensor/chunk_plan.hpp"

namespace fedwan::aggregation {

// What the screen checks; the defaults are federation.aggregation's
// (node::screen_config makes one from a topology).
struct ScreenConfig {
  bool finite_check = true;
  double max_abs = 1e6;         // 0: none
  uint32_t replay_window = 16;  // rounds; 0: no replay check
  enum class Norm : uint8_t { kOff, kAdaptive, kAbsolute } norm = Norm::kAdaptive;
  double factor = 4;
  uint32_t window = 3;
  double bound = 0;            // kAbsolute: a whole update's L2 bound
  bool clip = false;           // else refuse
  static ScreenConfig none();  // checks nothing
};

enum class Verdict : uint8_t { kAccepted, kClipped, kRefused, kDeferred };
const char* verdict_name(Verdict v);

struct CopyVerdict {
  Verdict verdict = Verdict::kAccepted;
  std::string reason;  // why refused or clipped; empty when accepted
  double norm = 0;     // the copy's L2 norm as it came
  double bound = 0;    // the norm bound it was judged by (0: none)
  double scale = 1;    // what its values were multiplied by (clipped: < 1)
};

// A copy held until its chunk closes (no norm history yet).
struct HeldCopy {
  uint32_t slot = 0;
  double weight = 0;
  double norm = 0;
  std::vector<float> values;
  double bound = 0;  // a suspect's bound; 0: held for want of history
};

// What the screen measures of a copy's values: the sum of their squares
// (l2_norm's before its square root: the same bits) and the largest
// |value|'s bits (HalfKernels::max_abs_bits; at or above kF32ExpMask: a NaN
// or an infinity).
struct ValueMeasure {
  double squares = 0;
  uint32_t top = 0;
};
ValueMeasure measure_values(const float* v, size_t n);
// The same of the values a valid payload decodes to, for a codec decoded a
// block at a time in L1 (fp16) rather than into a whole chunk's buffer; the
// same bits as measure_values on codec.decode's output. nullopt for the
// other codecs.
std::optional<ValueMeasure> measure_payload(const Codec& codec, const uint8_t* payload, size_t n);

// A copy's values, decoded when first asked for (the screen asks only to
// name a value it refuses or to clip them): n writable floats.
using ValuesOnDemand = std::function<float*()>;

class UpdateScreen {
 public:
  UpdateScreen(ScreenConfig cfg, tensor::ChunkPlan plan);
  const ScreenConfig& config() const { return cfg_; }

  // Judges one decoded copy of chunk `chunk` for round `round` from the
  // child in `slot`, whose payload had `digest` (payload_digest). Clipping
  // scales `values` in place. kDeferred: no bound is known for the chunk
  // yet; judge_held decides once every copy is in. Remembers the digest.
  CopyVerdict judge(uint64_t round, uint32_t chunk, uint32_t slot, uint64_t digest, float* values,
                    uint32_t n);
  // The same from the copy's measure (measure_payload), its values decoded
  // only where the verdict needs them (`values`; clipped in place there).
  CopyVerdict judge(uint64_t round, uint32_t chunk, uint32_t slot, uint64_t digest,
                    const ValueMeasure& measure, const ValuesOnDemand& values, uint32_t n);
  bool checks_replays() const { return cfg_.replay_window > 0; }
  // Decides the suspects of one chunk (copies over its adaptive bound) once
  // the chunk closed with `copies` copies with values in all: refused or
  // clipped when they are at most half of them, else accepted (the bound is
  // stale). One verdict per suspect, in order.
  std::vector<CopyVerdict> judge_suspects(std::vector<HeldCopy>& held, size_t copies) const;
  // Decides the held copies of one chunk together, against factor x the
  // lower median of their norms; scales clipped ones. One verdict per copy, in
  // the copies' order.
  std::vector<CopyVerdict> judge_held(std::vector<HeldCopy>& held) const;
  // An accepted copy's norm (after clipping), for the adaptive bound of the
  // rounds after `round`.
  void remember(uint64_t round, uint32_t chunk, double norm);
  // The bound chunk `chunk` is judged by in `round`: nullopt when there is
  // none (norm bound off) or none yet (adaptive, no history).
  std::optional<double> bound(uint64_t round, uint32_t chunk) const;
  // Whether copies of `chunk` in `round` are held (adaptive, no history).
  bool holds(uint64_t round, uint32_t chunk) const;

 private:
  struct Remembered {
    uint64_t round = 0;
    std::vector<double> norms;
  };
  // `top`: the largest |v|'s bits (HalfKernels::max_abs_bits); the values
  // are asked for only when one is to be named.
  std::optional<std::string> value_problem(const ValuesOnDemand& values, uint32_t n,
                                           uint32_t top) const;
  // The earlier round in which the child sent this very copy, if any; then
  // remembers it for `round`.
  std::optional<uint64_t> replayed(uint64_t round, uint32_t chunk, uint32_t slot, uint64_t digest);
  struct SentDigest {
    uint64_t round = 0;
    uint64_t digest = 0;
  };
  CopyVerdict over_bound(CopyVerdict v, float* values, uint32_t n) const;
  // over_bound, the values asked for only when they are clipped.
  CopyVerdict over_bound(CopyVerdict v, const ValuesOnDemand& values, uint32_t n) const;

  ScreenConfig cfg_;
  tensor::ChunkPlan plan_;
  // history_[chunk]: accepted norms of the last `window` rounds, oldest first.
  std::vector<std::vector<Remembered>> history_;
  // sent_[chunk][slot]: digests of the child's copies in the replay window.
  std::vector<std::vector<std::vector<SentDigest>>> sent_;
};

// What replays are told by: the payload's fingerprint64 (a keyed hash five
// times faster than SHA-256, common/fingerprint.hpp), or, where the caller
// has the payload's SHA-256 already (for its audit log), its first 8 bytes.
// A process uses one of the two throughout: its screen compares only its
// own digests (a node that hashes every payload for its audit log, or none).
uint64_t payload_digest(const uint8_t* payload, size_t bytes);
uint64_t payload_digest(const Sha256Digest& sha);

// The L2 norm, summed in double in 16 interleaved partial sums (AVX2 where
// the CPU has it; the same bits either way).
double l2_norm(const float* v, size_t n);
// The same on the scalar path alone (tests compare the two).
double l2_norm_scalar(const float* v, size_t n);
// The median (the mean of the two middle values for an even count); 0 for
// none. Reorders `v`.
double median_of(std::vector<double>& v);
// The lower median: the smaller middle value for an even count (of two
// values, the smaller); 0 for none. Reorders `v`.
double lower_median_of(std::vector<double>& v);

}  // namespace fedwan::aggregation
