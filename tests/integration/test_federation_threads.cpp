// Whole federations with every node as a thread over ipc:// sockets (and
// over the in-process transport): the
// result must equal the in-process reference bit for bit, and traffic must
// be accounted exactly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "common/byte_pool.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/reference_federation.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 7;

FederationSpec spec(const std::string& codec, const std::string& outer, uint64_t rounds) {
  FederationSpec f;
  f.rounds = rounds;
  f.inner_steps = 3;
  f.codec = codec;
  f.chunk_bytes = 4096;  // many chunks even for a small model
  f.outer.name = outer;
  f.round_timeout_s = 15;
  return f;
}

LocalTraining synthetic_training(const Topology& topo) {
  return [&topo](uint32_t site, uint64_t, std::vector<float>& p) {
    synthetic::local_steps(p.data(), p.size(), site, topo.federation().inner_steps, kSeed);
  };
}

// The federation run as threads, held to the in-process reference bit for
// bit (the root's global model and every site's); empty on errors.
std::optional<FederationRun> run_matching_reference(const Topology& topo,
                                                    const std::vector<float>& init) {
  FederationRun run = run_threads(topo, init, kSeed);
  EXPECT_TRUE(run.errors.empty()) << run.error_text();
  if (!run.errors.empty()) return std::nullopt;
  const ReferenceResult ref = run_reference(topo, init, synthetic_training(topo));
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
  for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, ref.held));
  return run;
}

struct Case {
  std::string codec;
  std::string outer;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.codec << "/" << c.outer; }

class FederationMatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(FederationMatchesReference, TwoRegionsFourSites) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 2, 2, spec(GetParam().codec, GetParam().outer, 4));
  const std::vector<float> init = synthetic::initial_model(5000, kSeed);  // 5 chunks
  FederationRun run = run_threads(topo, init, kSeed);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref = run_reference(topo, init, synthetic_training(topo));
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
  for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, ref.held));
  // The federation made progress towards the sites' mean target.
  EXPECT_FALSE(bit_equal(ref.global, init));
  ASSERT_EQ(run.root.reports.size(), 4u);
  for (uint64_t r = 0; r < 4; ++r) EXPECT_EQ(run.root.reports[r].round, r);
}

// The same federation over the in-process transport: the aggregator and the
// site reach their links only through the transport interface.
TEST_P(FederationMatchesReference, TwoRegionsFourSitesInProcess) {
  TempDir dir;
  const Topology topo =
      make_tree(dir.path(), 2, 2, spec(GetParam().codec, GetParam().outer, 4), /*in_process=*/true);
  ASSERT_EQ(topo.root().endpoint.rfind("mem://", 0), 0u);
  const std::vector<float> init = synthetic::initial_model(5000, kSeed);
  const std::optional<FederationRun> run = run_matching_reference(topo, init);
  ASSERT_TRUE(run.has_value());
  ASSERT_EQ(run->root.reports.size(), 4u);
  // Exact traffic accounting holds over any transport.
  for (const auto& r : run->root.reports) EXPECT_GT(r.wan_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Codecs, FederationMatchesReference,
                         ::testing::Values(Case{"fp32", "fedavg"}, Case{"fp16", "fedavg"},
                                           Case{"fp16", "diloco"}, Case{"bf16", "fedadam"},
                                           Case{"int8", "fedavg"}, Case{"int8", "diloco"}),
                         [](const auto& info) {
                           return info.param.codec + "_" + info.param.outer;
                         });

TEST(Federation, SitesDirectlyUnderTheRoot) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, spec("fp32", "diloco", 3));
  const std::vector<float> init = synthetic::initial_model(3000, kSeed);
  FederationRun run = run_threads(topo, init, kSeed);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref = run_reference(topo, init, synthetic_training(topo));
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
}

TEST(Federation, ManyMoreChunksThanTheWindowDoNotDeadlock) {
  // Anchors of round r+1 flow down while deltas of round r still flow up;
  // with 250 chunks a round and a window of 2 frames, any node that blocks
  // in a send without reading would deadlock here.
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 2, 2, spec("fp16", "diloco", 3));
  const std::vector<float> init = synthetic::initial_model(256000, kSeed);
  FederationRun run = run_threads(topo, init, kSeed, /*window=*/2);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref = run_reference(topo, init, synthetic_training(topo));
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
}

