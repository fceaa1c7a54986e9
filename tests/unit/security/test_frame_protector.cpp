#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "security/frame_protector.hpp"
#include "wire/frame.hpp"
#include "wire/frame_order.hpp"

namespace fedwan::security {
namespace {

using Bytes = std::vector<uint8_t>;
using Result = FrameOpener::Result;

constexpr size_t kHeader = wire::kHeaderSize;
constexpr size_t kOffFlags = 7;

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t load_u64(const uint8_t* p) { return load_u32(p) | uint64_t(load_u32(p + 4)) << 32; }
void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

AeadKey test_key(uint8_t salt) {
  AeadKey k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = uint8_t(i * 13 + salt);
  return k;
}
AeadNonce test_iv(uint8_t salt) {
  AeadNonce iv{};
  for (size_t i = 0; i < iv.size(); ++i) iv[i] = uint8_t(i * 29 + salt);
  return iv;
}

// A genuine kDelta frame: chunk `index` of 64, `n` fp16-encoded elements.
Bytes delta_frame(uint32_t index, uint32_t n = 16) {
  const Codec& fp16 = codec_by_name("fp16");
  std::mt19937 rng(index + 1);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  std::vector<float> values(n);
  for (float& v : values) v = d(rng);
  Bytes payload(fp16.encoded_size(n));
  fp16.encode(values.data(), n, nullptr, payload.data());
  wire::FrameHeader h;
  h.type = wire::MsgType::kDelta;
  h.codec = static_cast<uint8_t>(fp16.id());
  h.job_id = 0xfeedfacecafebeefull;
  h.round = 12;
  h.sender = 3;
  h.chunk_index = index;
  h.chunk_count = 64;
  h.element_count = n;
  h.total_elements = uint64_t(64) * n;
  h.weight = 2.5;
  return wire::encode_frame(h, payload.data(), payload.size());
}

Bytes sealed_copy(FrameSealer& sealer, const Bytes& frame) {
  Bytes b = frame;
  sealer.seal(b);
  return b;
}

uint32_t epoch_of(const Bytes& sealed) { return load_u32(sealed.data() + sealed.size() - 28); }
uint64_t seq_of(const Bytes& sealed) { return load_u64(sealed.data() + sealed.size() - 24); }

// Opens a copy; on kOk checks the plain frame against `expected`.
Result open_copy(FrameOpener& opener, const Bytes& sealed, const Bytes* expected = nullptr) {
  Bytes b = sealed;
  size_t n = 0;
  const Result r = opener.open(b.data(), b.size(), &n);
  if (r == Result::kOk && expected != nullptr) {
    EXPECT_EQ(n, expected->size());
    b.resize(n);
    EXPECT_EQ(b, *expected);
    EXPECT_TRUE(wire::parse_frame(b.data(), b.size()).ok());
  }
  return r;
}

class FrameProtector : public ::testing::TestWithParam<AeadAlgorithm> {
 protected:
  AeadAlgorithm alg() const { return GetParam(); }
};

TEST_P(FrameProtector, RoundTripOfRealFrames) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  for (uint32_t i = 0; i < 20; ++i) {
    const Bytes plain = delta_frame(i, 1 + i * 300);
    Bytes b = plain;
    b.reserve(b.size() + kSealTrailer);
    const uint8_t* before = b.data();
    sealer.seal(b);
    EXPECT_EQ(b.data(), before) << "reserved capacity must be used in place";
    ASSERT_EQ(b.size(), plain.size() + kSealTrailer);
    EXPECT_EQ(seq_of(b), i);
    EXPECT_EQ(epoch_of(b), 0u);
    size_t n = 0;
    ASSERT_EQ(opener.open(b.data(), b.size(), &n), Result::kOk) << i;
    ASSERT_EQ(n, plain.size());
    b.resize(n);
    EXPECT_EQ(b, plain);
  }
  EXPECT_EQ(sealer.next_seq(), 20u);
  EXPECT_EQ(sealer.epoch(), 0u);
}

// A frame of `type` with `flags` and no payload (the sealer reads only the
// header's type and flags for its order tag).
Bytes bare_frame(wire::MsgType type, uint8_t flags = 0) {
  wire::FrameHeader h;
  h.type = type;
  h.flags = flags;
  return wire::encode_frame(h, nullptr, 0);
}

TEST_P(FrameProtector, TheOrderFieldCountsTheBarriersAndPiecesSealedBefore) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  struct Step {
    Bytes frame;
    uint16_t barriers, pieces;
  };
  const std::vector<Step> steps = {
      {bare_frame(wire::MsgType::kWelcome), 0, 0},
      {delta_frame(0), 1, 0},
      {bare_frame(wire::MsgType::kCheckpoint), 1, 0},  // a piece
      {bare_frame(wire::MsgType::kHeartbeat), 1, 1},   // follows, counts nothing
      {delta_frame(1), 1, 1},
      {bare_frame(wire::MsgType::kCheckpoint, wire::kFlagReplicaStored), 1, 1},  // a signal
      {bare_frame(wire::MsgType::kHeartbeat, wire::kFlagMembership), 2, 1},
      {bare_frame(wire::MsgType::kCheckpoint), 3, 1},
      {delta_frame(2), 3, 2},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    Bytes b = sealed_copy(sealer, steps[i].frame);
    const wire::OrderTag tag = wire::unpack_order(load_u32(b.data() + wire::kOrderOffset));
    EXPECT_EQ(tag.barriers, steps[i].barriers) << i;
    EXPECT_EQ(tag.pieces, steps[i].pieces) << i;
    // The field is authenticated with the header.
    Bytes forged = b;
    forged[wire::kOrderOffset] ^= 1;
    EXPECT_EQ(open_copy(opener, forged), Result::kBadTag) << i;
    EXPECT_EQ(open_copy(opener, b), Result::kOk) << i;
  }
}

