// Sealing a frame the caller keeps (FrameSealer::sealed, SealingPipeline's
// shared frames): the payload is encrypted across into new bytes, which
// must be exactly what sealing a copy in place gives, and the kept frame
// must stay as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "fedwan/error.hpp"
#include "security/frame_protector.hpp"
#include "security/sealing_pipeline.hpp"
#include "wire/frame.hpp"

namespace fedwan::security {
namespace {

using Bytes = std::vector<uint8_t>;
using Result = FrameOpener::Result;

const AeadKey kKey{7, 1, 8, 2, 8, 1, 8, 2};
const AeadNonce kIv{1, 4, 1, 4, 2};

Bytes frame_of(uint32_t i, size_t payload_size, wire::MsgType type = wire::MsgType::kDelta) {
  wire::FrameHeader h;
  h.type = type;
  h.round = i;
  Bytes f = wire::frame_to_fill(h, payload_size);
  for (size_t k = 0; k < payload_size; ++k) f[wire::kHeaderSize + k] = uint8_t(i * 31 + k * 7);
  return f;
}

class SealingAcross : public ::testing::TestWithParam<AeadAlgorithm> {};

TEST_P(SealingAcross, GivesTheBytesOfSealingInPlaceAndLeavesTheFrame) {
  // A rekey every 3 frames: the epochs must follow each other the same way.
  RekeyPolicy policy;
  policy.max_frames = 3;
  FrameSealer in_place(GetParam(), kKey, kIv, policy);
  FrameSealer across(GetParam(), kKey, kIv, policy);
  FrameOpener opener(GetParam(), kKey, kIv);
  for (uint32_t i = 0; i < 20; ++i) {
    // Barriers and data interleaved: the order tag counts both.
    const wire::MsgType type = i % 4 == 0 ? wire::MsgType::kCheckpoint : wire::MsgType::kDelta;
    const Bytes plain = frame_of(i, i * 977 % 70'000, type);
    Bytes a = plain;
    in_place.seal(a);
    const Bytes kept = plain;
    const Bytes b = across.sealed(kept);
    EXPECT_EQ(kept, plain) << "the kept frame must not change";
    ASSERT_EQ(a, b) << i;
    Bytes open = b;
    size_t n = 0;
    ASSERT_EQ(opener.open(open.data(), open.size(), &n), Result::kOk) << i;
    open.resize(n);
    // The opened frame is the plain one but for the header's order field
    // and sealed flag, which the sealer fills.
    EXPECT_TRUE(std::equal(open.begin() + wire::kHeaderSize, open.end(),
                           plain.begin() + wire::kHeaderSize));
  }
  EXPECT_EQ(across.next_seq(), in_place.next_seq());
  EXPECT_EQ(across.epoch(), in_place.epoch());
  EXPECT_GT(across.epoch(), 0u);
}

TEST_P(SealingAcross, RefusesWhatIsNotOneFrameAndSpendsNoSequenceNumberOnIt) {
  FrameSealer sealer(GetParam(), kKey, kIv);
  const Bytes short_one(wire::kHeaderSize - 1, 0);
  EXPECT_THROW((void)sealer.sealed(short_one), ProtocolError);
  Bytes longer = frame_of(1, 100);
  longer.push_back(0);  // one byte more than the header states
  EXPECT_THROW((void)sealer.sealed(longer), ProtocolError);
  Bytes sealed_already = frame_of(2, 100);
  sealer.seal(sealed_already);
  EXPECT_EQ(sealer.next_seq(), 1u);
  EXPECT_THROW((void)sealer.sealed(sealed_already), ProtocolError);
  EXPECT_EQ(sealer.next_seq(), 1u);
  (void)sealer.sealed(frame_of(3, 10));
  EXPECT_EQ(sealer.next_seq(), 2u);
}

TEST_P(SealingAcross, APipelineSealsKeptAndOwnedFramesInOneOrder) {
  FrameSealer reference(GetParam(), kKey, kIv);
  FrameSealer sealer(GetParam(), kKey, kIv);
  SealingPipeline pipeline(sealer, 2);
  std::vector<std::shared_ptr<const Bytes>> kept;
  std::vector<Bytes> expected;
  std::vector<Bytes> got;
  const auto take = [&] {
    Bytes s;
    ASSERT_TRUE(pipeline.next(&s, std::chrono::milliseconds(10'000)));
    got.push_back(std::move(s));
  };
  for (uint32_t i = 0; i < 40; ++i) {
    Bytes plain = frame_of(i, 1000 + i * 100);
    Bytes ref = plain;
    reference.seal(ref);
    expected.push_back(std::move(ref));
    if (pipeline.in_flight() == pipeline.depth()) take();
    if (i % 2 == 0) {
      kept.push_back(std::make_shared<const Bytes>(plain));
      pipeline.submit(kept.back());
    } else {
      pipeline.submit(std::move(plain));
    }
  }
  while (pipeline.in_flight() > 0) take();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << i;
  for (size_t k = 0; k < kept.size(); ++k) {
    EXPECT_EQ(*kept[k], frame_of(uint32_t(2 * k), 1000 + 2 * k * 100)) << k;
  }
  EXPECT_THROW(pipeline.submit(std::shared_ptr<const Bytes>()), ProtocolError);
}

INSTANTIATE_TEST_SUITE_P(Ciphers, SealingAcross,
                         ::testing::Values(AeadAlgorithm::kAes256Gcm,
                                           AeadAlgorithm::kChaCha20Poly1305));

TEST(FrameToFill, IsAFrameWhosePayloadTheCallerWrites) {
  wire::FrameHeader h;
  h.type = wire::MsgType::kTelemetry;
  h.round = 9;
  h.payload_length = 1;  // taken from the size, not from h
  Bytes f = wire::frame_to_fill(h, 300);
  ASSERT_EQ(f.size(), wire::kHeaderSize + 300);
  for (size_t k = 0; k < 300; ++k) f[wire::kHeaderSize + k] = uint8_t(k);
  const wire::ParsedFrame p = wire::parse_frame(f.data(), f.size());
  ASSERT_TRUE(p.ok()) << p.detail;
  EXPECT_EQ(p.header.payload_length, 300u);
  EXPECT_EQ(p.header.round, 9u);
  EXPECT_EQ(p.payload[299], uint8_t(299));
  EXPECT_EQ(wire::frame_to_fill(h, 0).size(), wire::kHeaderSize);
}

}  // namespace
}  // namespace fedwan::security
