// The frame codec (wire/frame.hpp): the header layout, round trips of every
// type and codec, and what parse_frame refuses field by field, on truncation,
// trailing bytes and a wrong payload size; fuzzed frames never crash or lie.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fedwan/codec.hpp"
#include "frame_test_util.hpp"
#include "wire/frame.hpp"

namespace fedwan::wire {
namespace {

TEST(Frame, HeaderLayoutIsLittleEndianFwan) {
  Bytes b = data_frame(MsgType::kDelta, fp16());
  const size_t need = fp16().encoded_size(600);
  ASSERT_EQ(b.size(), kHeaderSize + need);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "FWAN");
  EXPECT_EQ(b[kOffVersion], 13);
  EXPECT_EQ(b[kOffType], 4);
  EXPECT_EQ(b[kOffCodec], static_cast<uint8_t>(CodecId::kFp16));
  EXPECT_EQ(b[kOffElements], 600 & 0xff);
  EXPECT_EQ(b[kOffElements + 1], 600 >> 8);
  EXPECT_EQ(b[kOffPayloadLen], need & 0xff);
  EXPECT_EQ(b[kOffPayloadLen + 1], need >> 8);
}

TEST(Frame, EveryTypeRoundTrips) {
  for (MsgType t : kAllTypes) {
    Bytes b =
        t == MsgType::kAnchor || t == MsgType::kDelta ? data_frame(t, fp16()) : control_frame(t);
    ParsedFrame f = parse_frame(b.data(), b.size());
    ASSERT_TRUE(f.ok()) << msg_type_name(t) << ": " << f.detail;
    EXPECT_EQ(f.header.type, t);
    EXPECT_EQ(f.payload, b.data() + kHeaderSize);
    EXPECT_EQ(f.payload_size, b.size() - kHeaderSize);
    EXPECT_EQ(f.header.payload_length, f.payload_size);
    Bytes again(kHeaderSize);
    encode_header(f.header, again.data());
    EXPECT_TRUE(std::equal(again.begin(), again.end(), b.begin())) << msg_type_name(t);
  }
}

TEST(Frame, DataRoundTripsEveryCodecAndKeepsFields) {
  for (const Codec* c : all_codecs()) {
    for (MsgType t : {MsgType::kAnchor, MsgType::kDelta}) {
      Bytes b = data_frame(t, *c, 5, 11, 2, 3);
      ParsedFrame f = parse_frame(b.data(), b.size());
      ASSERT_TRUE(f.ok()) << c->name() << ": " << f.detail;
      EXPECT_EQ(f.header.codec, static_cast<uint8_t>(c->id()));
      EXPECT_EQ(f.header.job_id, 0x0123456789abcdefull);
      EXPECT_EQ(f.header.round, 42u);
      EXPECT_EQ(f.header.sender, 7u);
      EXPECT_EQ(f.header.chunk_index, 2u);
      EXPECT_EQ(f.header.chunk_count, 3u);
      EXPECT_EQ(f.header.element_count, 5u);
      EXPECT_EQ(f.header.total_elements, 11u);
      EXPECT_EQ(f.header.weight, t == MsgType::kDelta ? 6000.0 : 0.0);
      EXPECT_EQ(f.payload_size, c->encoded_size(5));
    }
  }
}

TEST(Frame, EmptyControlPayloadIsFine) {
  Bytes b = control_frame(MsgType::kDone, {});
  EXPECT_EQ(reason(b), RejectReason::kNone);
}

TEST(Frame, FieldsWithoutConstraintsAcceptAnyValue) {
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
    Bytes b = data_frame(MsgType::kDelta, fp16());
    set_u64(b, 8, v);                          // job_id
    set_u64(b, 16, v);                         // round
    set_u32(b, 24, static_cast<uint32_t>(v));  // sender
    EXPECT_EQ(reason(b), RejectReason::kNone) << v;
  }
}