// A chunk's commit at the root split over its link's crypto threads
// (chunks of 256K values, two threads: parts of whole fp16 blocks) gives
// the reference bit for bit: the anchor moved as each chunk goes down
// (sites under the root) or at the commit (regions between), fp16 settled
// in parts, and a codec whose encoding stays whole.
TEST(Federation, AChunkSplitOverTheRootsThreadsIsTheReference) {
  const char* before = std::getenv("FEDWAN_CRYPTO_THREADS");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("FEDWAN_CRYPTO_THREADS", "2", 1);
  struct Shape {
    uint32_t regions;
    const char* codec;
    const char* outer;
  };
  for (const Shape& s :
       {Shape{0, "fp16", "diloco"}, Shape{2, "fp16", "fedadam"}, Shape{0, "int8", "diloco"}}) {
    SCOPED_TRACE(std::string(s.codec) + "/" + s.outer + " regions " + std::to_string(s.regions));
    TempDir dir;
    FederationSpec f = spec(s.codec, s.outer, 3);
    f.chunk_bytes = 1 << 20;
    const Topology topo = make_tree(dir.path(), s.regions, 2, f);
    // Two whole chunks and one of 75712 values (37 blocks: parts of 32 and 5).
    const std::vector<float> init = synthetic::initial_model(600000, kSeed);
    EXPECT_TRUE(run_matching_reference(topo, init).has_value());
  }
  if (before != nullptr) {
    ::setenv("FEDWAN_CRYPTO_THREADS", saved.c_str(), 1);
  } else {
    ::unsetenv("FEDWAN_CRYPTO_THREADS");
  }
}

// A site's pool keeps its update's frames between rounds, and lets go of
// them with the site: after the run the process's pool holds no more than
// what it keeps for every site (eight sealed frames: 512 KiB of payload
// each, plus under 1 KiB of header and seal), not the 8 MiB of fp16 frames
// two sites of 4M parameters made each round.
TEST(Federation, ASitesFramesLeaveThePoolWithTheSite) {
  TempDir dir;
  FederationSpec f = spec("fp16", "fedavg", 3);
  f.chunk_bytes = 1 << 20;  // frames of 512 KiB: pooled
  const Topology topo = make_tree(dir.path(), 0, 2, f);
  const std::vector<float> init = synthetic::initial_model(4u << 20, kSeed);
  FederationRun run = run_threads(topo, init, kSeed);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  EXPECT_LE(BytePool::shared().kept_buffers(), 8u);
  constexpr size_t kSealedFrame = (size_t{512} << 10) + 1024;
  EXPECT_LE(BytePool::shared().kept_bytes(), 8 * kSealedFrame);
}

// Runs 5 rounds of a 300000-parameter model in 1 MiB chunks and returns the
// root's WAN bytes over their fp32 equivalent, after checking the totals.
constexpr uint64_t kModelBytes = 300000 * 4;

// What the ratio should be: the rounds' payloads at `codec_ratio` of fp32,
// plus each region's fetch of the full fp32 model at its join (2 regions of
// 2 sites: 6 links).
double expected_ratio(double codec_ratio, uint32_t regions) {
  const double links = regions == 0 ? 2 : regions + regions * 2;
  const double rounds = links * 5 * 2 * kModelBytes;
  const double joins = regions * double(kModelBytes);
  return (codec_ratio * rounds + joins) / (rounds + joins);
}

