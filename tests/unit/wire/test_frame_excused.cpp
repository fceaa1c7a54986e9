// A delta's excused weight (wire/frame.hpp, kFlagExcused, kFlagNoValues):
// what encode_delta_frame writes, what parse_frame hands back (the codec
// bytes apart from the trailer) and every malformed shape it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "frame_test_util.hpp"
#include "wire/frame.hpp"

namespace fedwan::wire {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Chunk 1 of 3, 600 of 1500 elements, header weight 6000.
FrameHeader delta_header(const Codec& codec = fp16()) {
  return data_header(MsgType::kDelta, codec, 600, 1500, 1, 3);
}

Bytes excused_frame(double excused, const Codec& codec = fp16()) {
  const Bytes values = codec_bytes(codec, 600);
  return encode_delta_frame(delta_header(codec), values.data(), values.size(), excused);
}

Bytes no_values_frame(double excused) {
  return encode_delta_frame(delta_header(), nullptr, 0, excused);
}

size_t trailer_offset(const Bytes& b) { return b.size() - kExcusedTrailerSize; }

TEST(FrameExcused, ValuesAndTrailerRoundTripEveryCodec) {
  for (const Codec* c : all_codecs()) {
    SCOPED_TRACE(std::string(c->name()));
    const Bytes values = codec_bytes(*c, 600);
    Bytes b = excused_frame(1234.5, *c);
    ASSERT_EQ(b.size(), kHeaderSize + values.size() + kExcusedTrailerSize);
    EXPECT_EQ(b[kOffFlags], kFlagExcused);
    ParsedFrame f = parse_frame(b.data(), b.size());
    ASSERT_TRUE(f.ok()) << f.detail;
    EXPECT_EQ(f.header.flags, kFlagExcused);
    EXPECT_EQ(f.header.weight, 6000.0);
    EXPECT_EQ(f.header.payload_length, values.size() + kExcusedTrailerSize);
    EXPECT_EQ(f.excused_weight, 1234.5);
    EXPECT_EQ(f.payload, b.data() + kHeaderSize);
    ASSERT_EQ(f.payload_size, c->encoded_size(600));
    EXPECT_TRUE(std::equal(values.begin(), values.end(), f.payload));
  }
}

TEST(FrameExcused, NoValuesCarriesTheTrailerAloneAndNoWeight) {
  Bytes b = no_values_frame(3.0);
  ASSERT_EQ(b.size(), kHeaderSize + kExcusedTrailerSize);
  EXPECT_EQ(b[kOffFlags], kFlagExcused | kFlagNoValues);
  ParsedFrame f = parse_frame(b.data(), b.size());
  ASSERT_TRUE(f.ok()) << f.detail;
  EXPECT_EQ(f.header.weight, 0.0);
  EXPECT_FALSE(std::signbit(f.header.weight));
  EXPECT_EQ(f.header.element_count, 600u);  // the chunk it stands for
  EXPECT_EQ(f.payload_size, 0u);
  EXPECT_EQ(f.excused_weight, 3.0);
}

TEST(FrameExcused, NothingExcusedIsAPlainDelta) {
  const Bytes values = codec_bytes(fp16(), 600);
  Bytes b = excused_frame(0.0);
  EXPECT_EQ(b, encode_frame(delta_header(), values.data(), values.size()));
  EXPECT_EQ(b, excused_frame(-0.0));
  ParsedFrame f = parse_frame(b.data(), b.size());
  ASSERT_TRUE(f.ok()) << f.detail;
  EXPECT_EQ(f.header.flags, 0);
  EXPECT_EQ(f.excused_weight, 0.0);
  EXPECT_EQ(f.payload_size, values.size());
}

TEST(FrameExcused, EncoderOwnsTheDeltaFlagsAndRefusesWhatCannotBeSent) {
  FrameHeader h = delta_header();
  h.flags = kFlagNoValues | kFlagExcused;  // stale bits from a caller
  const Bytes values = codec_bytes(fp16(), 600);
  Bytes plain = encode_delta_frame(h, values.data(), values.size(), 0.0);
  EXPECT_EQ(plain[kOffFlags], 0);
  Bytes excused = encode_delta_frame(h, values.data(), values.size(), 2.0);
  EXPECT_EQ(excused[kOffFlags], kFlagExcused);

  for (double bad : {-1.0, -kInf, kInf, kNaN}) {
    EXPECT_THROW(encode_delta_frame(delta_header(), values.data(), values.size(), bad),
                 ProtocolError)
        << bad;
  }
  FrameHeader anchor = data_header(MsgType::kAnchor, fp16(), 600, 1500, 1, 3);
  EXPECT_THROW(encode_delta_frame(anchor, values.data(), values.size(), 2.0), ProtocolError);
  EXPECT_THROW(encode_delta_frame(anchor, values.data(), values.size(), 0.0), ProtocolError);
}

TEST(FrameExcused, NoValuesWithoutExcusedIsReserved) {
  Bytes b = data_frame(MsgType::kDelta, fp16());
  b[kOffFlags] = kFlagNoValues;
  EXPECT_EQ(reason(b), RejectReason::kBadReserved);
  Bytes n = no_values_frame(3.0);
  n[kOffFlags] = kFlagNoValues;
  ParsedFrame f = parse_frame(n.data(), n.size());
  EXPECT_EQ(f.reject, RejectReason::kBadReserved);
  EXPECT_NE(f.detail.find("without excused weight"), std::string::npos) << f.detail;
}

TEST(FrameExcused, TrailerMustBeFinitePositive) {
  for (double w : {0.0, -0.0, -1.0, kInf, -kInf, kNaN}) {
    for (Bytes b : {excused_frame(5.0), no_values_frame(5.0)}) {
      set_f64(b, trailer_offset(b), w);
      ParsedFrame f = parse_frame(b.data(), b.size());
      EXPECT_EQ(f.reject, RejectReason::kBadWeight) << w << ": " << f.detail;
      EXPECT_EQ(f.excused_weight, 0.0);
      EXPECT_EQ(f.payload, nullptr);
    }
  }
  Bytes tiny = excused_frame(5.0);
  set_f64(tiny, trailer_offset(tiny), std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(reason(tiny), RejectReason::kNone);
}

TEST(FrameExcused, HeaderWeightFollowsTheValues) {
  // Without values nothing stands behind a weight: +0.0 alone is accepted.
  for (double w : {-0.0, 1.0, -1.0, kNaN, kInf}) {
    Bytes b = no_values_frame(5.0);
    set_f64(b, kOffWeight, w);
    EXPECT_EQ(reason(b), RejectReason::kBadWeight) << w;
  }
  // With values the weight is what it always was: finite and > 0.
  for (double w : {0.0, -0.0, -1.0, kNaN, kInf}) {
    Bytes b = excused_frame(5.0);
    set_f64(b, kOffWeight, w);
    EXPECT_EQ(reason(b), RejectReason::kBadWeight) << w;
  }
}

// The payload length is judged against the flags; resizing the frame and its
// length field together keeps the length check itself satisfied.
Bytes with_payload_length(Bytes b, size_t length) {
  b.resize(kHeaderSize + length, 0x3f);
  set_u32(b, kOffPayloadLen, static_cast<uint32_t>(length));
  return b;
}

TEST(FrameExcused, PayloadLengthOffByOneEitherWay) {
  const size_t values = fp16().encoded_size(600);
  for (size_t length :
       {values + kExcusedTrailerSize - 1, values + kExcusedTrailerSize + 1, values}) {
    ParsedFrame f =
        parse_frame(with_payload_length(excused_frame(5.0), length).data(), kHeaderSize + length);
    EXPECT_EQ(f.reject, RejectReason::kBadPayloadSize) << length << ": " << f.detail;
  }
  for (size_t length : {kExcusedTrailerSize - 1, kExcusedTrailerSize + 1, size_t{0}, values,
                        values + kExcusedTrailerSize}) {
    Bytes b = with_payload_length(no_values_frame(5.0), length);
    ParsedFrame f = parse_frame(b.data(), b.size());
    EXPECT_EQ(f.reject, RejectReason::kBadPayloadSize) << length << ": " << f.detail;
  }
  // A plain delta carrying a trailer it does not announce is refused too.
  Bytes plain = excused_frame(5.0);
  plain[kOffFlags] = 0;
  EXPECT_EQ(reason(plain), RejectReason::kBadPayloadSize);
}

TEST(FrameExcused, ExcusedIsNotAnAnchorFlag) {
  Bytes b = data_frame(MsgType::kAnchor, fp16());
  b[kOffFlags] = kFlagFullAnchor | kFlagExcused;
  EXPECT_EQ(reason(b), RejectReason::kBadReserved);
  b[kOffFlags] = kFlagExcused;
  EXPECT_EQ(reason(b), RejectReason::kBadReserved);
  // On an anchor, 0x01 is kFlagFullAnchor, not kFlagNoValues.
  b[kOffFlags] = kFlagNoValues;
  EXPECT_EQ(reason(b), RejectReason::kNone);
}

TEST(FrameExcused, EveryTruncationIsRejected) {
  for (const Bytes& full : {excused_frame(5.0), no_values_frame(5.0)}) {
    for (size_t len = kHeaderSize; len < full.size(); ++len) {
      ParsedFrame f = parse_frame(full.data(), len);
      ASSERT_EQ(f.reject, RejectReason::kLengthMismatch) << len << ": " << f.detail;
    }
  }
}

}  // namespace
}  // namespace fedwan::wire