TEST_P(FrameProtector, HeaderStaysReadableAndPayloadIsEncrypted) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  const Bytes plain = delta_frame(5, 2048);
  const Bytes sealed = sealed_copy(sealer, plain);
  Bytes header(sealed.begin(), sealed.begin() + kHeader);
  EXPECT_EQ(header[kOffFlags], plain[kOffFlags] | kFlagSealed);
  header[kOffFlags] = plain[kOffFlags];
  EXPECT_EQ(header, Bytes(plain.begin(), plain.begin() + kHeader));
  const size_t p = plain.size() - kHeader;
  EXPECT_EQ(load_u32(sealed.data() + 56), p) << "payload_length still states the plain size";
  size_t same = 0;
  for (size_t i = 0; i < p; ++i) same += sealed[kHeader + i] == plain[kHeader + i];
  EXPECT_LT(same, p / 64) << "ciphertext should look random against the plaintext";
}

TEST_P(FrameProtector, SameFrameSealsDifferentlyEachTime) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  const Bytes plain = delta_frame(1);
  const Bytes a = sealed_copy(sealer, plain), b = sealed_copy(sealer, plain);
  EXPECT_NE(Bytes(a.begin() + kHeader, a.end()), Bytes(b.begin() + kHeader, b.end()));
}

// The heart of it: flipping any single bit anywhere in a sealed frame
// (header, ciphertext, epoch, seq, tag) is refused, and no refusal moves the
// opener: the genuine frame and its successor still open afterwards. Run at
// epoch 0 and, after the opener has followed one rekey, at epoch 1.
TEST_P(FrameProtector, EveryBitFlipIsRefusedWithoutSideEffects) {
  for (uint32_t start_epoch : {0u, 1u}) {
    SCOPED_TRACE("epoch " + std::to_string(start_epoch));
    RekeyPolicy p;
    p.max_frames = 2;
    FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
    FrameOpener opener(alg(), test_key(1), test_iv(2));
    uint32_t index = 0;
    if (start_epoch == 1) {
      ASSERT_EQ(open_copy(opener, sealed_copy(sealer, delta_frame(index++))), Result::kOk);
      sealed_copy(sealer, delta_frame(index++));  // lost
      ASSERT_EQ(open_copy(opener, sealed_copy(sealer, delta_frame(index++))), Result::kOk);
      ASSERT_EQ(opener.epoch(), 1u);
    }
    const Bytes plain = delta_frame(index++, 8);
    const Bytes sealed = sealed_copy(sealer, plain);
    const Bytes plain_next = delta_frame(index++, 8);
    const Bytes sealed_next = sealed_copy(sealer, plain_next);
    ASSERT_EQ(epoch_of(sealed), start_epoch);
    const size_t trailer = sealed.size() - kSealTrailer;

    std::map<Result, size_t> seen;
    for (size_t bit = 0; bit < 8 * sealed.size(); ++bit) {
      const size_t byte = bit / 8;
      Bytes b = sealed;
      b[byte] ^= uint8_t(1u << (bit % 8));
      const Result r = open_copy(opener, b);
      ASSERT_NE(r, Result::kOk) << "byte " << byte << " bit " << bit % 8;
      ++seen[r];
      // Header fields other than the flag and the length, the ciphertext
      // and the tag are only caught by authentication.
      const bool flag_or_length = (byte == kOffFlags && bit % 8 == 7) || (byte >= 56 && byte < 60);
      const bool epoch_or_seq = byte >= trailer && byte < trailer + 12;
      if (!flag_or_length && !epoch_or_seq) {
        EXPECT_EQ(r, Result::kBadTag) << "byte " << byte << " bit " << bit % 8;
      }
      ASSERT_EQ(opener.epoch(), start_epoch);
    }
    // Each cheap defence was exercised too: the flag, the length, the epoch
    // bounds and (at epoch 1, where a seq bit can flip down onto a number
    // already seen) the replay window and the stale-epoch check.
    EXPECT_EQ(seen[Result::kNotSealed], 1u);
    EXPECT_EQ(seen[Result::kTruncated], 32u);
    EXPECT_GT(seen[Result::kOtherSession], 0u);
    if (start_epoch == 1) {
      EXPECT_GT(seen[Result::kReplay], 0u);
      EXPECT_GT(seen[Result::kStaleEpoch], 0u);
    }

    EXPECT_EQ(open_copy(opener, sealed, &plain), Result::kOk);
    EXPECT_EQ(opener.epoch(), start_epoch);
    EXPECT_EQ(open_copy(opener, sealed_next, &plain_next), Result::kOk);
  }
}

