// Sites whose update is encoded outside SiteCore (SiteOptions::
// update_encoder), as a GPU site's is: the federation must end exactly where
// the host path ends, the encoder must be asked for every chunk of every
// round, and checkpoints must carry the encoder's residual both ways.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>

#include "checkpoint/node_checkpoint.hpp"
#include "codec/half.hpp"
#include "fedwan/error.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/reference_federation.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 11;

// The host twin of the GPU site's encoder: its own residual, the delta
// measured from SiteCore::anchor() and the live parameters.
class HostUpdateEncoder final : public UpdateEncoder {
 public:
  explicit HostUpdateEncoder(const std::vector<float>& params) : params_(params) {}
  void attach(const SiteCore& core) { core_ = &core; }

  void encode(const Codec& codec, uint64_t offset, uint32_t n, bool error_feedback,
              uint8_t* out) override {
    if (error_feedback && residual.size() != params_.size()) {
      residual.assign(params_.size(), 0.0f);
    }
    std::vector<float> delta(n);
    const float* anchor = core_->anchor();
    for (uint32_t k = 0; k < n; ++k) delta[k] = anchor[offset + k] - params_[offset + k];
    codec.encode(delta.data(), n, error_feedback ? residual.data() + offset : nullptr, out);
    chunks += 1;
  }
  void read_residual(float* out, size_t n) override {
    ASSERT_EQ(n, residual.size());
    std::memcpy(out, residual.data(), n * sizeof(float));
    reads += 1;
  }
  void write_residual(const float* in, size_t n) override {
    residual.assign(in, in + n);
    writes += 1;
  }

  std::vector<float> residual;
  int chunks = 0, reads = 0, writes = 0;

 private:
  const std::vector<float>& params_;
  const SiteCore* core_ = nullptr;
};

FederationSpec spec(const std::string& codec, uint64_t rounds) {
  FederationSpec f;
  f.rounds = rounds;
  f.inner_steps = 3;
  f.codec = codec;
  f.chunk_bytes = 4096;
  f.outer.name = "diloco";
  f.round_timeout_s = 15;
  return f;
}

// Installs a HostUpdateEncoder in every site (kept in `encoders`, by site).
SiteSetup with_encoders(std::vector<std::shared_ptr<HostUpdateEncoder>>& encoders, std::mutex& mu,
                        const std::filesystem::path& checkpoints = {}) {
  SiteSetup setup;
  setup.options = [&encoders, &mu, checkpoints](SiteOptions& o, size_t site,
                                                std::vector<float>& params) {
    auto e = std::make_shared<HostUpdateEncoder>(params);
    o.update_encoder = e;
    if (!checkpoints.empty()) o.checkpoint_dir = (checkpoints / o.node_id).string();
    std::lock_guard<std::mutex> lock(mu);
    if (encoders.size() <= site) encoders.resize(site + 1);
    encoders[site] = e;
  };
  setup.created = [&encoders, &mu](SiteCore& core, size_t site) {
    std::lock_guard<std::mutex> lock(mu);
    encoders[site]->attach(core);
  };
  return setup;
}

class UpdateEncoderMatchesHostPath : public ::testing::TestWithParam<std::string> {};

TEST_P(UpdateEncoderMatchesHostPath, TwoRegionsFourSites) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 2, 2, spec(GetParam(), 3));
  const std::vector<float> init = synthetic::initial_model(5000, kSeed);  // 5 chunks
  std::vector<std::shared_ptr<HostUpdateEncoder>> encoders;
  std::mutex mu;
  FederationRun run = run_threads(topo, init, kSeed, 8, with_encoders(encoders, mu));
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  // Such an encoder keeps its residual in fp32 (a GPU's device memory), where
  // a site encoding on the host keeps it in bf16.
  const ReferenceResult ref = run_reference(
      topo, init,
      [&topo](uint32_t site, uint64_t, std::vector<float>& p) {
        synthetic::local_steps(p.data(), p.size(), site, topo.federation().inner_steps, kSeed);
      },
      SiteResidual::kFp32);
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
  for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, ref.held));
  ASSERT_EQ(encoders.size(), 4u);
  for (const auto& e : encoders) EXPECT_EQ(e->chunks, 3 * 5) << "every chunk of every round";
}

INSTANTIATE_TEST_SUITE_P(Codecs, UpdateEncoderMatchesHostPath,
                         ::testing::Values("fp32", "fp16", "int8"));