// `regions` 0: the sites straight under the root (a flat tree).
double wan_bytes_ratio(const std::string& codec, uint32_t regions) {
  TempDir dir;
  FederationSpec f = spec(codec, "fedavg", 5);
  f.chunk_bytes = 1 << 20;
  const Topology topo = make_tree(dir.path(), regions, 2, f);
  const std::vector<float> init = synthetic::initial_model(300000, kSeed);
  FederationRun run = run_threads(topo, init, kSeed);
  EXPECT_TRUE(run.errors.empty()) << run.error_text();
  // links x 5 rounds x 2 directions x (300000 x 4 bytes) is the fp32 floor;
  // a region also fetches the model in full (fp32) when it joins; headers
  // and control frames add well under 1%.
  const uint64_t links = topo.nodes().size() - 1;
  const uint64_t floor = links * 5 * 2 * kModelBytes;
  EXPECT_GE(run.root.fp32_bytes_total, floor);
  EXPECT_LE(run.root.fp32_bytes_total, floor + regions * kModelBytes + floor / 100);
  // Totals are the sum of the per-round reports.
  uint64_t sum = 0;
  for (const RoundReport& r : run.root.reports) sum += r.wan_bytes;
  EXPECT_EQ(sum, run.root.wan_bytes_total);
  return run.root.fp32_bytes_total == 0
             ? 0.0
             : double(run.root.wan_bytes_total) / double(run.root.fp32_bytes_total);
}

TEST(Federation, Fp32OnAFlatTreeIsItsOwnFp32Equivalent) {
  // Nothing compresses: every byte counted is a byte of its fp32 equivalent
  // (the root's own anchors once counted their payload twice, 0.667).
  EXPECT_NEAR(wan_bytes_ratio("fp32", 0), 1.0, 0.01);
  EXPECT_NEAR(wan_bytes_ratio("fp32", 2), 1.0, 0.01);
}

TEST(Federation, Fp16HalvesTheWanBytes) {
  // Every link carries one delta up and one anchor down per round: with fp16
  // payloads the bytes are half of fp32's, headers and joins aside.
  EXPECT_NEAR(wan_bytes_ratio("fp16", 0), 0.5, 0.01);
  EXPECT_NEAR(wan_bytes_ratio("fp16", 2), expected_ratio(0.5, 2), 0.01);
}

TEST(Federation, ARegionGivenTheInitialModelIsNotSentIt) {
  // Regions that start from the root's model join without the fp32 model
  // crossing the root's links: the rounds' payloads are all there is.
  TempDir dir;
  FederationSpec f = spec("fp16", "diloco", 5);
  f.chunk_bytes = 1 << 20;
  const Topology topo = make_tree(dir.path(), 2, 2, f);
  const std::vector<float> init = synthetic::initial_model(300000, kSeed);
  SiteSetup setup;
  setup.region_initial_model = init;
  FederationRun run = run_threads(topo, init, kSeed, 8, setup);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const uint64_t floor = (topo.nodes().size() - 1) * 5 * 2 * kModelBytes;
  EXPECT_GE(run.root.fp32_bytes_total, floor);
  EXPECT_LE(run.root.fp32_bytes_total, floor + floor / 100);
  EXPECT_NEAR(double(run.root.wan_bytes_total) / double(run.root.fp32_bytes_total), 0.5, 0.01);
  const ReferenceResult ref = run_reference(topo, init, synthetic_training(topo));
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));

  // A region given another model is sent the root's, and the federation is
  // the same.
  TempDir dir2;
  const Topology topo2 = make_tree(dir2.path(), 2, 2, f);
  setup.region_initial_model.assign(init.size(), 0.25f);
  FederationRun other = run_threads(topo2, init, kSeed, 8, setup);
  ASSERT_TRUE(other.errors.empty()) << other.error_text();
  EXPECT_GE(other.root.fp32_bytes_total, floor + 2 * kModelBytes);
  EXPECT_TRUE(bit_equal(other.root.global_model, ref.global));
  for (const std::vector<float>& m : other.site_models) EXPECT_TRUE(bit_equal(m, ref.held));
}

TEST(Federation, Int8QuartersTheWanBytes) {
  // One byte a value plus a 4-byte scale per 256 values: 0.254 of fp32.
  EXPECT_NEAR(wan_bytes_ratio("int8", 0), 0.254, 0.01);
  EXPECT_NEAR(wan_bytes_ratio("int8", 2), expected_ratio(0.254, 2), 0.01);
}

}  // namespace
}  // namespace fedwan::testing
