// The screen's measure of an fp16 copy taken from its payload a block at a
// time, and the copy decoded only where the rule or the screen needs its
// values: the same bits, verdicts and sums as judging and adding the
// decoded values, which an fp32 copy of those very values still goes
// through.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aggregation/aggregation_rule.hpp"
#include "aggregation/round_accumulator.hpp"
#include "aggregation/update_screen.hpp"
#include "codec/half.hpp"
#include "fedwan/codec.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::aggregation {
namespace {

std::vector<float> wave(size_t n, float amplitude, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = amplitude * static_cast<float>(std::sin(0.37 * double(i) + seed) *
                                          std::pow(10.0, double((i + seed) % 5) - 2));
  }
  return v;
}

std::vector<uint8_t> fp16_payload(const std::vector<float>& v) {
  const Codec& fp16 = codec_by_name("fp16");
  std::vector<uint8_t> out(fp16.encoded_size(v.size()));
  fp16.encode(v.data(), v.size(), nullptr, out.data());
  return out;
}

std::vector<float> decoded(const std::vector<uint8_t>& payload, size_t n) {
  std::vector<float> v(n);
  codec_by_name("fp16").decode(payload.data(), n, v.data());
  return v;
}

TEST(PayloadMeasure, IsTheMeasureOfTheDecodedValuesBitForBit) {
  const Codec& fp16 = codec_by_name("fp16");
  for (const size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{2047}, size_t{2048},
                         size_t{2049}, size_t{4097}, size_t{10000}, size_t{262144}}) {
    std::vector<float> v = wave(n, 3.0f, static_cast<uint32_t>(n));
    if (n > 4096) std::fill(v.begin() + 2048, v.begin() + 4096, 0.0f);  // an all-zero block
    const std::vector<uint8_t> payload = fp16_payload(v);
    ASSERT_TRUE(fp16.validate(payload.data(), payload.size(), n));
    const std::optional<ValueMeasure> got = measure_payload(fp16, payload.data(), n);
    ASSERT_TRUE(got.has_value()) << n;
    const std::vector<float> x = decoded(payload, n);
    const ValueMeasure want = measure_values(x.data(), n);
    EXPECT_EQ(std::memcmp(&got->squares, &want.squares, sizeof want.squares), 0)
        << n << ": " << got->squares << " " << want.squares;
    EXPECT_EQ(got->top, want.top) << n;
    EXPECT_EQ(got->top, kernels::scalar_half_kernels().max_abs_bits(x.data(), nullptr, n)) << n;
    const double norm = std::sqrt(got->squares);
    const double plain = l2_norm_scalar(x.data(), n);
    EXPECT_EQ(std::memcmp(&norm, &plain, sizeof norm), 0) << n;
  }
}

// Another codec, even one that took the fp16 codec's id, is measured from
// its decoded values instead.
class NotTheFp16Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kFp16; }
  std::string_view name() const override { return "not-fp16"; }
  size_t encoded_size(size_t n) const override { return 4 * n; }
  void encode(const float* in, size_t n, float*, uint8_t* out) const override {
    std::memcpy(out, in, 4 * n);
  }
  bool validate(const uint8_t*, size_t bytes, size_t n) const override { return bytes == 4 * n; }
  void decode(const uint8_t* in, size_t n, float* out) const override {
    std::memcpy(out, in, 4 * n);
  }
  void decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const override {
    for (size_t i = 0; i < n; ++i) {
      float x = 0;
      std::memcpy(&x, in + 4 * i, 4);
      acc[i] = acc[i] + weight * x;
    }
  }
};

TEST(PayloadMeasure, OnlyTheLibrarysFp16CodecIsReadInBlocks) {
  const std::vector<float> v = wave(100, 1.0f, 1);
  for (const char* name : {"bf16", "int8", "fp32"}) {
    const Codec& c = codec_by_name(name);
    std::vector<uint8_t> payload(c.encoded_size(v.size()));
    c.encode(v.data(), v.size(), nullptr, payload.data());
    EXPECT_FALSE(measure_payload(c, payload.data(), v.size()).has_value()) << name;
  }
  NotTheFp16Codec other;
  std::vector<uint8_t> payload(other.encoded_size(v.size()));
  other.encode(v.data(), v.size(), nullptr, payload.data());
  EXPECT_FALSE(measure_payload(other, payload.data(), v.size()).has_value());
}

