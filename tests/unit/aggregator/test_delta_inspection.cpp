// What a parent works out from a child's delta frame on the crypto thread
// that opened it: the digest, the codec's check of the payload and the
// screen's measure of its values (fp16), which
// the event loop then takes in place of passing over the bytes again. They
// hold for the very payload they came from, never for another.
#include "aggregator/delta_inspection.hpp"

#include <gtest/gtest.h>

#include <any>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "aggregation/update_screen.hpp"

namespace fedwan::aggregator {
namespace {

constexpr uint32_t kElements = 1000;

std::vector<uint8_t> delta_frame(const Codec& codec, float value, uint8_t flags = 0) {
  std::vector<float> v(kElements);
  for (uint32_t i = 0; i < kElements; ++i) v[i] = value * float(i % 17);
  std::vector<uint8_t> payload(codec.encoded_size(kElements));
  codec.encode(v.data(), v.size(), nullptr, payload.data());
  wire::FrameHeader h;
  h.type = wire::MsgType::kDelta;
  h.codec = static_cast<uint8_t>(codec.id());
  h.flags = flags;
  h.round = 3;
  h.chunk_index = 1;
  h.chunk_count = 4;
  h.element_count = kElements;
  h.total_elements = 4 * kElements;
  h.weight = 1.0;
  return wire::encode_frame(h, payload.data(), payload.size());
}

wire::ParsedFrame parsed(const std::vector<uint8_t>& frame) {
  wire::ParsedFrame f = wire::parse_frame(frame.data(), frame.size());
  EXPECT_TRUE(f.ok()) << f.detail;
  return f;
}

TEST(DeltaInspection, AFrameWithValuesIsCheckedAndDigestedOnce) {
  for (const char* name : {"fp16", "bf16", "int8", "fp32"}) {
    SCOPED_TRACE(name);
    const Codec& codec = codec_by_name(name);
    const std::vector<uint8_t> frame = delta_frame(codec, 0.25f);
    const wire::ParsedFrame f = parsed(frame);
    const std::any fingerprinted = delta_inspector(false)(frame.data(), frame.size());
    const DeltaFacts* facts = delta_facts(fingerprinted, f);
    ASSERT_NE(facts, nullptr);
    EXPECT_TRUE(facts->valid);
    EXPECT_FALSE(facts->sha);
    EXPECT_EQ(facts->fingerprint, aggregation::payload_digest(f.payload, f.payload_size));
    // The screen's measure, where it is read from the payload (fp16).
    const auto measure = aggregation::measure_payload(codec, f.payload, kElements);
    ASSERT_EQ(facts->measure.has_value(), measure.has_value());
    if (measure) {
      EXPECT_EQ(facts->measure->squares, measure->squares);
      EXPECT_EQ(facts->measure->top, measure->top);
    }
    EXPECT_EQ(payload_facts(facts, nullptr).measure.has_value(), measure.has_value());
    const std::any hashed = delta_inspector(true)(frame.data(), frame.size());
    facts = delta_facts(hashed, f);
    ASSERT_NE(facts, nullptr);
    EXPECT_EQ(facts->sha, sha256(f.payload, f.payload_size));
    EXPECT_FALSE(facts->fingerprint);
    const aggregation::PayloadFacts known = payload_facts(facts, &*facts->sha);
    EXPECT_TRUE(known.valid);
    EXPECT_EQ(known.sha, &*facts->sha);
  }
}

TEST(DeltaInspection, AMalformedPayloadIsFoundSo) {
  const Codec& fp16 = codec_by_name("fp16");
  std::vector<uint8_t> frame = delta_frame(fp16, 0.25f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(frame.data() + wire::kHeaderSize, &nan, sizeof nan);  // the first block's scale
  const wire::ParsedFrame f = parsed(frame);
  ASSERT_FALSE(fp16.validate(f.payload, f.payload_size, kElements));
  const std::any a = delta_inspector(false)(frame.data(), frame.size());
  const DeltaFacts* facts = delta_facts(a, f);
  ASSERT_NE(facts, nullptr);
  EXPECT_FALSE(facts->valid);
  EXPECT_FALSE(facts->measure) << "nothing measured of a payload that failed its check";
  EXPECT_FALSE(payload_facts(facts, nullptr).valid);
}

TEST(DeltaInspection, NothingForAnyOtherFrame) {
  const auto inspect = delta_inspector(true);
  wire::FrameHeader hb;
  hb.type = wire::MsgType::kHeartbeat;
  const std::vector<uint8_t> heartbeat = wire::encode_frame(hb, nullptr, 0);
  EXPECT_FALSE(inspect(heartbeat.data(), heartbeat.size()).has_value());
  std::vector<uint8_t> garbage(200, 0xab);
  EXPECT_FALSE(inspect(garbage.data(), garbage.size()).has_value());
  const std::vector<uint8_t> frame = delta_frame(codec_by_name("fp16"), 1.0f);
  EXPECT_FALSE(inspect(frame.data(), frame.size() - 1).has_value()) << "cut short";
  EXPECT_FALSE(inspect(frame.data(), 10).has_value());
}

// Facts are taken only for the payload they came from: not for the same
// bytes elsewhere (another frame's buffer), not from another answer's type.
TEST(DeltaInspection, FactsHoldForTheirOwnPayloadAlone) {
  const std::vector<uint8_t> frame = delta_frame(codec_by_name("fp16"), 1.0f);
  const std::any a = delta_inspector(false)(frame.data(), frame.size());
  ASSERT_NE(delta_facts(a, parsed(frame)), nullptr);
  const std::vector<uint8_t> copy = frame;
  EXPECT_EQ(delta_facts(a, parsed(copy)), nullptr);
  EXPECT_EQ(delta_facts(std::any(), parsed(frame)), nullptr);
  EXPECT_EQ(delta_facts(std::any(42), parsed(frame)), nullptr);
  wire::ParsedFrame shorter = parsed(frame);
  shorter.payload_size -= 2;
  EXPECT_EQ(delta_facts(a, shorter), nullptr);
  wire::ParsedFrame other_count = parsed(frame);
  other_count.header.element_count -= 1;
  EXPECT_EQ(delta_facts(a, other_count), nullptr);
  EXPECT_EQ(payload_facts(nullptr, nullptr).fingerprint, std::nullopt);
}

// The accumulator takes a fingerprint it is given for the replay check (two
// different payloads given one fingerprint are the same copy to it), and
// checks a payload itself unless told it passed.
TEST(DeltaInspection, TheAccumulatorTakesWhatItIsGiven) {
  const Codec& fp16 = codec_by_name("fp16");
  tensor::ChunkPlan plan{2 * kElements, kElements};
  aggregation::ScreenConfig screen;  // the replay check of a federation's defaults
  screen.norm = aggregation::ScreenConfig::Norm::kOff;
  aggregation::RoundAccumulator acc{plan, {7}, nullptr, screen};
  aggregation::PayloadFacts known;
  known.fingerprint = 0x1234;
  for (uint64_t round : {1, 2}) {
    acc.open(round);
    const std::vector<uint8_t> frame = delta_frame(fp16, float(round));
    const wire::ParsedFrame f = parsed(frame);
    const auto r = acc.add(round, 7, 0, kElements, 1.0, fp16, f.payload, f.payload_size, 0, known);
    EXPECT_EQ(r.outcome,
              round == 1 ? aggregation::AddOutcome::kAccepted : aggregation::AddOutcome::kRefused)
        << round;
    std::vector<uint8_t> bad = frame;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(bad.data() + wire::kHeaderSize, &nan, sizeof nan);
    const wire::ParsedFrame g = parsed(bad);
    aggregation::PayloadFacts unchecked;  // valid: false
    const auto m =
        acc.add(round, 7, 1, kElements, 1.0, fp16, g.payload, g.payload_size, 0, unchecked);
    EXPECT_EQ(m.outcome, aggregation::AddOutcome::kRefused);
    EXPECT_NE(m.verdict.reason.find("malformed"), std::string::npos) << m.verdict.reason;
    (void)acc.take(0);
    (void)acc.take(1);
  }
}

}  // namespace
}  // namespace fedwan::aggregator
