// The codecs (fedwan/codec.hpp): the registry, round trips of every codec
// and size within its error bound, weighted accumulation, error feedback, and
// what validate() refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "codec/compact_feedback.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/int8_codec.hpp"
#include "codec_test_util.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "harness/random_floats.hpp"

namespace fedwan {
namespace {

const size_t kSizes[] = {0, 1, 7, 8, 9, 2047, 2048, 2049, 1000003};
const char* const kNames[] = {"fp32", "fp16", "bf16", "int8"};

using testing::random_floats;

void put_f32(Bytes& b, size_t off, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  for (int i = 0; i < 4; ++i) b[off + i] = uint8_t(u >> (8 * i));
}

// ---- registry ------------------------------------------------------------

TEST(CodecRegistry, FindsBuiltinsByNameAndWireId) {
  EXPECT_EQ(codec_by_name("fp32").id(), CodecId::kFp32);
  EXPECT_EQ(codec_by_name("fp16").id(), CodecId::kFp16);
  EXPECT_EQ(codec_by_name("bf16").id(), CodecId::kBf16);
  EXPECT_EQ(codec_by_name("int8").id(), CodecId::kInt8);
  for (const char* name : kNames) {
    const Codec& c = codec_by_name(name);
    EXPECT_EQ(c.name(), name);
    EXPECT_EQ(codec_by_id(c.id()), &c);
    EXPECT_EQ(codec_by_wire_id(static_cast<uint8_t>(c.id())), &c);
  }
  EXPECT_EQ(codec_by_wire_id(0), nullptr);
  EXPECT_EQ(codec_by_wire_id(77), nullptr);
  const auto names = codec_names();
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 4),
            (std::vector<std::string>{"fp32", "fp16", "bf16", "int8"}));
}

TEST(CodecRegistry, UnknownNameThrowsConfigErrorListingKnownCodecs) {
  try {
    codec_by_name("zstd");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown codec 'zstd'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("known codecs: fp32, fp16, bf16, int8"), std::string::npos) << msg;
  }
  EXPECT_THROW(codec_by_name(""), ConfigError);
  EXPECT_THROW(codec_by_name("FP16"), ConfigError);
}

// fp32 under another name and wire id.
class RenamedCodec final : public Codec {
 public:
  RenamedCodec(std::string name, uint8_t id) : name_(std::move(name)), id_(CodecId(id)) {}
  CodecId id() const override { return id_; }
  std::string_view name() const override { return name_; }
  size_t encoded_size(size_t n) const override { return 4 * n; }
  void encode(const float* in, size_t n, float* r, uint8_t* out) const override {
    fp32().encode(in, n, r, out);
  }
  bool validate(const uint8_t* in, size_t b, size_t n) const override {
    return fp32().validate(in, b, n);
  }
  void decode(const uint8_t* in, size_t n, float* out) const override { fp32().decode(in, n, out); }
  void decode_accumulate(const uint8_t* in, size_t n, float w, float* acc) const override {
    fp32().decode_accumulate(in, n, w, acc);
  }

 private:
  static const Codec& fp32() { return codec_by_name("fp32"); }
  std::string name_;
  CodecId id_;
};