// One round's copies, sent to two accumulators alike but for the codec: as
// fp16 payloads to one, as fp32 payloads of their decoded values to the
// other (judged and added from those values). Every outcome, verdict and
// mean must agree to the bit.
struct Copy {
  uint32_t sender;
  uint32_t chunk;
  double weight;
  std::vector<float> values;  // encoded as fp16
};

struct RoundCase {
  std::string name;
  ScreenConfig screen;
  std::string rule = kWeightedMean;
  bool park = false;         // every chunk waiting for copies waits on disk
  double privacy_clip = 0;   // on sender 2's copies, when > 0
  std::vector<Copy> copies;  // in arrival order
  // A verdict the round must give at least once (at once or at the close).
  std::optional<Verdict> meets;
};

void expect_same_round(const RoundCase& s) {
  SCOPED_TRACE(s.name);
  const tensor::ChunkPlan plan(3 * 5000, 5000);
  const Codec& fp16 = codec_by_name("fp16");
  const Codec& fp32 = codec_by_name("fp32");
  testing::TempDir dir;
  std::unique_ptr<RoundAccumulator> acc[2];
  for (auto& a : acc) {
    a = std::make_unique<RoundAccumulator>(plan, std::vector<uint32_t>{1, 2, 3}, make_rule(s.rule),
                                           s.screen);
    if (s.park) a->park_beyond(0, dir.path().string(), "test");
    if (s.privacy_clip > 0) a->clip_copies_of(2, s.privacy_clip);
    a->open(4, 0.5);
  }
  std::vector<Verdict> seen;
  for (const Copy& c : s.copies) {
    const std::vector<uint8_t> half = fp16_payload(c.values);
    const std::vector<float> x = decoded(half, c.values.size());
    std::vector<uint8_t> full(4 * x.size());
    std::memcpy(full.data(), x.data(), full.size());
    const auto n = static_cast<uint32_t>(x.size());
    const auto a = acc[0]->add(4, c.sender, c.chunk, n, c.weight, fp16, half.data(), half.size());
    const auto b = acc[1]->add(4, c.sender, c.chunk, n, c.weight, fp32, full.data(), full.size());
    EXPECT_EQ(a.outcome, b.outcome) << c.sender << "/" << c.chunk;
    EXPECT_EQ(a.chunk_complete, b.chunk_complete);
    EXPECT_EQ(a.verdict.verdict, b.verdict.verdict) << b.verdict.reason;
    EXPECT_EQ(a.verdict.reason, b.verdict.reason);
    EXPECT_EQ(std::isnan(a.verdict.norm) ? -1.0 : a.verdict.norm,
              std::isnan(b.verdict.norm) ? -1.0 : b.verdict.norm);
    EXPECT_EQ(a.verdict.scale, b.verdict.scale);
    seen.push_back(a.verdict.verdict);
  }
  EXPECT_EQ(acc[0]->privacy_clipped(), acc[1]->privacy_clipped());
  if (s.privacy_clip > 0) EXPECT_GT(acc[0]->privacy_clipped(), 0u);
  if (s.park) EXPECT_GT(acc[0]->chunks_parked(), 0u);
  for (uint32_t c = 0; c < plan.count(); ++c) {
    if (!acc[1]->chunk_quorate(c)) {
      EXPECT_FALSE(acc[0]->chunk_quorate(c)) << c;
      continue;
    }
    const ChunkSum a = acc[0]->take(c);
    const ChunkSum b = acc[1]->take(c);
    EXPECT_EQ(a.weight, b.weight) << c;
    EXPECT_EQ(a.excused, b.excused) << c;
    EXPECT_EQ(a.behind, b.behind) << c;
    ASSERT_EQ(a.mean.size(), b.mean.size()) << c;
    EXPECT_EQ(std::memcmp(a.mean.data(), b.mean.data(), a.mean.size() * sizeof(float)), 0) << c;
    ASSERT_EQ(a.late.size(), b.late.size()) << c;
    for (size_t i = 0; i < a.late.size(); ++i) {
      EXPECT_EQ(a.late[i].verdict.verdict, b.late[i].verdict.verdict);
      EXPECT_EQ(a.late[i].verdict.reason, b.late[i].verdict.reason);
      seen.push_back(a.late[i].verdict.verdict);
    }
  }
  if (s.meets) {
    EXPECT_NE(std::find(seen.begin(), seen.end(), *s.meets), seen.end())
        << "never " << verdict_name(*s.meets);
  }
}