TEST_P(FrameProtector, ReplayIsRefused) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes first = sealed_copy(sealer, delta_frame(0));
  const Bytes second = sealed_copy(sealer, delta_frame(1));
  ASSERT_EQ(open_copy(opener, first), Result::kOk);
  ASSERT_EQ(open_copy(opener, second), Result::kOk);
  EXPECT_EQ(open_copy(opener, first), Result::kReplay);
  EXPECT_EQ(open_copy(opener, second), Result::kReplay);
}

TEST_P(FrameProtector, OutOfOrderWithinTheWindowOpens) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  std::vector<Bytes> sealed;
  for (uint32_t i = 0; i < 8; ++i) sealed.push_back(sealed_copy(sealer, delta_frame(i)));
  for (int i : {3, 0, 7, 1, 2, 6, 5, 4}) EXPECT_EQ(open_copy(opener, sealed[i]), Result::kOk) << i;
}

TEST_P(FrameProtector, FramesBelowTheReplayWindowAreTooOld) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes small = delta_frame(0, 1);
  const Bytes late = sealed_copy(sealer, small);
  Bytes last;
  for (uint64_t i = 0; i < ReplayWindow::kSize; ++i) last = sealed_copy(sealer, small);
  ASSERT_EQ(open_copy(opener, last), Result::kOk);
  EXPECT_EQ(open_copy(opener, late), Result::kTooOld);
}

