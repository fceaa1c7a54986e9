#include "aggregator/root_model.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/node_checkpoint.hpp"
#include "codec/half.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::aggregator {
namespace {

std::vector<float> ramp(size_t n, float base, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i % 97);
  return v;
}

// One chunk of a round at the root: step to `target`, encode the update,
// settle, and later apply.
std::vector<uint8_t> step_to(RootModel& m, uint64_t off, const std::vector<float>& target,
                             const Codec& codec) {
  const uint32_t n = static_cast<uint32_t>(target.size());
  std::vector<float> theta = target, update(n);
  for (uint32_t k = 0; k < n; ++k) update[k] = theta[k] - m.held()[off + k];
  std::vector<uint8_t> payload(codec.encoded_size(n));
  codec.encode(update.data(), n, nullptr, payload.data());
  m.settle_chunk(off, n, theta.data(), codec, payload.data());
  return payload;
}

TEST(RootModel, StartsWithTheGlobalModelOnItsAnchor) {
  const std::vector<float> init = ramp(1000, -1.0f, 0.01f);
  RootModel m(init);
  EXPECT_EQ(m.held(), init);
  EXPECT_EQ(m.global(), init);
}

TEST(RootModel, TheAnchorMovesByWhatChildrenDecodeAndTheResidualKeepsTheRest) {
  const Codec& fp16 = codec_by_name("fp16");
  const std::vector<float> init = ramp(4096, 0.5f, 0.003f);
  RootModel m(init);
  // A step fp16 cannot carry exactly.
  std::vector<float> target = init;
  for (size_t i = 0; i < target.size(); ++i) target[i] += 1e-3f * std::sin(static_cast<float>(i));
  const std::vector<uint8_t> payload = step_to(m, 0, target, fp16);
  EXPECT_EQ(m.held(), init) << "the anchor moves only when the round commits";
  m.apply(0, static_cast<uint32_t>(target.size()), fp16, payload.data());
  // The children's arithmetic: the same decode onto the same anchor.
  std::vector<float> child = init;
  fp16.decode_accumulate(payload.data(), child.size(), 1.0f, child.data());
  EXPECT_EQ(m.held(), child);
  // held + residual is the stepped model, to far below fp32's resolution of it.
  const std::vector<float> g = m.global();
  double worst = 0;
  size_t differ = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    worst = std::max(worst, std::abs(double(g[i]) - target[i]) / std::abs(double(target[i])));
    differ += child[i] != target[i];
  }
  EXPECT_GT(differ, 0u) << "fp16 must have lost something for this test to mean anything";
  EXPECT_LE(worst, 1.2e-7);  // one fp32 ulp
}

// Every welcome compares a child's digest with the anchor's: it is taken
// once per anchor, follows every move of it, and the digest its checkpoint
// took is that of the anchor the checkpoint viewed.
TEST(RootModel, TheAnchorsDigestFollowsTheAnchor) {
  const Codec& fp16 = codec_by_name("fp16");
  const std::vector<float> init = ramp(4096, 0.5f, 0.003f);
  RootModel m(init);
  const auto digest_of = [&m] { return sha256(m.held().data(), m.size() * sizeof(float)); };
  EXPECT_EQ(m.held_digest(), digest_of());
  std::vector<float> target = init;
  for (size_t i = 0; i < target.size(); ++i) target[i] += 1e-2f;
  const std::vector<uint8_t> payload = step_to(m, 0, target, fp16);
  EXPECT_EQ(m.held_digest(), sha256(init.data(), init.size() * sizeof(float)))
      << "settling a chunk does not move the anchor";
  m.apply(0, static_cast<uint32_t>(target.size()), fp16, payload.data());
  EXPECT_NE(m.held(), init);
  EXPECT_EQ(m.held_digest(), digest_of());
  testing::TempDir dir;
  Checkpoint c;
  c.round = 3;
  c.node_id = "root";
  m.save(c);
  const checkpoint::SectionDigests digests = checkpoint::save_node_checkpoint(dir.path(), c);
  const std::array<uint8_t, 32>* held = checkpoint::section_digest(c, digests, "held");
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(*held, digest_of());
  const RootModel restored =
      RootModel::restore(read_checkpoint(checkpoint::checkpoint_path(dir.path(), "root")));
  EXPECT_EQ(restored.held(), m.held());
  EXPECT_EQ(restored.held_digest(), digest_of());
  // Its arrays left in the file (as a node's restart reads them): the same.
  const RootModel from_file =
      RootModel::restore(read_checkpoint(checkpoint::checkpoint_path(dir.path(), "root"), {}, {1}));
  EXPECT_EQ(from_file.held(), m.held());
  EXPECT_EQ(from_file.global(), m.global());
}