TEST(Frame, BadMagicVersionTypeReserved) {
  for (size_t i = 0; i < 4; ++i) {
    Bytes b = data_frame(MsgType::kDelta, fp16());
    b[i] ^= 0x20;
    EXPECT_EQ(reason(b), RejectReason::kBadMagic) << i;
  }
  for (uint8_t v : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 255}) {
    Bytes b = data_frame(MsgType::kDelta, fp16());
    b[kOffVersion] = v;
    EXPECT_EQ(reason(b), RejectReason::kBadVersion) << int{v};
  }
  for (uint8_t v : {0, 11, 200, 255}) {
    Bytes b = control_frame(MsgType::kHello);
    b[kOffType] = v;
    EXPECT_EQ(reason(b), RejectReason::kBadType) << int{v};
  }
  // The order field (once reserved) is the sealer's: parse_frame takes any
  // value and it reads as 0 when encoded.
  EXPECT_EQ(get_u32(data_frame(MsgType::kDelta, fp16()), kOffOrder), 0u);
  for (uint32_t v : {1u, 0x80000000u, 0xffffffffu}) {
    Bytes b = data_frame(MsgType::kDelta, fp16());
    set_u32(b, kOffOrder, v);
    EXPECT_EQ(reason(b), RejectReason::kNone) << v;
  }
}

TEST(Frame, CodecMustBeKnownOnDataAndZeroOnControl) {
  for (int id = 0; id < 256; ++id) {
    Bytes b = data_frame(MsgType::kDelta, fp16());
    b[kOffCodec] = static_cast<uint8_t>(id);
    if (codec_by_wire_id(static_cast<uint8_t>(id)) == nullptr) {
      EXPECT_EQ(reason(b), RejectReason::kBadCodec) << id;
    }
  }
  for (MsgType t : kControlTypes) {
    for (int id = 1; id < 256; id += 17) {
      Bytes b = control_frame(t);
      b[kOffCodec] = static_cast<uint8_t>(id);
      EXPECT_EQ(reason(b), RejectReason::kBadCodec) << msg_type_name(t) << " codec " << id;
    }
  }
}

TEST(Frame, FlagsOnlyWhereDefined) {
  Bytes anchor = data_frame(MsgType::kAnchor, fp16());
  anchor[kOffFlags] = 0;  // an update anchor, not full values
  EXPECT_EQ(reason(anchor), RejectReason::kNone);
  anchor[kOffFlags] = kFlagFullAnchor | 0x80;
  EXPECT_EQ(reason(anchor), RejectReason::kBadReserved);

  Bytes delta = data_frame(MsgType::kDelta, fp16());
  for (uint8_t flag : {0x08, 0x10, 0x20, 0x40, 0x80}) {
    delta[kOffFlags] = flag;
    EXPECT_EQ(reason(delta), RejectReason::kBadReserved) << int{flag};
  }

  Bytes welcome = control_frame(MsgType::kWelcome);
  EXPECT_EQ(reason(welcome), RejectReason::kNone);
  welcome[kOffFlags] = kFlagFullAnchor;
  EXPECT_EQ(reason(welcome), RejectReason::kBadReserved);

  Bytes hello = control_frame(MsgType::kHello);
  hello[kOffFlags] = kFlagNoChange;
  EXPECT_EQ(reason(hello), RejectReason::kBadReserved);
}

TEST(Frame, ChunkFields) {
  FrameLimits lim;
  auto with = [](size_t off, uint32_t v) {
    Bytes b = data_frame(MsgType::kDelta, fp16());  // chunk 1 of 3, 600 of 1500
    set_u32(b, off, v);
    return b;
  };
  EXPECT_EQ(reason(with(kOffChunkIndex, 3)), RejectReason::kBadChunk);
  EXPECT_EQ(reason(with(kOffChunkIndex, 0xffffffffu)), RejectReason::kBadChunk);
  EXPECT_EQ(reason(with(kOffChunkCount, 0)), RejectReason::kBadChunk);
  EXPECT_EQ(reason(with(kOffChunkCount, 1)), RejectReason::kBadChunk);  // index 1 >= 1
  EXPECT_EQ(reason(with(kOffChunkCount, lim.max_chunk_count + 1)), RejectReason::kBadChunk);
  EXPECT_EQ(reason(with(kOffChunkIndex, 2)), RejectReason::kNone);

  // More chunks than elements: each chunk holds at least one.
  Bytes b = data_frame(MsgType::kDelta, fp16(), 1, 4, 0, 5);
  EXPECT_EQ(reason(b), RejectReason::kBadChunk);
  b = data_frame(MsgType::kDelta, fp16(), 1, 5, 4, 5);
  EXPECT_EQ(reason(b), RejectReason::kNone);
}