TEST_P(FrameProtector, PlaintextFrameIsNotSealed) {
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  Bytes plain = delta_frame(0, 64);
  size_t n = 0;
  EXPECT_EQ(opener.open(plain.data(), plain.size(), &n), Result::kNotSealed);
  EXPECT_EQ(plain, delta_frame(0, 64)) << "a refusal before decryption leaves the bytes alone";
}

TEST_P(FrameProtector, TruncationsAndTrailingBytesAreRefused) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes sealed = sealed_copy(sealer, delta_frame(0, 32));
  for (size_t cut :
       {size_t(1), size_t(16), size_t(27), size_t(28), size_t(29),
        sealed.size() - kHeader - kSealTrailer, sealed.size() - kHeader, sealed.size()}) {
    Bytes b(sealed.begin(), sealed.end() - cut);
    size_t n = 0;
    EXPECT_EQ(opener.open(b.data(), b.size(), &n), Result::kTruncated) << "cut " << cut;
  }
  Bytes longer = sealed;
  longer.push_back(0);
  EXPECT_EQ(open_copy(opener, longer), Result::kTruncated);
  EXPECT_EQ(open_copy(opener, sealed), Result::kOk);
}

TEST_P(FrameProtector, SealerRefusesWhatIsNotAFrame) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  Bytes too_short(63, 0);
  EXPECT_THROW(sealer.seal(too_short), ProtocolError);
  Bytes longer = delta_frame(0);
  longer.push_back(1);
  EXPECT_THROW(sealer.seal(longer), ProtocolError);
  Bytes shorter = delta_frame(0);
  shorter.pop_back();
  EXPECT_THROW(sealer.seal(shorter), ProtocolError);
  Bytes twice = delta_frame(0);
  sealer.seal(twice);
  EXPECT_THROW(sealer.seal(twice), ProtocolError);
  EXPECT_EQ(sealer.next_seq(), 1u) << "a refused frame uses no sequence number";
}

TEST_P(FrameProtector, EmptyPayloadFrameRoundTrips) {
  wire::FrameHeader h;
  h.type = wire::MsgType::kDone;
  h.round = 9;
  const Bytes plain = wire::encode_frame(h, nullptr, 0);
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes sealed = sealed_copy(sealer, plain);
  EXPECT_EQ(sealed.size(), kHeader + kSealTrailer);
  EXPECT_EQ(open_copy(opener, sealed, &plain), Result::kOk);
}

// Rekeying: the sealer retires keys by frames, bytes and age, and the opener
// follows across every epoch boundary.
TEST_P(FrameProtector, RekeyAfterMaxFrames) {
  RekeyPolicy p;
  p.max_frames = 3;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  for (uint32_t i = 0; i < 10; ++i) {
    const Bytes plain = delta_frame(i);
    const Bytes sealed = sealed_copy(sealer, plain);
    EXPECT_EQ(epoch_of(sealed), i / 3) << i;
    EXPECT_EQ(seq_of(sealed), i) << "sequence numbers run on across epochs";
    ASSERT_EQ(open_copy(opener, sealed, &plain), Result::kOk) << i;
    EXPECT_EQ(opener.epoch(), i / 3);
  }
  EXPECT_EQ(sealer.epoch(), 3u);
}

TEST_P(FrameProtector, RekeyAfterMaxBytes) {
  const Bytes plain = delta_frame(0, 100);
  const uint64_t payload = plain.size() - kHeader;
  RekeyPolicy p;
  p.max_bytes = 2 * payload + payload / 2;  // two frames fit, the third would not
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  for (uint32_t i = 0; i < 9; ++i) {
    const Bytes sealed = sealed_copy(sealer, plain);
    EXPECT_EQ(epoch_of(sealed), i / 2) << i;
    ASSERT_EQ(open_copy(opener, sealed, &plain), Result::kOk) << i;
  }
}