TEST(RootModel, KeepsResidualsBelowFp16sRange) {
  // An fp32 anchor update from 1 to ~1e-8: the difference rounds to -1, so
  // the children land on 0 and the residual is the whole ~1e-8, which fp16
  // would flush to zero.
  const Codec& fp32 = codec_by_name("fp32");
  const std::vector<float> init(256, 1.0f);
  RootModel m(init);
  std::vector<float> target(256);
  for (size_t i = 0; i < target.size(); ++i) target[i] = 1e-8f * float(i + 1);
  const std::vector<uint8_t> payload = step_to(m, 0, target, fp32);
  m.apply(0, 256, fp32, payload.data());
  EXPECT_EQ(m.held()[0], 0.0f);
  const std::vector<float> g = m.global();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], target[i], target[i] / 256) << i;
}

TEST(RootModel, ChunksSettleIndependently) {
  const Codec& int8 = codec_by_name("int8");
  const std::vector<float> init = ramp(2000, -0.2f, 0.004f);
  RootModel m(init);
  std::vector<float> second(init.begin() + 1000, init.end());
  for (float& x : second) x *= 1.01f;
  const std::vector<uint8_t> payload = step_to(m, 1000, second, int8);
  m.apply(1000, 1000, int8, payload.data());
  const std::vector<float> g = m.global();
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(g[i], init[i]);
  for (size_t i = 0; i < 1000; ++i) EXPECT_NEAR(g[1000 + i], second[i], 1e-6f * 2);
}

// encode_and_settle against its two steps (encode, then settle_chunk):
// the same payload and the same residual, bit for bit, for every codec,
// over chunks that do not end on a block and steps of every size (zeros,
// negative zeros, values fp16 flushes, values near its top).
TEST(RootModel, EncodeAndSettleIsEncodeThenSettleBitForBit) {
  const size_t n = 5000;  // two whole fp16 blocks of 2048 and a part
  const std::vector<float> init = ramp(2 * n, -0.3f, 0.0071f);
  std::vector<float> target(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = init[n + i];
    switch (i % 7) {
      case 0: target[i] = x; break;                                  // no step
      case 1: target[i] = x + 1e-9f * static_cast<float>(i); break;  // under fp16's range
      case 2: target[i] = x - 3e-3f * std::sin(static_cast<float>(i)); break;
      case 3: target[i] = -0.0f; break;
      case 4: target[i] = x + (i < 2048 ? 6e4f : 2.5f); break;  // one block's scale large
      default: target[i] = x * 1.0001f;
    }
  }
  for (const char* name : {"fp16", "bf16", "int8", "fp32"}) {
    SCOPED_TRACE(name);
    const Codec& codec = codec_by_name(name);
    RootModel two_steps(init), fused(init);
    const std::vector<uint8_t> expected = step_to(two_steps, n, target, codec);
    std::vector<float> theta = target, diff;
    std::vector<uint8_t> payload(codec.encoded_size(n), 0xa5);
    fused.encode_and_settle(n, static_cast<uint32_t>(n), theta.data(), codec, payload.data(), diff);
    ASSERT_EQ(payload, expected);
    const std::vector<float> a = two_steps.global(), b = fused.global();
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    fused.apply(n, static_cast<uint32_t>(n), codec, payload.data());
    two_steps.apply(n, static_cast<uint32_t>(n), codec, expected.data());
    ASSERT_EQ(std::memcmp(fused.held().data(), two_steps.held().data(), n * 2 * sizeof(float)), 0);
  }
}

