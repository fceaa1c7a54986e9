#include "aggregation/update_screen.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "codec/block_scaled.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/half.hpp"
#include "common/cpu_features.hpp"
#include "common/fingerprint.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::aggregation {
namespace {

std::string number(double d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", d);
  return buf;
}

// The sum of squares is kept in kLanes partial sums, element i in lane
// i % kLanes, added up in one fixed order at the end: the vector and the
// scalar paths give the same bits on every machine (a float's square is
// exact in double, so the order of the additions is all that matters).
constexpr size_t kLanes = 16;
constexpr uint32_t kF32Infinity = 0x7f800000u;  // |x| bits at or above: inf or NaN

double add_lanes(const double* a) {
  double quads[4];
  for (size_t q = 0; q < 4; ++q) {
    quads[q] = (a[4 * q] + a[4 * q + 1]) + (a[4 * q + 2] + a[4 * q + 3]);
  }
  return (quads[0] + quads[1]) + (quads[2] + quads[3]);
}

void squares_scalar(const float* v, size_t n, size_t from, double* lanes) {
  for (size_t i = from; i < n; ++i) {
    const double x = v[i];
    lanes[i % kLanes] += x * x;
  }
}

// With `top`, the largest |value|'s bits (HalfKernels::max_abs_bits) are
// found in the same pass: a stretch of the values at a time, its maximum
// taken while the stretch is in L1. The lanes run on across stretches, so
// the sum is the same bits either way.
constexpr size_t kStretch = 4096;  // floats, a multiple of kLanes
static_assert(kStretch % kLanes == 0, "a stretch must end on a lane boundary");

// Adds v's squares into `lanes` (element i into lane i % kLanes) and
// raises *top to the largest |v|'s bits.
__attribute__((target("avx2"))) void squares_avx2(const float* v, size_t n, double* lanes,
                                                  uint32_t* top) {
  __m256d acc[4];
  for (size_t q = 0; q < 4; ++q) acc[q] = _mm256_loadu_pd(lanes + 4 * q);
  const kernels::HalfKernels& k = kernels::half_kernels();
  size_t i = 0;
  for (size_t s = 0; s < n; s += kStretch) {
    const size_t end = std::min(n, s + kStretch);
    *top = std::max(*top, k.max_abs_bits(v + s, nullptr, end - s));
    for (; i + kLanes <= end; i += kLanes) {
      for (size_t q = 0; q < 4; ++q) {
        const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(v + i + 4 * q));
        acc[q] = _mm256_add_pd(acc[q], _mm256_mul_pd(x, x));
      }
    }
  }
  for (size_t q = 0; q < 4; ++q) _mm256_storeu_pd(lanes + 4 * q, acc[q]);
  squares_scalar(v, n, i, lanes);
}

// The same, on the vector path where the CPU has one. Calls may go on
// from one another: each but the last over a multiple of kLanes values.
void add_squares(const float* v, size_t n, double* lanes, uint32_t* top) {
  if (cpu_has_avx2()) {
    squares_avx2(v, n, lanes, top);
    return;
  }
  *top = std::max(*top, kernels::half_kernels().max_abs_bits(v, nullptr, n));
  squares_scalar(v, n, 0, lanes);
}

}  // namespace

ValueMeasure measure_values(const float* v, size_t n) {
  double lanes[kLanes] = {};
  ValueMeasure m;
  add_squares(v, n, lanes, &m.top);
  m.squares = add_lanes(lanes);
  return m;
}

std::optional<ValueMeasure> measure_payload(const Codec& codec, const uint8_t* payload, size_t n) {
  // The library's fp16 codec, whose layout this reads (not another that
  // took its id).
  if (dynamic_cast<const Fp16Codec*>(&codec) == nullptr) return std::nullopt;
  // A block at a time, decoded into L1 as Fp16Codec::decode decodes it and
  // measured there (faster than one kernel that decodes and measures in
  // registers: the double-precision squares keep the vector units busy).
  constexpr size_t kBlock = Fp16Codec::kBlock;
  static_assert(kBlock % kLanes == 0, "a block must end on a lane boundary");
  const kernels::HalfKernels& k = kernels::half_kernels();
  const uint8_t* const halves = payload + Fp16Codec::kScaleBytes * Fp16Codec::blocks(n);
  alignas(64) float block[kBlock];
  double lanes[kLanes] = {};
  ValueMeasure m;
  kernels::for_each_block<kBlock>(n, [&](size_t b, size_t begin, size_t len) {
    k.fp16_decode(halves + 2 * begin, len,
                  kernels::load_scale(payload + Fp16Codec::kScaleBytes * b), block);
    add_squares(block, len, lanes, &m.top);
  });
  m.squares = add_lanes(lanes);
  return m;
}