TEST_P(FrameProtector, FrameLargerThanMaxBytesGoesAloneUnderItsKey) {
  RekeyPolicy p;
  p.max_bytes = 10;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  for (uint32_t i = 0; i < 4; ++i) {
    const Bytes plain = delta_frame(i, 50);
    const Bytes sealed = sealed_copy(sealer, plain);
    EXPECT_EQ(epoch_of(sealed), i);
    ASSERT_EQ(open_copy(opener, sealed, &plain), Result::kOk) << i;
  }
}

TEST_P(FrameProtector, RekeyAfterMaxAge) {
  RekeyPolicy p;
  p.max_age = std::chrono::milliseconds(2);
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes plain = delta_frame(0);
  std::vector<Bytes> sealed;
  for (int i = 0; i < 3; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    sealed.push_back(sealed_copy(sealer, plain));
  }
  // The first frame is at epoch 0 unless this machine took over 2 ms to get
  // from the constructor to seal(); each wait then retires exactly one key.
  const uint32_t first = epoch_of(sealed[0]);
  EXPECT_LE(first, 1u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(epoch_of(sealed[i]), first + i);
    EXPECT_EQ(open_copy(opener, sealed[i], &plain), Result::kOk) << i;
    EXPECT_EQ(opener.epoch(), first + i);
  }
}

TEST_P(FrameProtector, ZeroMaxFramesMeansAFreshKeyPerFrame) {
  RekeyPolicy p;
  p.max_frames = 0;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  for (uint32_t i = 0; i < 4; ++i) {
    const Bytes plain = delta_frame(i);
    const Bytes sealed = sealed_copy(sealer, plain);
    EXPECT_EQ(epoch_of(sealed), i + 1);
    ASSERT_EQ(open_copy(opener, sealed, &plain), Result::kOk) << i;
  }
}

// Frames lost while the sender rekeyed several times: the opener ratchets
// forward as far as the first frame that arrives.
TEST_P(FrameProtector, OpenerFollowsAJumpOfSeveralEpochs) {
  for (uint32_t jump : {2u, 3u, kMaxEpochJump}) {
    SCOPED_TRACE("jump " + std::to_string(jump));
    RekeyPolicy p;
    p.max_frames = 1;
    FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
    FrameOpener opener(alg(), test_key(1), test_iv(2));
    ASSERT_EQ(open_copy(opener, sealed_copy(sealer, delta_frame(0))), Result::kOk);
    for (uint32_t lost = 1; lost < jump; ++lost) sealed_copy(sealer, delta_frame(lost));
    const Bytes plain = delta_frame(jump);
    const Bytes sealed = sealed_copy(sealer, plain);
    ASSERT_EQ(epoch_of(sealed), jump);
    EXPECT_EQ(open_copy(opener, sealed, &plain), Result::kOk);
    EXPECT_EQ(opener.epoch(), jump);
    const Bytes after = delta_frame(jump + 1);
    EXPECT_EQ(open_copy(opener, sealed_copy(sealer, after), &after), Result::kOk);
  }
}

TEST_P(FrameProtector, JumpBeyondTheLimitIsRefused) {
  RekeyPolicy p;
  p.max_frames = 1;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  for (uint32_t i = 0; i <= kMaxEpochJump; ++i) sealed_copy(sealer, delta_frame(i));
  const Bytes sealed = sealed_copy(sealer, delta_frame(0));
  ASSERT_EQ(epoch_of(sealed), kMaxEpochJump + 1);
  EXPECT_EQ(open_copy(opener, sealed), Result::kOtherSession);
  EXPECT_EQ(opener.epoch(), 0u);
}

TEST_P(FrameProtector, ForgedEpochIsRefusedAndMovesNothing) {
  FrameSealer sealer(alg(), test_key(1), test_iv(2));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes plain = delta_frame(0);
  const Bytes sealed = sealed_copy(sealer, plain);
  for (uint32_t forged : {1000u, 0xffffffffu, kMaxEpochJump + 1}) {
    Bytes b = sealed;
    store_u32(b.data() + b.size() - 28, forged);
    EXPECT_EQ(open_copy(opener, b), Result::kOtherSession) << forged;
  }
  // Within reach, a forged epoch costs a trial decryption and fails it.
  Bytes near = sealed;
  store_u32(near.data() + near.size() - 28, 5);
  EXPECT_EQ(open_copy(opener, near), Result::kBadTag);
  EXPECT_EQ(opener.epoch(), 0u);
  EXPECT_EQ(open_copy(opener, sealed, &plain), Result::kOk);
}