// The anchor moved in the encode-and-settle pass (Anchor::kAdvances) holds
// what apply() would have made of the payload at the commit, bit for bit,
// and so does the global model; the chunk beside it is untouched. Values
// whose sum is a signed zero, subnormal steps and a large block included.
TEST(RootModel, AnAnchorAdvancedAsItIsEncodedIsTheOneAppliedAtTheCommit) {
  const size_t n = 5000;
  std::vector<float> init = ramp(2 * n, -0.3f, 0.0071f);
  init[n + 3] = -0.0f;
  init[n + 10] = 0.0f;
  std::vector<float> target(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = init[n + i];
    switch (i % 6) {
      case 0: target[i] = x; break;
      case 1: target[i] = x + 1e-40f; break;  // a subnormal step
      case 2: target[i] = -x; break;
      case 3: target[i] = -0.0f; break;
      case 4: target[i] = x + (i < 2048 ? 6e4f : 2.5f); break;
      default: target[i] = x * 0.9997f;
    }
  }
  for (const char* name : {"fp16", "bf16", "int8", "fp32"}) {
    SCOPED_TRACE(name);
    const Codec& codec = codec_by_name(name);
    RootModel later(init), now(init);
    const std::array<uint8_t, 32> before = now.held_digest();
    ASSERT_TRUE(now.known_held_digest().has_value());
    std::vector<float> theta_later = target, theta_now = target, diff;
    std::vector<uint8_t> p_later(codec.encoded_size(n)), p_now(codec.encoded_size(n), 0x5a);
    later.encode_and_settle(n, static_cast<uint32_t>(n), theta_later.data(), codec, p_later.data(),
                            diff);
    now.encode_and_settle(n, static_cast<uint32_t>(n), theta_now.data(), codec, p_now.data(), diff,
                          RootModel::Anchor::kAdvances);
    ASSERT_EQ(p_now, p_later);
    EXPECT_FALSE(now.known_held_digest().has_value()) << "the anchor moved: its digest goes";
    later.apply(n, static_cast<uint32_t>(n), codec, p_later.data());
    ASSERT_EQ(std::memcmp(now.held().data(), later.held().data(), 2 * n * sizeof(float)), 0);
    const std::vector<float> a = later.global(), b = now.global();
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(now.held().data(), init.data(), n * sizeof(float)), 0);
    EXPECT_NE(now.held_digest(), before);
  }
}

// The fp16 codec's two passes over ranges of a chunk's blocks, the ranges
// taken in any order, give encode_and_settle's payload, anchor and global
// model bit for bit, the anchor moved or not; a range holding a value
// that is not finite says so, and the others do not.
TEST(RootModel, Fp16PassesOverRangesOfBlocksAreEncodeAndSettle) {
  const Codec& fp16 = codec_by_name("fp16");
  const size_t n = 5 * 2048 + 700;  // six blocks, the last a part
  const std::vector<float> init = ramp(2 * n, -0.3f, 0.0071f);
  std::vector<float> target(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = init[n + i];
    target[i] = i % 5 == 0 ? x : i < 2048 ? x + 6e4f : x - 3e-3f * std::sin(static_cast<float>(i));
  }
  const std::vector<std::pair<size_t, size_t>> ranges = {{5, 6}, {0, 2}, {2, 5}};
  for (const auto anchor : {RootModel::Anchor::kStays, RootModel::Anchor::kAdvances}) {
    RootModel whole(init), split(init);
    std::vector<float> theta_whole = target, theta_split = target, diff;
    std::vector<uint8_t> p_whole(fp16.encoded_size(n)), p_split(fp16.encoded_size(n), 0x5a);
    whole.encode_and_settle(n, static_cast<uint32_t>(n), theta_whole.data(), fp16, p_whole.data(),
                            diff, anchor);
    for (const auto& [first, end] : ranges) {
      EXPECT_LT(split.fp16_measure(n, static_cast<uint32_t>(n), theta_split.data(), p_split.data(),
                                   first, end),
                kernels::kF32ExpMask);
    }
    split.settling_starts(anchor);
    for (const auto& [first, end] : ranges) {
      split.fp16_settle(n, static_cast<uint32_t>(n), theta_split.data(), p_split.data(), first, end,
                        anchor);
    }
    ASSERT_EQ(p_split, p_whole);
    ASSERT_EQ(std::memcmp(split.held().data(), whole.held().data(), 2 * n * sizeof(float)), 0);
    const std::vector<float> a = whole.global(), b = split.global();
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  RootModel m(init);
  std::vector<float> theta = target;
  theta[3 * 2048 + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> payload(fp16.encoded_size(n));
  EXPECT_LT(m.fp16_measure(n, static_cast<uint32_t>(n), theta.data(), payload.data(), 0, 3),
            kernels::kF32ExpMask);
  EXPECT_GE(m.fp16_measure(n, static_cast<uint32_t>(n), theta.data(), payload.data(), 3, 4),
            kernels::kF32ExpMask);
}

TEST(RootModel, AnAdvancingEncodeRefusesANonFiniteStepWithTheAnchorUntouched) {
  for (const char* name : {"fp16", "bf16"}) {
    SCOPED_TRACE(name);
    const Codec& codec = codec_by_name(name);
    const size_t n = 4500;
    const std::vector<float> init = ramp(n, 0.1f, 0.002f);
    RootModel m(init);
    std::vector<float> theta = init;
    for (float& x : theta) x += 1e-3f;
    theta[n - 3] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> diff;
    std::vector<uint8_t> payload(codec.encoded_size(n));
    EXPECT_THROW(m.encode_and_settle(0, static_cast<uint32_t>(n), theta.data(), codec,
                                     payload.data(), diff, RootModel::Anchor::kAdvances),
                 Error);
    EXPECT_EQ(std::memcmp(m.held().data(), init.data(), n * sizeof(float)), 0);
    const std::vector<float> g = m.global();
    EXPECT_EQ(std::memcmp(g.data(), init.data(), n * sizeof(float)), 0);
  }
}

TEST(RootModel, EncodeAndSettleRefusesANonFiniteStepWithTheModelUntouched) {
  const Codec& fp16 = codec_by_name("fp16");
  const size_t n = 4500;
  const std::vector<float> init = ramp(n, 0.1f, 0.002f);
  RootModel m(init);
  // A first settled round, so the residual is not all zeros.
  std::vector<float> first = init;
  for (float& x : first) x += 1.3e-4f;
  const std::vector<uint8_t> p = step_to(m, 0, first, fp16);
  m.apply(0, static_cast<uint32_t>(n), fp16, p.data());
  const std::vector<float> before = m.global();
  std::vector<float> theta = before;
  theta[n - 3] = std::numeric_limits<float>::infinity();  // in the last block
  std::vector<float> diff;
  std::vector<uint8_t> payload(fp16.encoded_size(n));
  try {
    m.encode_and_settle(0, static_cast<uint32_t>(n), theta.data(), fp16, payload.data(), diff);
    ADD_FAILURE() << "an infinite step was encoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite value"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("element " + std::to_string(n - 3)), std::string::npos)
        << e.what();
  }
  const std::vector<float> after = m.global();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), n * sizeof(float)), 0);
}