TEST(Frame, ElementFields) {
  FrameLimits lim;
  auto with_n = [](uint32_t n, uint64_t total, uint32_t count) {
    Bytes b = data_frame(MsgType::kDelta, fp16(), 600, 1500, 0, 3);
    set_u32(b, kOffElements, n);
    set_u64(b, kOffTotal, total);
    set_u32(b, kOffChunkCount, count);
    return b;
  };
  EXPECT_EQ(reason(with_n(0, 1500, 3)), RejectReason::kBadElements);
  EXPECT_EQ(reason(with_n(lim.max_chunk_elements + 1, 1ull << 30, 3)), RejectReason::kBadElements);
  EXPECT_EQ(reason(with_n(600, lim.max_total_elements + 1, 3)), RejectReason::kBadElements);
  EXPECT_EQ(reason(with_n(600, 599, 3)), RejectReason::kBadElements);
  // Three chunks, 600 of 601: the two others cannot each hold one element.
  EXPECT_EQ(reason(with_n(600, 601, 3)), RejectReason::kBadElements);
  EXPECT_EQ(reason(with_n(600, 602, 3)), RejectReason::kNone);
  // A single chunk carries the whole stream.
  EXPECT_EQ(reason(with_n(600, 1500, 1)), RejectReason::kBadElements);
  EXPECT_EQ(reason(with_n(600, 600, 1)), RejectReason::kNone);
}

TEST(Frame, CustomLimitsApply) {
  FrameLimits lim;
  lim.max_chunk_elements = 100;
  lim.max_chunk_count = 2;
  lim.max_total_elements = 150;
  lim.max_control_payload = 1;
  EXPECT_EQ(reason(data_frame(MsgType::kDelta, fp16(), 100, 150, 0, 2), lim), RejectReason::kNone);
  EXPECT_EQ(reason(data_frame(MsgType::kDelta, fp16(), 101, 150, 0, 2), lim),
            RejectReason::kBadElements);
  EXPECT_EQ(reason(data_frame(MsgType::kDelta, fp16(), 50, 151, 0, 2), lim),
            RejectReason::kBadElements);
  EXPECT_EQ(reason(data_frame(MsgType::kDelta, fp16(), 50, 150, 0, 3), lim),
            RejectReason::kBadChunk);
  EXPECT_EQ(reason(control_frame(MsgType::kReject, {'x'}), lim), RejectReason::kNone);
  EXPECT_EQ(reason(control_frame(MsgType::kReject, {'x', 'y'}), lim),
            RejectReason::kPayloadTooLarge);
}