TEST_P(FrameProtector, AFrameSealedBeforeARekeyOpensAfterTheFirstUnderTheNewKey) {
  // Frames striped over several connections: f1 (epoch 0) is overtaken by
  // f2, the first frame under the new key.
  RekeyPolicy p;
  p.max_frames = 2;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes plain1 = delta_frame(1);
  const Bytes f0 = sealed_copy(sealer, delta_frame(0));
  const Bytes f1 = sealed_copy(sealer, plain1);
  const Bytes f2 = sealed_copy(sealer, delta_frame(2));
  ASSERT_EQ(epoch_of(f2), 1u);
  ASSERT_EQ(open_copy(opener, f0), Result::kOk);
  ASSERT_EQ(open_copy(opener, f2), Result::kOk);
  EXPECT_EQ(opener.epoch(), 1u);
  EXPECT_EQ(opener.earlier_keys(), 1u);
  EXPECT_EQ(open_copy(opener, f1, &plain1), Result::kOk);
  EXPECT_EQ(opener.last_seq(), 1u);
  EXPECT_EQ(opener.epoch(), 1u) << "the current key stays the new one";
  EXPECT_EQ(open_copy(opener, f1), Result::kReplay);
}

// Opening in two steps (detach, run anywhere, finish) takes only frames of
// the current epoch; a key update, and frames of an earlier key, are
// open()'s, in their turn.
TEST_P(FrameProtector, OnlyFramesOfTheCurrentKeyAreDetached) {
  RekeyPolicy p;
  p.max_frames = 2;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes plain0 = delta_frame(0);
  Bytes f0 = sealed_copy(sealer, plain0);
  const Bytes f1 = sealed_copy(sealer, delta_frame(1));
  const Bytes f2 = sealed_copy(sealer, delta_frame(2));
  ASSERT_EQ(epoch_of(f2), 1u);
  EXPECT_EQ(opener.detach(f2.data(), f2.size()), nullptr) << "the next key";
  const auto d0 = opener.detach(f0.data(), f0.size());
  ASSERT_NE(d0, nullptr);
  std::unique_ptr<AeadCipher> cipher;
  const bool ok = d0->run(f0.data(), &cipher);
  ASSERT_TRUE(ok);
  // Once run, the bytes are already the plain frame finish() hands on.
  ASSERT_EQ(d0->opened_size(), plain0.size());
  EXPECT_EQ(Bytes(f0.begin(), f0.begin() + static_cast<std::ptrdiff_t>(plain0.size())), plain0);
  size_t n = 0;
  ASSERT_EQ(opener.finish(*d0, ok, f0.data(), &n), Result::kOk);
  f0.resize(n);
  EXPECT_EQ(f0, plain0);
  ASSERT_EQ(open_copy(opener, f2), Result::kOk);
  EXPECT_EQ(opener.epoch(), 1u);
  EXPECT_EQ(opener.detach(f1.data(), f1.size()), nullptr) << "an earlier key";
  EXPECT_EQ(open_copy(opener, f1), Result::kOk);
  // A frame not authenticated is not recorded: its genuine copy opens.
  const Bytes f3 = sealed_copy(sealer, delta_frame(3));
  Bytes forged = f3;
  forged[kHeader + 5] ^= 1;
  const auto d3 = opener.detach(forged.data(), forged.size());
  ASSERT_NE(d3, nullptr);
  EXPECT_FALSE(d3->run(forged.data(), &cipher));
  EXPECT_EQ(opener.finish(*d3, false, forged.data(), &n), Result::kBadTag);
  EXPECT_EQ(open_copy(opener, f3), Result::kOk);
}

