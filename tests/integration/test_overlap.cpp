// Overlapped rounds (federation.overlap_steps): sites keep training while
// their update goes up and merge the next anchor tau steps late. A whole
// federation must equal the in-process reference of that schedule bit for
// bit, and the calls must refuse misuse clearly.
#include <gtest/gtest.h>

#include <cstring>

#include "fedwan/error.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/reference_federation.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 11;

FederationSpec overlap_spec(const std::string& codec, const std::string& outer, uint64_t tau) {
  FederationSpec f;
  f.rounds = 4;
  f.inner_steps = 3;
  f.overlap_steps = tau;
  f.codec = codec;
  f.chunk_bytes = 4096;
  f.outer.name = outer;
  f.round_timeout_s = 15;
  return f;
}

LocalSteps synthetic_steps() {
  return [](uint32_t site, uint64_t steps, std::vector<float>& p) {
    synthetic::local_steps(p.data(), p.size(), site, steps, kSeed);
  };
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  std::string codec;
  std::string outer;
  uint64_t tau;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.codec << "/" << c.outer << "/" << c.tau; }

class OverlapMatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(OverlapMatchesReference, TwoRegionsFourSites) {
  TempDir dir;
  const Case& c = GetParam();
  const Topology topo = make_tree(dir.path(), 2, 2, overlap_spec(c.codec, c.outer, c.tau));
  const std::vector<float> init = synthetic::initial_model(5000, kSeed);  // 5 chunks
  FederationRun run = run_threads(topo, init, kSeed);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref = run_reference_overlap(topo, init, synthetic_steps());
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
  for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, ref.held));
  ASSERT_EQ(run.root.reports.size(), 4u);
  // The schedule matters: the blocking federation ends elsewhere.
  const ReferenceResult blocking =
      run_reference(topo, init, [](uint32_t site, uint64_t, std::vector<float>& p) {
        synthetic::local_steps(p.data(), p.size(), site, 3, kSeed);
      });
  EXPECT_FALSE(bit_equal(ref.global, blocking.global));
  EXPECT_FALSE(bit_equal(ref.global, init));
}

INSTANTIATE_TEST_SUITE_P(Codecs, OverlapMatchesReference,
                         ::testing::Values(Case{"fp32", "fedavg", 1}, Case{"fp16", "diloco", 2},
                                           Case{"int8", "fedavg", 3}, Case{"bf16", "fedadam", 1}),
                         [](const auto& info) {
                           return info.param.codec + "_" + info.param.outer + "_tau" +
                                  std::to_string(info.param.tau);
                         });

// Many more chunks than the window while the caller trains: the worker
// reads anchors while it sends, so nothing deadlocks.
TEST(Overlap, ManyChunksThroughASmallWindow) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 2, 2, overlap_spec("fp16", "diloco", 2));
  const std::vector<float> init = synthetic::initial_model(256000, kSeed);
  FederationRun run = run_threads(topo, init, kSeed, /*window=*/2);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref = run_reference_overlap(topo, init, synthetic_steps());
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
}

// Misuse is refused with a message, and the core stays usable.
TEST(Overlap, RefusesCallsOutOfOrder) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 1, overlap_spec("fp16", "fedavg", 1));
  const std::vector<float> init = synthetic::initial_model(3000, kSeed);
  FederationRun run;
  SiteSetup setup;
  setup.created = [](SiteCore& site, size_t) {
    EXPECT_FALSE(site.sync_pending());
    EXPECT_EQ(site.overlap_steps(), 1u);
    EXPECT_EQ(site.rounds(), 4u);
    try {
      site.begin_sync();
      ADD_FAILURE() << "begin_sync before join accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("call join() before begin_sync()"), std::string::npos)
          << e.what();
    }
    try {
      site.finish_sync();
      ADD_FAILURE() << "finish_sync without begin_sync accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no sync is pending"), std::string::npos) << e.what();
    }
  };
  run = run_threads(topo, init, kSeed, 8, setup);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref = run_reference_overlap(topo, init, synthetic_steps());
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
}

}  // namespace
}  // namespace fedwan::testing