TEST(UpdateEncoder, CheckpointsCarryTheEncodersResidualBothWays) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, spec("int8", 3));
  const std::vector<float> init = synthetic::initial_model(5000, kSeed);
  std::vector<std::shared_ptr<HostUpdateEncoder>> encoders;
  std::mutex mu;
  const std::filesystem::path checkpoints = dir.path() / "checkpoints";
  FederationRun run = run_threads(topo, init, kSeed, 8, with_encoders(encoders, mu, checkpoints));
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  ASSERT_EQ(encoders.size(), 2u);

  size_t site = 0;
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role != Role::kSite) continue;
    SCOPED_TRACE(n.id);
    const HostUpdateEncoder& used = *encoders[site++];
    EXPECT_GE(used.reads, 3) << "a checkpoint at every round boundary reads the residual";
    // The last checkpoint holds the residual the encoder ended with.
    const auto loaded = checkpoint::load_node_checkpoint(checkpoints / n.id, topo, n.id);
    ASSERT_TRUE(loaded.has_value());
    const std::vector<float> saved = checkpoint::floats_of(loaded->checkpoint, "residual", 0);
    ASSERT_FALSE(saved.empty());
    EXPECT_TRUE(bit_equal(saved, used.residual));
    bool nonzero = false;
    for (float r : saved) nonzero = nonzero || r != 0.0f;
    EXPECT_TRUE(nonzero) << "int8 leaves a residual";

    // A restarted site hands the saved residual back to its new encoder
    // (join() resumes before it looks for the parent, which is gone here).
    std::vector<float> params = init;
    auto fresh = std::make_shared<HostUpdateEncoder>(params);
    SiteOptions o;
    o.topology = topo;
    o.node_id = n.id;
    o.join_timeout = std::chrono::milliseconds(300);
    o.security = security_for(topo, n.id);
    o.checkpoint_dir = (checkpoints / n.id).string();
    o.update_encoder = fresh;
    SiteCore again(std::move(o), params.data(), params.size());
    fresh->attach(again);
    try {
      again.join();
    } catch (const fedwan::Error&) {
      // No parent any more; the resume already happened.
    }
    EXPECT_TRUE(again.resumed());
    EXPECT_EQ(fresh->writes, 1);
    EXPECT_TRUE(bit_equal(fresh->residual, saved));
  }
}

// A host site's checkpoint holds its residual in bf16 ("residual.bf16");
// an encoder's site resumed from it gets those values widened to fp32. An
// encoder's checkpoint (fp32 "residual", as every site's were before host
// sites kept theirs in bf16) resumes a host site.
TEST(UpdateEncoder, Fp32AndBf16ResidualsResumeEitherKindOfSite) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, spec("int8", 3));
  const std::vector<float> init = synthetic::initial_model(5000, kSeed);
  const std::string id = "site-0";

  auto resume = [&](const std::filesystem::path& from, std::shared_ptr<HostUpdateEncoder> encoder,
                    std::vector<float>& params) {
    SiteOptions o;
    o.topology = topo;
    o.node_id = id;
    o.join_timeout = std::chrono::milliseconds(300);
    o.security = security_for(topo, id);
    o.checkpoint_dir = from.string();
    o.update_encoder = encoder;
    SiteCore core(std::move(o), params.data(), params.size());
    if (encoder) encoder->attach(core);
    try {
      core.join();
    } catch (const fedwan::Error&) {
      // No parent any more; the resume already happened.
    }
    EXPECT_TRUE(core.resumed());
  };

  // Host sites: bf16 in their checkpoints.
  const std::filesystem::path host_dir = dir.path() / "host";
  SiteSetup host;
  host.options = [&](SiteOptions& o, size_t, std::vector<float>&) {
    o.checkpoint_dir = (host_dir / o.node_id).string();
  };
  FederationRun run = run_threads(topo, init, kSeed, 8, host);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const auto written = checkpoint::load_node_checkpoint(host_dir / id, topo, id);
  ASSERT_TRUE(written.has_value());
  ASSERT_EQ(written->checkpoint.find("residual"), nullptr);
  const CheckpointSection* bf16 = written->checkpoint.find("residual.bf16");
  ASSERT_NE(bf16, nullptr);
  ASSERT_EQ(bf16->size(), init.size() * sizeof(uint16_t));
  std::vector<float> widened(init.size());
  kernels::half_kernels().bf16_decode(section_bytes(*bf16).data(), init.size(), widened.data());
  bool nonzero = false;
  for (float r : widened) nonzero = nonzero || r != 0.0f;
  EXPECT_TRUE(nonzero) << "int8 leaves a residual";

  std::vector<float> params = init;
  auto encoder = std::make_shared<HostUpdateEncoder>(params);
  resume(host_dir / id, encoder, params);
  EXPECT_EQ(encoder->writes, 1);
  EXPECT_TRUE(bit_equal(encoder->residual, widened));

  // An encoder's site: fp32, which a host site takes.
  std::vector<std::shared_ptr<HostUpdateEncoder>> encoders;
  std::mutex mu;
  const std::filesystem::path encoder_dir = dir.path() / "encoder";
  run = run_threads(topo, init, kSeed, 8, with_encoders(encoders, mu, encoder_dir));
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const auto fp32 = checkpoint::load_node_checkpoint(encoder_dir / id, topo, id);
  ASSERT_TRUE(fp32.has_value());
  ASSERT_NE(fp32->checkpoint.find("residual"), nullptr);
  std::vector<float> host_params = init;
  resume(encoder_dir / id, nullptr, host_params);
}

}  // namespace
}  // namespace fedwan::testing
