#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/error.hpp"
#include "security/sealing_pipeline.hpp"
#include "wire/frame.hpp"

namespace fedwan::security {
namespace {

using Bytes = std::vector<uint8_t>;
using Result = FrameOpener::Result;
using std::chrono::milliseconds;

const AeadKey kKey{3, 1, 4, 1, 5, 9, 2, 6};
const AeadNonce kIv{2, 7, 1, 8};
constexpr milliseconds kWait{10'000};

// A kTelemetry frame whose payload says which frame it is.
Bytes numbered_frame(uint32_t i, size_t payload_size = 24) {
  Bytes payload(payload_size);
  for (size_t k = 0; k < payload.size(); ++k) payload[k] = uint8_t(size_t(i) * 7 + k);
  wire::FrameHeader h;
  h.type = wire::MsgType::kTelemetry;
  h.round = i;
  return wire::encode_frame(h, payload.data(), payload.size());
}

uint64_t seq_of(const Bytes& sealed) {
  uint64_t s = 0;
  for (int i = 0; i < 8; ++i) s |= uint64_t(sealed[sealed.size() - 24 + i]) << (8 * i);
  return s;
}

void expect_opens_to(FrameOpener& opener, Bytes sealed, const Bytes& plain) {
  size_t n = 0;
  ASSERT_EQ(opener.open(sealed.data(), sealed.size(), &n), Result::kOk);
  sealed.resize(n);
  EXPECT_EQ(sealed, plain);
}

TEST(SealingPipeline, OneOwnerGetsFramesSealedInSubmissionOrder) {
  FrameSealer sealer(AeadAlgorithm::kAes256Gcm, kKey, kIv);
  FrameOpener opener(AeadAlgorithm::kAes256Gcm, kKey, kIv);
  SealingPipeline pipeline(sealer, 2);
  uint32_t taken = 0;
  auto take = [&] {
    Bytes sealed;
    ASSERT_TRUE(pipeline.next(&sealed, kWait));
    EXPECT_EQ(seq_of(sealed), taken);
    expect_opens_to(opener, sealed, numbered_frame(taken, 24 + taken % 5 * 1000));
    ++taken;
  };
  for (uint32_t i = 0; i < 100; ++i) {
    if (pipeline.in_flight() == 2) take();
    pipeline.submit(numbered_frame(i, 24 + i % 5 * 1000));
  }
  while (pipeline.in_flight() > 0) take();
  EXPECT_EQ(taken, 100u);
  Bytes none;
  EXPECT_FALSE(pipeline.next(&none, kWait)) << "an empty pipeline answers at once";
}

TEST(SealingPipeline, ProducerAndConsumerThreadsKeepOrderThroughAFullPipeline) {
  FrameSealer sealer(AeadAlgorithm::kChaCha20Poly1305, kKey, kIv);
  FrameOpener opener(AeadAlgorithm::kChaCha20Poly1305, kKey, kIv);
  SealingPipeline pipeline(sealer, 3);
  constexpr uint32_t kFrames = 300;
  std::thread consumer([&] {
    for (uint32_t i = 0; i < kFrames; ++i) {
      Bytes sealed;
      // next() answers at once while the producer has queued nothing yet.
      while (!pipeline.next(&sealed, milliseconds(50))) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      EXPECT_EQ(seq_of(sealed), i);
      expect_opens_to(opener, sealed, numbered_frame(i));
      EXPECT_LE(pipeline.in_flight(), 3u);
    }
  });
  for (uint32_t i = 0; i < kFrames; ++i) pipeline.submit(numbered_frame(i));
  consumer.join();
  EXPECT_EQ(pipeline.in_flight(), 0u);
}

TEST(SealingPipeline, SealingErrorReachesNextAfterTheFramesBeforeIt) {
  FrameSealer sealer(AeadAlgorithm::kAes256Gcm, kKey, kIv);
  SealingPipeline pipeline(sealer, 4);
  pipeline.submit(numbered_frame(0));
  pipeline.submit(numbered_frame(1));
  pipeline.submit(Bytes(10, 0));  // not a frame: FrameSealer throws ProtocolError
  Bytes sealed;
  ASSERT_TRUE(pipeline.next(&sealed, kWait));
  EXPECT_EQ(seq_of(sealed), 0u);
  ASSERT_TRUE(pipeline.next(&sealed, kWait));
  EXPECT_EQ(seq_of(sealed), 1u);
  EXPECT_THROW(pipeline.next(&sealed, kWait), ProtocolError);
  // The failure is final: nothing more is sealed, so no frame can come out
  // with a sequence number out of submission order.
  EXPECT_THROW(pipeline.next(&sealed, kWait), ProtocolError);
  EXPECT_THROW(pipeline.submit(numbered_frame(3)), ProtocolError);
  EXPECT_EQ(sealer.next_seq(), 2u);
}

TEST(SealingPipeline, DestructionWithFramesPendingJoinsCleanly) {
  FrameSealer sealer(AeadAlgorithm::kAes256Gcm, kKey, kIv);
  {
    SealingPipeline pipeline(sealer, 3);
    for (uint32_t i = 0; i < 3; ++i) pipeline.submit(numbered_frame(i, 1 << 20));
  }
  { SealingPipeline idle(sealer, 1); }
  // The sealer is usable again once the pipelines are gone.
  Bytes frame = numbered_frame(9);
  sealer.seal(frame);
  EXPECT_LE(sealer.next_seq(), 4u);
}

TEST(SealingPipeline, ZeroDepthIsAConfigError) {
  FrameSealer sealer(AeadAlgorithm::kAes256Gcm, kKey, kIv);
  EXPECT_THROW(SealingPipeline(sealer, 0), ConfigError);
}

}  // namespace
}  // namespace fedwan::security