TEST(RootModel, ACheckpointRestoresItBitForBit) {
  const Codec& fp16 = codec_by_name("fp16");
  RootModel m(ramp(3000, 1.0f, -0.002f));
  std::vector<float> target = m.held();
  for (float& x : target) x += 7e-4f;
  const std::vector<uint8_t> payload = step_to(m, 0, target, fp16);
  m.apply(0, 3000, fp16, payload.data());

  Checkpoint c;
  m.save(c);
  // What a read returns: the bytes, not views.
  for (CheckpointSection& s : c.sections) {
    s.bytes.assign(s.data(), s.data() + s.size());
    s.view = nullptr;
  }
  const RootModel back = RootModel::restore(c);
  EXPECT_EQ(back.held(), m.held());
  EXPECT_EQ(back.global(), m.global());
}

TEST(RootModel, ACheckpointWithTheGlobalModelBesideTheAnchorStillRestores) {
  const std::vector<float> held = ramp(500, 2.0f, 0.01f);
  std::vector<float> global = held;
  for (float& x : global) x += 3e-5f;
  Checkpoint c;
  c.sections.push_back(checkpoint::float_section("global", global.data(), global.size()));
  c.sections.push_back(checkpoint::float_section("held", held.data(), held.size()));
  for (CheckpointSection& s : c.sections) {
    s.bytes.assign(s.data(), s.data() + s.size());
    s.view = nullptr;
  }
  const RootModel m = RootModel::restore(c);
  EXPECT_EQ(m.held(), held);
  const std::vector<float> g = m.global();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], global[i], 3e-5f / 256) << i;
}

TEST(RootModel, AResidualOfTheWrongSizeIsRefused) {
  const std::vector<float> held(10, 1.0f);
  Checkpoint c;
  c.sections.push_back(checkpoint::float_section("held", held.data(), held.size()));
  CheckpointSection r;
  r.name = "residual";
  r.bytes.assign(18, 0);
  c.sections.push_back(r);
  EXPECT_THROW(RootModel::restore(c), CryptoError);
  c.sections.pop_back();
  EXPECT_THROW(RootModel::restore(c), CryptoError);  // neither residual nor global
}

TEST(RootModel, TakeGlobalLeavesItEmpty) {
  RootModel m(std::vector<float>(100, 3.0f));
  const std::vector<float> g = m.take_global();
  EXPECT_EQ(g, std::vector<float>(100, 3.0f));
  EXPECT_EQ(m.size(), 0u);
}

}  // namespace
}  // namespace fedwan::aggregator