TEST_P(FrameProtector, OldEpochOutsideWhatItCouldHaveSealedIsStale) {
  RekeyPolicy p;
  p.max_frames = 2;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes f0 = sealed_copy(sealer, delta_frame(0));
  (void)sealed_copy(sealer, delta_frame(1));
  const Bytes f2 = sealed_copy(sealer, delta_frame(2));
  ASSERT_EQ(open_copy(opener, f2), Result::kOk);
  // An epoch-0 label on a number at or past the new epoch's first frame
  // cannot be genuine: refused before any cryptography.
  Bytes forged = f2;
  store_u32(forged.data() + forged.size() - 28, 0);
  forged[forged.size() - 24] = 3;  // a number not seen yet
  EXPECT_EQ(open_copy(opener, forged), Result::kStaleEpoch);
  // Two key updates later, a frame of the first epoch that could be genuine
  // still opens.
  for (int i = 0; i < 2; ++i) (void)sealed_copy(sealer, delta_frame(3 + i));
  const Bytes f5 = sealed_copy(sealer, delta_frame(5));
  ASSERT_EQ(epoch_of(f5), 2u);
  ASSERT_EQ(open_copy(opener, f5), Result::kOk);
  EXPECT_EQ(opener.earlier_keys(), 2u);
  EXPECT_EQ(open_copy(opener, f0), Result::kOk);
}

TEST_P(FrameProtector, ThePreviousKeyIsWipedOnceTheWindowPassedItsFrames) {
  RekeyPolicy p;
  p.max_frames = 1100;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p);
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  std::vector<Bytes> sealed;
  for (uint32_t i = 0; i < 1100 + ReplayWindow::kSize + 2; ++i) {
    sealed.push_back(sealed_copy(sealer, delta_frame(i % 64, 1)));
  }
  ASSERT_EQ(epoch_of(sealed[1100]), 1u);
  ASSERT_EQ(open_copy(opener, sealed[0]), Result::kOk);
  ASSERT_EQ(open_copy(opener, sealed[1100]), Result::kOk);
  EXPECT_EQ(opener.earlier_keys(), 1u);
  for (size_t i = 1101; i < sealed.size(); ++i)
    ASSERT_EQ(open_copy(opener, sealed[i]), Result::kOk);
  EXPECT_EQ(opener.earlier_keys(), 0u)
      << "no frame of epoch 0 can be fresh any more: its key must be gone";
  EXPECT_EQ(open_copy(opener, sealed[5]), Result::kTooOld);
}

TEST_P(FrameProtector, ForeignKeyIsABadTagAndChangesNothing) {
  FrameSealer ours(alg(), test_key(1), test_iv(2));
  FrameSealer theirs(alg(), test_key(9), test_iv(2));
  FrameSealer other_iv(alg(), test_key(1), test_iv(7));
  FrameOpener opener(alg(), test_key(1), test_iv(2));
  const Bytes plain = delta_frame(0);
  EXPECT_EQ(open_copy(opener, sealed_copy(theirs, plain)), Result::kBadTag);
  EXPECT_EQ(open_copy(opener, sealed_copy(other_iv, plain)), Result::kBadTag);
  const AeadAlgorithm other = alg() == AeadAlgorithm::kAes256Gcm ? AeadAlgorithm::kChaCha20Poly1305
                                                                 : AeadAlgorithm::kAes256Gcm;
  FrameSealer other_cipher(other, test_key(1), test_iv(2));
  EXPECT_EQ(open_copy(opener, sealed_copy(other_cipher, plain)), Result::kBadTag);
  EXPECT_EQ(opener.epoch(), 0u);
  // Same sequence number 0 as the refused frames: not recorded by them.
  EXPECT_EQ(open_copy(opener, sealed_copy(ours, plain), &plain), Result::kOk);
}