TEST(CodecRegistry, RegisterRejectsDuplicatesAndAcceptsNewCodecs) {
  const size_t registered = codec_names().size();
  EXPECT_THROW(register_codec(nullptr), ConfigError);
  EXPECT_THROW(register_codec(std::make_unique<RenamedCodec>("fp16", 201)), ConfigError);
  EXPECT_THROW(register_codec(std::make_unique<RenamedCodec>("other", 3)), ConfigError);
  EXPECT_THROW(register_codec(std::make_unique<RenamedCodec>("other", 4)), ConfigError);
  EXPECT_THROW(register_codec(std::make_unique<RenamedCodec>("zero", 0)), ConfigError);
  EXPECT_EQ(codec_by_wire_id(201), nullptr);  // failed registrations left no trace
  EXPECT_EQ(codec_names().size(), registered);
  // The registry is process-wide: register for real only in a child process.
  EXPECT_EXIT(
      {
        register_codec(std::make_unique<RenamedCodec>("fp32-copy", 250));
        const Codec* c = codec_by_wire_id(250);
        bool ok = c && &codec_by_name("fp32-copy") == c && codec_names().back() == "fp32-copy";
        try {
          register_codec(std::make_unique<RenamedCodec>("fp32-copy", 251));
          ok = false;
        } catch (const ConfigError&) {
        }
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EQ(codec_by_wire_id(250), nullptr);
}

TEST(CodecRegistry, ConcurrentLookupsAgree) {
  const Codec* fp16 = &codec_by_name("fp16");
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        bad[t] += codec_by_wire_id(2) != fp16;
        bad[t] += &codec_by_name("fp16") != fp16;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

// ---- round trips, over codec x size ---------------------------------------

class CodecRoundTrip : public ::testing::TestWithParam<std::tuple<const char*, size_t>> {};

TEST_P(CodecRoundTrip, StaysWithinTheCodecsErrorBound) {
  const Codec& c = codec_by_name(std::get<0>(GetParam()));
  const size_t n = std::get<1>(GetParam());
  const Floats in = random_floats(n, 7 + uint32_t(n), 3.0f);
  const Bytes b = encode(c, in);
  ASSERT_EQ(b.size(), c.encoded_size(n));
  ASSERT_TRUE(c.validate(b.data(), b.size(), n));
  const Floats out = decode(c, b, n);
  const Floats block_max = block_max_abs(in);
  const Floats int8_block_max = block_max_abs(in, Int8Codec::kBlock);
  for (size_t i = 0; i < n; ++i) {
    // fp16: half a unit in the last place at the top of the element's block;
    // int8: half a step (the block's largest / 127), plus rounding slack.
    const float bound =
        c.id() == CodecId::kFp32   ? 0.0f
        : c.id() == CodecId::kFp16 ? std::ldexp(block_max[i / Fp16Codec::kBlock], -11)
        : c.id() == CodecId::kInt8 ? int8_block_max[i / Int8Codec::kBlock] / 254.0f * (1 + 0x1p-12f)
                                   : std::ldexp(std::fabs(in[i]), -8);
    ASSERT_LE(std::fabs(out[i] - in[i]), bound) << i;
  }
}

TEST_P(CodecRoundTrip, DecodeAccumulateEqualsDecodeThenAccumulateBitForBit) {
  const Codec& c = codec_by_name(std::get<0>(GetParam()));
  const size_t n = std::get<1>(GetParam());
  const Bytes b = encode(c, random_floats(n, 11, 0.01f));
  for (float w : {1.0f, 0.3f, 1.0f / 3.0f, -2.5f}) {
    Floats fused = random_floats(n, 12, 5.0f);
    Floats reference = fused;
    c.decode_accumulate(b.data(), n, w, fused.data());
    const Floats x = decode(c, b, n);
    accumulate_weighted(reference.data(), x.data(), n, w);
    ASSERT_TRUE(same_bits(fused, reference)) << "weight " << w;
  }
}

// What a site does with each chunk of the next anchor (its parameters
// become the anchor plus the decoded update): one pass that equals a copy
// and decode_accumulate with weight 1, into another array and in place.
TEST_P(CodecRoundTrip, DecodeAddEqualsCopyThenDecodeAccumulateBitForBit) {
  const Codec& c = codec_by_name(std::get<0>(GetParam()));
  const size_t n = std::get<1>(GetParam());
  const Bytes b = encode(c, random_floats(n, 21, 0.01f));
  const Floats base = random_floats(n, 22, 5.0f);
  Floats reference = base;
  c.decode_accumulate(b.data(), n, 1.0f, reference.data());
  Floats out(n, -7.0f);
  c.decode_add(b.data(), n, base.data(), out.data());
  ASSERT_TRUE(same_bits(out, reference));
  Floats in_place = base;
  c.decode_add(b.data(), n, in_place.data(), in_place.data());
  ASSERT_TRUE(same_bits(in_place, reference));
}

// A site's parameters take each anchor chunk as it is added to the anchor
// (Codec::decode_add_copy): the anchor as decode_add in place leaves it, the
// copy the same bits, wherever the copy starts (streamed stores begin at a
// 32-byte boundary), and nothing written beside it.
TEST_P(CodecRoundTrip, DecodeAddCopyEqualsDecodeAddInPlaceAndACopy) {
  const Codec& c = codec_by_name(std::get<0>(GetParam()));
  const size_t n = std::get<1>(GetParam());
  const Bytes b = encode(c, random_floats(n, 23, 0.01f));
  const Floats base = random_floats(n, 24, 5.0f);
  Floats reference = base;
  c.decode_add(b.data(), n, reference.data(), reference.data());
  for (size_t shift = 0; shift < 3; ++shift) {
    Floats acc = base;
    Floats copy(n + 4, -3.0f);
    c.decode_add_copy(b.data(), n, acc.data(), copy.data() + shift);
    ASSERT_TRUE(same_bits(acc, reference)) << "shift " << shift;
    ASSERT_TRUE(same_bits(Floats(copy.begin() + static_cast<long>(shift),
                                 copy.begin() + static_cast<long>(shift + n)),
                          reference))
        << "shift " << shift;
    for (size_t i = 0; i < shift; ++i) ASSERT_EQ(copy[i], -3.0f);
    for (size_t i = shift + n; i < copy.size(); ++i) ASSERT_EQ(copy[i], -3.0f);
  }
}

// Frames are encoded into buffers used before (common/byte_pool.hpp): an
// encoder must write every byte of its encoded_size, with error feedback in
// fp32 and in bf16, or a byte of an earlier frame would go out with it.
TEST_P(CodecRoundTrip, EncodeWritesEveryByteOfItsPayload) {
  const Codec& c = codec_by_name(std::get<0>(GetParam()));
  const size_t n = std::get<1>(GetParam());
  const Floats in = random_floats(n, 13, 2.0f);
  std::vector<float> scratch;
  for (int mode = 0; mode < 3; ++mode) {
    Bytes seen[2];
    for (int fill = 0; fill < 2; ++fill) {
      Bytes out(c.encoded_size(n), fill == 0 ? 0x00 : 0xff);
      Floats residual(n, 0.25f);
      std::vector<uint16_t> bf16_residual(n, 0x3e80);  // 0.25
      if (mode == 0) c.encode(in.data(), n, nullptr, out.data());
      if (mode == 1) c.encode(in.data(), n, residual.data(), out.data());
      if (mode == 2) {
        codec::encode_with_bf16_residual(c, in.data(), n, bf16_residual.data(), scratch,
                                         out.data());
      }
      seen[fill] = std::move(out);
    }
    ASSERT_EQ(seen[0], seen[1]) << "error feedback mode " << mode;
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecRoundTrip,
                         ::testing::Combine(::testing::ValuesIn(kNames),
                                            ::testing::ValuesIn(kSizes)));

TEST(Accumulate, ProductIsRoundedBeforeTheAdd) {
  // 3 * fp32(1/3) = 1 + 2^-25 rounds to 1, so -1 + it is exactly 0; a fused
  // multiply-add would keep the 2^-25.
  for (size_t n : {size_t(1), size_t(37)}) {
    Floats acc(n, -1.0f), x(n, 1.0f / 3.0f);
    accumulate_weighted(acc.data(), x.data(), n, 3.0f);
    for (float a : acc) EXPECT_EQ(a, 0.0f);
  }
  for (const char* name : kNames) {  // 3 is exact in every codec; the weight carries 1/3
    const Codec& c = codec_by_name(name);
    Floats acc(37, -1.0f);
    c.decode_accumulate(encode(c, Floats(37, 3.0f)).data(), 37, 1.0f / 3.0f, acc.data());
    for (float a : acc) EXPECT_EQ(a, 0.0f) << name;
  }
}

// ---- error feedback --------------------------------------------------------

TEST(CodecErrorFeedback, DecodedSumTracksTheTrueSum) {
  const size_t n = 4096, rounds = 50;
  for (const char* name : {"fp16", "bf16", "int8"}) {
    const Codec& c = codec_by_name(name);
    std::vector<double> truth(n, 0), with_ef(n, 0), without(n, 0);
    Floats residual(n, 0.0f);
    float largest = 0;
    for (size_t r = 0; r < rounds; ++r) {
      const Floats delta = random_floats(n, 100 + uint32_t(r), 0.01f);
      largest = std::max(largest, max_abs(delta));
      const Floats a = decode(c, encode(c, delta, residual.data()), n);
      const Floats b = decode(c, encode(c, delta), n);
      for (size_t i = 0; i < n; ++i) {
        truth[i] += delta[i];
        with_ef[i] += a[i];
        without[i] += b[i];
      }
    }
    // One quantisation step at the top of a chunk: 2^-10 relative for fp16,
    // 2^-7 for bf16, 1/127 for int8.
    const double step = c.id() == CodecId::kInt8
                            ? double(largest) / 127.0
                            : std::ldexp(double(largest), c.id() == CodecId::kFp16 ? -10 : -7);
    double max_ef = 0, ss_ef = 0, ss_plain = 0;
    for (size_t i = 0; i < n; ++i) {
      max_ef = std::max(max_ef, std::fabs(with_ef[i] - truth[i]));
      ss_ef += (with_ef[i] - truth[i]) * (with_ef[i] - truth[i]);
      ss_plain += (without[i] - truth[i]) * (without[i] - truth[i]);
    }
    EXPECT_LE(max_ef, step) << name;
    // Without feedback the rounding errors of 50 rounds add up (~sqrt(50)x).
    EXPECT_GT(ss_plain, 16 * ss_ef) << name;
  }
}

TEST(CodecErrorFeedback, LosslessFp32FoldsAndClearsTheResidual) {
  const Codec& c = codec_by_name("fp32");
  const Floats in = random_floats(9, 1);
  Floats residual = random_floats(9, 2);
  const Floats expected_residual = residual;
  const Floats out = decode(c, encode(c, in, residual.data()), 9);
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(out[i], in[i] + expected_residual[i]);
    EXPECT_EQ(residual[i], 0.0f);
  }
}

TEST(CodecErrorFeedback, NonFiniteInputThrowsAndLeavesResidualUntouched) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float big = std::numeric_limits<float>::max();
  for (const char* name : kNames) {
    const Codec& c = codec_by_name(name);
    for (size_t n : {size_t(1), size_t(9), size_t(100003)}) {
      // fp16 quantises block by block: a bad value in the last block must
      // still be found before the first block's residual is written.
      for (size_t at : {size_t(0), n / 2, n - 1}) {
        for (float bad : {nan, inf, -inf, big}) {
          Floats in = random_floats(n, 5);
          Floats residual = random_floats(n, 6, 1e-3f);
          in[at] = bad;
          if (bad == big) residual[at] = big;  // finite parts, non-finite sum
          const Floats before = residual;
          Bytes out(c.encoded_size(n));
          EXPECT_THROW(c.encode(in.data(), n, residual.data(), out.data()), Error)
              << name << " n=" << n << " at " << at;
          EXPECT_TRUE(same_bits(residual, before)) << name << " n=" << n << " at " << at;
          if (bad != big) {
            EXPECT_THROW(c.encode(in.data(), n, nullptr, out.data()), Error);
          }
        }
      }
    }
  }
}

// ---- validate --------------------------------------------------------------

TEST(CodecValidate, RejectsEveryMalformedPayload) {
  const size_t n = 1000003;
  for (const char* name : kNames) {
    const Codec& c = codec_by_name(name);
    const Bytes good = encode(c, random_floats(n, 9));
    ASSERT_TRUE(c.validate(good.data(), good.size(), n));
    EXPECT_FALSE(c.validate(good.data(), good.size() - 1, n)) << name;
    Bytes longer = good;
    longer.push_back(0);
    EXPECT_FALSE(c.validate(longer.data(), longer.size(), n)) << name;
    EXPECT_FALSE(c.validate(good.data(), good.size(), n + 1)) << name;
    EXPECT_FALSE(c.validate(good.data(), good.size(), n - 1)) << name;
    EXPECT_EQ(c.validate(good.data(), 0, 0), c.encoded_size(0) == 0) << name;
    EXPECT_FALSE(c.validate(good.data(), good.size(), std::numeric_limits<size_t>::max()));
    const size_t body = c.id() == CodecId::kFp16   ? 4 * Fp16Codec::blocks(n)
                        : c.id() == CodecId::kInt8 ? 4 * Int8Codec::blocks(n)
                                                   : 0;
    const size_t width = c.id() == CodecId::kFp32 ? 4 : c.id() == CodecId::kInt8 ? 1 : 2;
    std::vector<uint32_t> bad_values;
    if (c.id() == CodecId::kFp32) bad_values = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u};
    if (c.id() == CodecId::kFp16) bad_values = {0x7C00u, 0xFC00u, 0x7E00u, 0x7C01u};
    if (c.id() == CodecId::kBf16) bad_values = {0x7F80u, 0xFF80u, 0x7FC0u, 0x7F81u};
    if (c.id() == CodecId::kInt8) bad_values = {0x80u};  // -128: never produced
    for (size_t at : {size_t(0), n / 2, n - 1}) {
      for (uint32_t v : bad_values) {
        Bytes b = good;
        for (size_t k = 0; k < width; ++k) b[body + at * width + k] = uint8_t(v >> (8 * k));
        EXPECT_FALSE(c.validate(b.data(), b.size(), n)) << name << " at " << at << " " << v;
      }
    }
  }
  const Codec& fp16 = codec_by_name("fp16");
  Bytes b = encode(fp16, Floats{1.0f, -2.0f, 0.5f});
  const float inf = std::numeric_limits<float>::infinity();
  for (float scale : {std::numeric_limits<float>::quiet_NaN(), inf, -inf, -1.0f, -0.0f, 0x1p120f}) {
    Bytes bad = b;
    put_f32(bad, 0, scale);  // 2^120: the largest value, 2^14 scaled, decodes past FLT_MAX
    EXPECT_FALSE(fp16.validate(bad.data(), bad.size(), 3)) << scale;
  }
  put_f32(b, 0, 0.0f);  // zero scale: decodes to zeros, harmless
  EXPECT_TRUE(fp16.validate(b.data(), b.size(), 3));
  put_u16(b, 4, 0x7BFF);
  put_f32(b, 0, 1.0f);
  EXPECT_TRUE(fp16.validate(b.data(), b.size(), 3));
  // Every block's scale is checked, the short last one included, and the
  // overflow check uses each block's own largest value.
  const size_t blocks = Fp16Codec::blocks(n);
  const Bytes good = encode(fp16, random_floats(n, 9));
  for (size_t k : {size_t(1), blocks / 2, blocks - 1}) {
    for (float scale : {std::numeric_limits<float>::quiet_NaN(), inf, -1.0f, 0x1p120f}) {
      Bytes bad = good;
      put_f32(bad, 4 * k, scale);
      EXPECT_FALSE(fp16.validate(bad.data(), bad.size(), n)) << "block " << k << " " << scale;
    }
    Bytes zero = good;
    put_f32(zero, 4 * k, 0.0f);
    EXPECT_TRUE(fp16.validate(zero.data(), zero.size(), n)) << k;
  }
  // A block of small halves may take a scale that would overflow the largest
  // half of another block.
  const size_t m = Fp16Codec::kBlock + 1;
  Bytes mixed(fp16.encoded_size(m), 0);
  for (size_t i = 0; i < Fp16Codec::kBlock; ++i) put_u16(mixed, 8 + 2 * i, 0x3C00);  // 1.0
  put_u16(mixed, 8 + 2 * Fp16Codec::kBlock, 0x7BFF);                                 // 65504
  put_f32(mixed, 0, 0x1p120f);
  put_f32(mixed, 4, 1.0f);
  EXPECT_TRUE(fp16.validate(mixed.data(), mixed.size(), m));
  put_f32(mixed, 4, 0x1p120f);
  EXPECT_FALSE(fp16.validate(mixed.data(), mixed.size(), m));
}

}  // namespace
}  // namespace fedwan
