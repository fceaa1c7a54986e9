// A site whose anchor lives in a mapped file (SiteOptions::page_out_from_bytes)
// must end exactly where one holding it in memory does: blocking rounds and
// overlapped ones (which update the anchor in place), lossy codecs, and a
// checkpoint directory that holds the file without a name left behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fedwan/synthetic.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/reference_federation.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 23;

FederationSpec spec(const std::string& codec, const std::string& outer, uint64_t tau) {
  FederationSpec f;
  f.rounds = 3;
  f.inner_steps = 2;
  f.overlap_steps = tau;
  f.codec = codec;
  f.chunk_bytes = 4096;
  f.outer.name = outer;
  f.round_timeout_s = 15;
  return f;
}

struct Case {
  std::string codec;
  std::string outer;
  uint64_t tau;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.codec << "/" << c.outer << "/" << c.tau; }

class AnchorInFile : public ::testing::TestWithParam<Case> {};

TEST_P(AnchorInFile, EndsWhereTheReferenceEnds) {
  TempDir dir;
  const Case& c = GetParam();
  const Topology topo = make_tree(dir.path(), 1, 2, spec(c.codec, c.outer, c.tau));
  const std::vector<float> init = synthetic::initial_model(6000, kSeed);  // 6 chunks
  SiteSetup setup;
  setup.options = [&dir](SiteOptions& o, size_t site, std::vector<float>&) {
    o.page_out_from_bytes = 0;
    o.checkpoint_dir = (dir / ("site-ckpt-" + std::to_string(site))).string();
  };
  FederationRun run = run_threads(topo, init, kSeed, 8, setup);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref =
      c.tau > 0
          ? run_reference_overlap(topo, init,
                                  [](uint32_t site, uint64_t steps, std::vector<float>& p) {
                                    synthetic::local_steps(p.data(), p.size(), site, steps, kSeed);
                                  })
          : run_reference(topo, init, [](uint32_t site, uint64_t, std::vector<float>& p) {
              synthetic::local_steps(p.data(), p.size(), site, 2, kSeed);
            });
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
  for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, ref.held));
  // The anchor's file had no name: the checkpoint directories hold
  // checkpoints and nothing that looks like a leftover mapping.
  for (size_t s = 0; s < 2; ++s) {
    const std::filesystem::path d = dir / ("site-ckpt-" + std::to_string(s));
    ASSERT_TRUE(std::filesystem::is_directory(d));
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      EXPECT_EQ(e.path().filename().string().find(".fedwan-unnamed"), std::string::npos)
          << e.path();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, AnchorInFile,
                         ::testing::Values(Case{"fp16", "diloco", 0}, Case{"int8", "fedavg", 0},
                                           Case{"fp16", "diloco", 1}),
                         [](const auto& info) {
                           return info.param.codec + "_" + info.param.outer + "_tau" +
                                  std::to_string(info.param.tau);
                         });

}  // namespace
}  // namespace fedwan::testing