std::vector<Copy> honest_round() {
  std::vector<Copy> out;
  for (uint32_t chunk = 0; chunk < 3; ++chunk) {
    for (uint32_t sender = 1; sender <= 3; ++sender) {
      out.push_back({sender, chunk, 1.0 + sender, wave(5000, 1.0f + 0.1f * float(sender), sender)});
    }
  }
  return out;
}

TEST(ScreenedFp16Copies, MeetTheVerdictsAndSumsOfTheirDecodedValues) {
  std::vector<RoundCase> cases;
  {
    RoundCase s{"no checks", ScreenConfig::none()};
    s.copies = honest_round();
    cases.push_back(s);
  }
  {
    RoundCase s{"defaults, the first round held", ScreenConfig()};
    s.screen.replay_window = 0;
    s.copies = honest_round();
    s.copies[4].values = wave(5000, 40.0f, 9);  // sender 2, chunk 1: the suspect
    s.meets = Verdict::kRefused;
    cases.push_back(s);
  }
  {
    RoundCase s{"a value beyond max_abs, named", ScreenConfig::none()};
    s.screen.max_abs = 50;
    s.copies = honest_round();
    s.copies[7].values[4321] = 60.0f;
    s.meets = Verdict::kRefused;
    cases.push_back(s);
  }
  for (const bool clip : {false, true}) {
    RoundCase s{clip ? "an absolute bound, clipped" : "an absolute bound, refused",
                ScreenConfig::none()};
    s.screen.norm = ScreenConfig::Norm::kAbsolute;
    s.screen.bound = 400;
    s.screen.clip = clip;
    s.copies = honest_round();
    for (Copy& c : s.copies) {
      if (c.sender == 3) c.values = wave(5000, 30.0f, 3);
    }
    s.meets = clip ? Verdict::kClipped : Verdict::kRefused;
    cases.push_back(s);
  }
  {
    RoundCase s{"parked on disk", ScreenConfig()};
    s.screen.replay_window = 0;
    s.screen.norm = ScreenConfig::Norm::kOff;
    s.park = true;
    s.copies = honest_round();
    cases.push_back(s);
  }
  {
    RoundCase s{"privacy clip", ScreenConfig::none()};
    s.privacy_clip = 1.0;
    s.copies = honest_round();
    cases.push_back(s);
  }
  for (const char* rule : {"median", "trimmed_mean"}) {
    RoundCase s{rule, ScreenConfig::none(), rule};
    s.copies = honest_round();
    cases.push_back(s);
  }
  for (const RoundCase& s : cases) expect_same_round(s);
}

// The weighted mean folds an fp16 copy in as it decodes it: into a buffer
// used before, first, and onto the sum after.
TEST(ScreenedFp16Copies, TheWeightedMeanAddsAPayloadAsItsDecoding) {
  const Codec& fp16 = codec_by_name("fp16");
  const std::vector<float> a = wave(3000, 2.0f, 1), b = wave(3000, 0.5f, 2);
  const std::vector<uint8_t> pa = fp16_payload(a), pb = fp16_payload(b);
  const std::vector<float> xa = decoded(pa, 3000), xb = decoded(pb, 3000);
  const auto rule = make_rule(kWeightedMean);
  std::vector<float> used(3000, std::numeric_limits<float>::quiet_NaN());
  auto from_payloads = rule->begin_chunk_reusing(3000, 2, std::move(used));
  std::vector<float> scratch;
  from_payloads->add_encoded(0, fp16, pa.data(), 3000, 0.75, scratch);
  from_payloads->add_encoded(1, fp16, pb.data(), 3000, 2.5, scratch);
  EXPECT_TRUE(scratch.empty()) << "no decoded copy on the side";
  auto from_values = rule->begin_chunk(3000, 2);
  from_values->add(0, xa.data(), 0.75);
  from_values->add(1, xb.data(), 2.5);
  const Combined x = from_payloads->finish(), y = from_values->finish();
  EXPECT_EQ(x.weight, y.weight);
  ASSERT_EQ(x.values.size(), y.values.size());
  EXPECT_EQ(std::memcmp(x.values.data(), y.values.data(), x.values.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace fedwan::aggregation