TEST(Frame, DeltaWeightMustBeFinitePositiveAnchorZero) {
  for (double w :
       {0.0, -0.0, -1.0, std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Bytes b = data_frame(MsgType::kDelta, fp16());
    set_f64(b, kOffWeight, w);
    EXPECT_EQ(reason(b), RejectReason::kBadWeight) << w;
  }
  Bytes tiny = data_frame(MsgType::kDelta, fp16());
  set_f64(tiny, kOffWeight, std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(reason(tiny), RejectReason::kNone);
  for (double w : {1.0, -0.0, std::numeric_limits<double>::quiet_NaN()}) {
    Bytes b = data_frame(MsgType::kAnchor, fp16());
    set_f64(b, kOffWeight, w);
    EXPECT_EQ(reason(b), RejectReason::kBadWeight) << w;
  }
}

TEST(Frame, ControlMessagesCarryNoTensorFields) {
  for (MsgType t : kControlTypes) {
    SCOPED_TRACE(msg_type_name(t));
    Bytes b = control_frame(t);
    set_u32(b, kOffChunkIndex, 1);
    EXPECT_EQ(reason(b), RejectReason::kBadChunk);
    b = control_frame(t);
    set_u32(b, kOffChunkCount, 1);
    EXPECT_EQ(reason(b), RejectReason::kBadChunk);
    b = control_frame(t);
    set_u32(b, kOffElements, 1);
    EXPECT_EQ(reason(b), RejectReason::kBadElements);
    // Only kHello and kWelcome state the model size, within the limit.
    const bool sizes_model = t == MsgType::kHello || t == MsgType::kWelcome;
    b = control_frame(t);
    set_u64(b, kOffTotal, 12345);
    EXPECT_EQ(reason(b), sizes_model ? RejectReason::kNone : RejectReason::kBadElements);
    b = control_frame(t);
    set_u64(b, kOffTotal, FrameLimits{}.max_total_elements + 1);
    EXPECT_EQ(reason(b), RejectReason::kBadElements);
    for (double w : {1.0, -0.0}) {
      b = control_frame(t);
      set_f64(b, kOffWeight, w);
      EXPECT_EQ(reason(b), RejectReason::kBadWeight);
    }
    FrameLimits lim;
    EXPECT_EQ(reason(control_frame(t, Bytes(lim.max_control_payload, 'a'))), RejectReason::kNone);
    EXPECT_EQ(reason(control_frame(t, Bytes(lim.max_control_payload + 1, 'a'))),
              RejectReason::kPayloadTooLarge);
  }
}

TEST(Frame, EveryTruncationIsRejected) {
  std::vector<Bytes> frames = {data_frame(MsgType::kDelta, fp16(), 40, 100, 0, 3),
                               data_frame(MsgType::kAnchor, codec_by_name("fp32"), 9, 9, 0, 1),
                               control_frame(MsgType::kHello, Bytes(70, 'h'))};
  for (const Bytes& full : frames) {
    for (size_t len = 0; len < full.size(); ++len) {
      ParsedFrame f = parse_frame(full.data(), len);
      RejectReason want =
          len < kHeaderSize ? RejectReason::kTooShort : RejectReason::kLengthMismatch;
      ASSERT_EQ(f.reject, want) << "length " << len << ": " << f.detail;
      EXPECT_EQ(f.payload, nullptr);
    }
  }
  EXPECT_EQ(parse_frame(nullptr, 100).reject, RejectReason::kTooShort);
}

TEST(Frame, TrailingBytesAreRejected) {
  for (size_t extra : {1, 2, 4096}) {
    Bytes b = data_frame(MsgType::kDelta, fp16());
    b.resize(b.size() + extra);
    EXPECT_EQ(reason(b), RejectReason::kLengthMismatch) << extra;
    Bytes c = control_frame(MsgType::kDone, {});
    c.resize(c.size() + extra);
    EXPECT_EQ(reason(c), RejectReason::kLengthMismatch) << extra;
  }
}

TEST(Frame, WrongPayloadSizeForEveryCodec) {
  std::vector<const Codec*> codecs = all_codecs();
  ASSERT_FALSE(codecs.empty());
  for (const Codec* c : codecs) {
    for (uint32_t n : {1u, 7u, 600u}) {
      size_t need = c->encoded_size(n);
      std::set<size_t> wrong = {need + 1, need + 2, need * 2, 0};
      if (need >= 1) wrong.insert(need - 1);
      for (const Codec* other : codecs) wrong.insert(other->encoded_size(n));
      wrong.erase(need);
      for (size_t size : wrong) {
        FrameHeader h = data_header(MsgType::kDelta, *c, n, n, 0, 1);
        Bytes payload(size);
        Bytes b = encode_frame(h, payload.data(), payload.size());
        ParsedFrame f = parse_frame(b.data(), b.size());
        ASSERT_EQ(f.reject, RejectReason::kBadPayloadSize)
            << c->name() << " n=" << n << " size=" << size << ": " << f.detail;
        std::string want = "payload " + std::to_string(size) + " bytes, " + std::string(c->name()) +
                           " of " + std::to_string(n) + " elements needs " + std::to_string(need);
        EXPECT_EQ(f.detail, want);
      }
    }
  }
}

TEST(Frame, DetailNamesTheOffendingValues) {
  Bytes b = data_frame(MsgType::kDelta, fp16());
  b[kOffVersion] = 7;
  EXPECT_NE(parse_frame(b.data(), b.size()).detail.find("7"), std::string::npos);
  b = data_frame(MsgType::kDelta, fp16());
  set_u32(b, kOffPayloadLen, 1234);
  std::string d = parse_frame(b.data(), b.size()).detail;
  EXPECT_NE(d.find("1234"), std::string::npos) << d;
  EXPECT_NE(d.find(std::to_string(b.size() - kHeaderSize)), std::string::npos) << d;
}

// Random corruption of valid frames must never crash, and whatever is
// accepted must be internally consistent: above all, its payload size must
// be exactly what its codec produces for its element count.
TEST(Frame, FuzzedFramesNeverCrashOrLie) {
  std::vector<Bytes> seeds;
  for (const Codec* c : all_codecs()) {
    seeds.push_back(data_frame(MsgType::kDelta, *c, 3, 10, 1, 3));
    seeds.push_back(data_frame(MsgType::kAnchor, *c, 8, 8, 0, 1));
    const FrameHeader h = data_header(MsgType::kDelta, *c, 3, 10, 1, 3);
    const Bytes values = codec_bytes(*c, 3);
    seeds.push_back(encode_delta_frame(h, values.data(), values.size(), 2.5));
    seeds.push_back(encode_delta_frame(h, nullptr, 0, 4.0));
  }
  for (MsgType t : kControlTypes) seeds.push_back(control_frame(t, Bytes(5, 'p')));

  std::mt19937_64 rng(20240611);
  const uint32_t interesting[] = {0, 1, 2, 3, 7, 8, 10, 16, 0x7fffffffu, 0x80000000u, 0xffffffffu};
  size_t accepted = 0, rejected = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    Bytes b = seeds[rng() % seeds.size()];
    int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 6) {
        case 0:  // flip a bit in the header
          b[rng() % kHeaderSize] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:  // random byte anywhere
          if (!b.empty()) b[rng() % b.size()] = static_cast<uint8_t>(rng());
          break;
        case 2: {  // an interesting value in a 32-bit header field
          size_t off = 4 * (rng() % (kHeaderSize / 4));
          set_u32(b, off, interesting[rng() % (sizeof(interesting) / sizeof(interesting[0]))]);
          break;
        }
        case 3:  // truncate
          b.resize(rng() % (b.size() + 1));
          if (b.size() < kHeaderSize) m = mutations;  // nothing left to aim at
          break;
        case 4:  // append
          b.resize(b.size() + 1 + rng() % 8, static_cast<uint8_t>(rng()));
          break;
        case 5:  // a small codec or type id
          b[kOffCodec + rng() % 2] = static_cast<uint8_t>(rng() % 9);
          break;
      }
    }
    ParsedFrame f = parse_frame(b.data(), b.size());
    if (!f.ok()) {
      ++rejected;
      ASSERT_FALSE(f.detail.empty());
      ASSERT_EQ(f.payload, nullptr);
      continue;
    }
    ++accepted;
    const FrameHeader& h = f.header;
    ASSERT_GE(b.size(), kHeaderSize);
    ASSERT_EQ(h.payload_length, b.size() - kHeaderSize);
    ASSERT_EQ(f.payload, b.data() + kHeaderSize);
    const bool excused = h.type == MsgType::kDelta && (h.flags & kFlagExcused);
    const bool no_values = h.type == MsgType::kDelta && (h.flags & kFlagNoValues);
    ASSERT_EQ(f.payload_size, h.payload_length - (excused ? kExcusedTrailerSize : 0));
    if (excused) {
      ASSERT_TRUE(std::isfinite(f.excused_weight) && f.excused_weight > 0);
    } else {
      ASSERT_EQ(f.excused_weight, 0.0);
    }
    if (h.type == MsgType::kAnchor || h.type == MsgType::kDelta) {
      const Codec* c = codec_by_wire_id(h.codec);
      ASSERT_NE(c, nullptr);
      ASSERT_EQ(f.payload_size, no_values ? 0 : c->encoded_size(h.element_count)) << f.detail;
      ASSERT_LT(h.chunk_index, h.chunk_count);
      ASSERT_GE(h.element_count, 1u);
      ASSERT_LE(h.element_count, h.total_elements);
      if (no_values) {
        ASSERT_TRUE(excused);
        ASSERT_EQ(h.weight, 0.0);
        ASSERT_FALSE(std::signbit(h.weight));
      } else if (h.type == MsgType::kDelta) {
        ASSERT_TRUE(std::isfinite(h.weight) && h.weight > 0);
      }
    } else {
      ASSERT_EQ(h.codec, 0);
      ASSERT_EQ(h.element_count, 0u);
      ASSERT_EQ(h.chunk_count, 0u);
      if (h.type != MsgType::kHello && h.type != MsgType::kWelcome) {
        ASSERT_EQ(h.total_elements, 0u);
      }
      ASSERT_LE(f.payload_size, FrameLimits{}.max_control_payload);
    }
    Bytes again(kHeaderSize);
    encode_header(h, again.data());
    // Every field but the order (the sealer's, not parsed) reads back.
    ASSERT_TRUE(std::equal(again.begin(), again.begin() + kOffOrder, b.begin()));
  }
  EXPECT_GT(accepted, 1000u);
  EXPECT_GT(rejected, 100000u);
}

}  // namespace
}  // namespace fedwan::wire