ScreenConfig ScreenConfig::none() {
  ScreenConfig c;
  c.finite_check = false;
  c.max_abs = 0;
  c.replay_window = 0;
  c.norm = Norm::kOff;
  return c;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kAccepted: return "accepted";
    case Verdict::kClipped: return "clipped";
    case Verdict::kRefused: return "refused";
    case Verdict::kDeferred: return "deferred";
  }
  return "?";
}

double l2_norm(const float* v, size_t n) { return std::sqrt(measure_values(v, n).squares); }

double l2_norm_scalar(const float* v, size_t n) {
  double lanes[kLanes] = {};
  squares_scalar(v, n, 0, lanes);
  return std::sqrt(add_lanes(lanes));
}

double median_of(std::vector<double>& v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return lower / 2 + upper / 2;
}

double lower_median_of(std::vector<double>& v) {
  if (v.empty()) return 0;
  const size_t mid = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

UpdateScreen::UpdateScreen(ScreenConfig cfg, tensor::ChunkPlan plan)
    : cfg_(cfg),
      plan_(plan),
      history_(cfg.norm == ScreenConfig::Norm::kAdaptive ? plan.count() : 0),
      sent_(cfg.replay_window > 0 ? plan.count() : 0) {}

uint64_t payload_digest(const uint8_t* payload, size_t bytes) {
  return fingerprint64(payload, bytes);
}

uint64_t payload_digest(const Sha256Digest& sha) {
  uint64_t out = 0;
  for (int i = 0; i < 8; ++i) out = (out << 8) | sha[static_cast<size_t>(i)];
  return out;
}

std::optional<uint64_t> UpdateScreen::replayed(uint64_t round, uint32_t chunk, uint32_t slot,
                                               uint64_t digest) {
  std::vector<std::vector<SentDigest>>& by_slot = sent_.at(chunk);
  if (by_slot.size() <= slot) by_slot.resize(slot + 1);
  std::vector<SentDigest>& sent = by_slot[slot];
  sent.erase(std::remove_if(sent.begin(), sent.end(),
                            [&](const SentDigest& s) {
                              return s.round + cfg_.replay_window < round || s.round >= round;
                            }),
             sent.end());
  for (const SentDigest& s : sent) {
    if (s.digest == digest) return s.round;
  }
  sent.push_back({round, digest});
  return std::nullopt;
}

std::optional<std::string> UpdateScreen::value_problem(const ValuesOnDemand& values, uint32_t n,
                                                       uint32_t top) const {
  const float max_abs = static_cast<float>(cfg_.max_abs);
  // The largest magnitude came with the sum of squares; only a chunk with a
  // value to report is walked element by element to name it.
  float top_value = 0;
  std::memcpy(&top_value, &top, sizeof top_value);
  if (top < kF32Infinity && (cfg_.max_abs <= 0 || top_value <= max_abs)) return std::nullopt;
  const float* const v = values();
  for (uint32_t i = 0; i < n; ++i) {
    const float x = v[i];
    if (cfg_.finite_check && !std::isfinite(x)) {
      return "non-finite value " + number(x) + " at element " + std::to_string(i);
    }
    if (cfg_.max_abs > 0 && std::fabs(x) > max_abs) {
      return "value " + number(x) + " at element " + std::to_string(i) + " beyond max_abs " +
             number(cfg_.max_abs);
    }
  }
  return std::nullopt;
}

bool UpdateScreen::holds(uint64_t round, uint32_t chunk) const {
  if (cfg_.norm != ScreenConfig::Norm::kAdaptive) return false;
  for (const Remembered& r : history_.at(chunk)) {
    if (r.round < round && r.round + cfg_.window >= round && !r.norms.empty()) return false;
  }
  return true;
}

std::optional<double> UpdateScreen::bound(uint64_t round, uint32_t chunk) const {
  if (cfg_.norm == ScreenConfig::Norm::kOff) return std::nullopt;
  if (cfg_.norm == ScreenConfig::Norm::kAbsolute) {
    const double share =
        static_cast<double>(plan_.size(chunk)) / static_cast<double>(plan_.total());
    return cfg_.bound * std::sqrt(share);
  }
  std::vector<double> norms;
  for (const Remembered& r : history_.at(chunk)) {
    if (r.round < round && r.round + cfg_.window >= round) {
      norms.insert(norms.end(), r.norms.begin(), r.norms.end());
    }
  }
  const double median = median_of(norms);
  if (!(median > 0)) return std::nullopt;  // no history, or all zero: nothing to compare with
  return cfg_.factor * median;
}

CopyVerdict UpdateScreen::over_bound(CopyVerdict v, float* values, uint32_t n) const {
  return over_bound(
      std::move(v), [values] { return values; }, n);
}

CopyVerdict UpdateScreen::over_bound(CopyVerdict v, const ValuesOnDemand& values,
                                     uint32_t n) const {
  if (!(v.norm > v.bound)) return v;
  const std::string why = "L2 norm " + number(v.norm) + " over the bound " + number(v.bound);
  if (!cfg_.clip) {
    v.verdict = Verdict::kRefused;
    v.reason = why;
    return v;
  }
  v.verdict = Verdict::kClipped;
  v.reason = why + "; clipped to it";
  v.scale = v.bound / v.norm;
  const float s = static_cast<float>(v.scale);
  float* const x = values();
  for (uint32_t i = 0; i < n; ++i) x[i] *= s;
  return v;
}

CopyVerdict UpdateScreen::judge(uint64_t round, uint32_t chunk, uint32_t slot, uint64_t digest,
                                float* values, uint32_t n) {
  return judge(
      round, chunk, slot, digest, measure_values(values, n), [values] { return values; }, n);
}

CopyVerdict UpdateScreen::judge(uint64_t round, uint32_t chunk, uint32_t slot, uint64_t digest,
                                const ValueMeasure& measure, const ValuesOnDemand& values,
                                uint32_t n) {
  CopyVerdict v;
  const bool checked = cfg_.finite_check || cfg_.max_abs > 0;
  if (auto problem = checked ? value_problem(values, n, measure.top) : std::nullopt) {
    v.verdict = Verdict::kRefused;
    v.reason = *problem;
    v.norm = std::nan("");
    return v;
  }
  v.norm = std::sqrt(measure.squares);  // l2_norm's bits
  if (cfg_.replay_window > 0 && v.norm > 0) {
    if (auto earlier = replayed(round, chunk, slot, digest)) {
      v.verdict = Verdict::kRefused;
      v.reason = "identical to its copy of round " + std::to_string(*earlier) + " (a replay)";
      return v;
    }
  }
  if (cfg_.norm == ScreenConfig::Norm::kOff) return v;
  if (holds(round, chunk)) {
    v.verdict = Verdict::kDeferred;
    return v;
  }
  const std::optional<double> b = bound(round, chunk);
  if (!b) return v;
  v.bound = *b;
  if (cfg_.norm == ScreenConfig::Norm::kAdaptive && v.norm > v.bound) {
    // A suspect: held until the chunk closes, refused only if the copies
    // over the bound are not most of the chunk's (judge_suspects).
    v.verdict = Verdict::kDeferred;
    return v;
  }
  return over_bound(v, values, n);
}

std::vector<CopyVerdict> UpdateScreen::judge_suspects(std::vector<HeldCopy>& held,
                                                      size_t copies) const {
  std::vector<CopyVerdict> out;
  out.reserve(held.size());
  const bool stale = held.size() * 2 > copies;
  for (HeldCopy& h : held) {
    CopyVerdict v;
    v.norm = h.norm;
    v.bound = h.bound;
    if (stale) {
      v.reason = "L2 norm " + number(h.norm) + " over the bound " + number(h.bound) + ", as " +
                 std::to_string(held.size()) + " of the chunk's " + std::to_string(copies) +
                 " copies are: the bound is stale, accepted";
    } else {
      v = over_bound(v, h.values.data(), static_cast<uint32_t>(h.values.size()));
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<CopyVerdict> UpdateScreen::judge_held(std::vector<HeldCopy>& held) const {
  std::vector<double> norms;
  norms.reserve(held.size());
  for (const HeldCopy& h : held) norms.push_back(h.norm);
  const double median = lower_median_of(norms);
  std::vector<CopyVerdict> out;
  out.reserve(held.size());
  for (HeldCopy& h : held) {
    CopyVerdict v;
    v.norm = h.norm;
    if (median > 0) {
      v.bound = cfg_.factor * median;
      v = over_bound(v, h.values.data(), static_cast<uint32_t>(h.values.size()));
    }
    out.push_back(std::move(v));
  }
  return out;
}

void UpdateScreen::remember(uint64_t round, uint32_t chunk, double norm) {
  if (cfg_.norm != ScreenConfig::Norm::kAdaptive || !std::isfinite(norm)) return;
  std::vector<Remembered>& h = history_.at(chunk);
  // Rounds no later round's bound can reach are forgotten.
  h.erase(std::remove_if(h.begin(), h.end(),
                         [&](const Remembered& r) { return r.round + cfg_.window < round; }),
          h.end());
  auto it = std::find_if(h.begin(), h.end(), [&](const Remembered& r) { return r.round == round; });
  if (it == h.end()) {
    h.push_back({round, {}});
    it = h.end() - 1;
  }
  it->norms.push_back(norm);
}

}  // namespace fedwan::aggregation