// Epochs count from the session's first, modulo 2^32: an opener follows a
// sealer across the wrap, one epoch at a time and in jumps.
TEST_P(FrameProtector, EpochsCountOnAcrossTheWrapFromTheSessionsFirst) {
  for (uint32_t step : {1u, 3u}) {
    SCOPED_TRACE("step " + std::to_string(step));
    RekeyPolicy p;
    p.max_frames = 1;
    const uint32_t first = UINT32_MAX - 4;
    FrameSealer sealer(alg(), test_key(1), test_iv(2), p, first);
    FrameOpener opener(alg(), test_key(1), test_iv(2), first);
    EXPECT_EQ(opener.epoch(), first);
    for (uint32_t i = 0; i < 12; ++i) {
      const Bytes plain = delta_frame(i);
      const Bytes sealed = sealed_copy(sealer, plain);
      ASSERT_EQ(epoch_of(sealed), first + i);  // modulo 2^32
      if (i % step != 0) continue;             // lost on the way
      ASSERT_EQ(open_copy(opener, sealed, &plain), Result::kOk) << i;
      EXPECT_EQ(opener.epoch(), first + i);
    }
  }
}

// A frame sealed in another session of the link (its keys and its first
// epoch drawn by another handshake) is told apart from a tampered one by its
// epoch alone, before any cryptography, and changes nothing.
TEST_P(FrameProtector, AFrameOfAnotherSessionIsToldApartByItsEpoch) {
  RekeyPolicy p;
  p.max_frames = 3;
  const uint32_t old_first = 0x9e3779b9u, new_first = 0x7f4a7c15u;
  FrameSealer before(alg(), test_key(1), test_iv(2), p, old_first);
  FrameSealer now(alg(), test_key(5), test_iv(6), p, new_first);
  FrameOpener opener(alg(), test_key(5), test_iv(6), new_first);
  for (uint32_t i = 0; i < 40; ++i) {
    const Bytes old_frame = sealed_copy(before, delta_frame(i));
    const Bytes plain = delta_frame(i);
    ASSERT_EQ(open_copy(opener, sealed_copy(now, plain), &plain), Result::kOk) << i;
    // Sequence numbers the new session used already, and ones it has not.
    EXPECT_EQ(open_copy(opener, old_frame), Result::kOtherSession) << i;
  }
  EXPECT_EQ(opener.epoch(), new_first + 13);
  // The same frame under this session's epoch is what tampering looks like.
  Bytes moved = sealed_copy(before, delta_frame(0));
  store_u32(moved.data() + moved.size() - 28, opener.epoch());
  EXPECT_EQ(open_copy(opener, moved), Result::kBadTag);
}

// A session that starts near the top of the epochs goes on past it.
TEST_P(FrameProtector, TheSealersEpochsWrapPastTheTop) {
  RekeyPolicy p;
  p.max_frames = 1;
  FrameSealer sealer(alg(), test_key(1), test_iv(2), p, UINT32_MAX);
  Bytes a = delta_frame(0);
  sealer.seal(a);
  Bytes b = delta_frame(1);
  sealer.seal(b);
  EXPECT_EQ(epoch_of(a), UINT32_MAX);
  EXPECT_EQ(epoch_of(b), 0u);
}

TEST(FrameProtectorNames, ResultNames) {
  EXPECT_STREQ(FrameOpener::result_name(Result::kOk), "ok");
  EXPECT_STREQ(FrameOpener::result_name(Result::kBadTag), "bad tag");
  EXPECT_STREQ(FrameOpener::result_name(Result::kOtherSession),
               "sealed in another session of the link");
}

INSTANTIATE_TEST_SUITE_P(FrameProtectorCiphers, FrameProtector,
                         ::testing::Values(AeadAlgorithm::kAes256Gcm,
                                           AeadAlgorithm::kChaCha20Poly1305),
                         [](const auto& info) {
                           return info.param == AeadAlgorithm::kAes256Gcm ? "Aes256Gcm"
                                                                          : "ChaCha20Poly1305";
                         });

}  // namespace
}  // namespace fedwan::security
