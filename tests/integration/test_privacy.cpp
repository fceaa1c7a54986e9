// Differential privacy end to end (docs/security.md, "Differential
// privacy"), in-process federations: central mode clips each site where it
// arrives and the root noises the sum; local mode has each site clip and
// noise its own update; the accountant's figures reach the audit log and
// the summaries; a budget ends the federation at the last round within it.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/privacy.hpp"
#include "fedwan/synthetic.hpp"
#include "harness/audit_replay.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/reference_federation.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 31;
constexpr size_t kElements = 3000;  // three chunks

FederationSpec federation(const std::string& mode, double clip, double z, uint64_t rounds = 3,
                          const std::string& codec = "fp32") {
  FederationSpec f;
  f.rounds = rounds;
  f.inner_steps = 3;
  f.codec = codec;
  f.chunk_bytes = 4096;
  f.round_timeout_s = 30;
  f.privacy.mode = mode;
  f.privacy.clip = clip;
  f.privacy.noise_multiplier = z;
  return f;
}

struct PrivateRun {
  FederationRun run;
  std::vector<std::vector<float>> globals;  // the root's model after each round
  std::vector<AuditEntry> root_audit;
  std::vector<std::vector<AuditEntry>> site_audits;
};

PrivateRun run_private(const TempDir& dir, const Topology& topo) {
  PrivateRun out;
  std::mutex mu;
  SiteSetup setup;
  setup.options = [&dir](SiteOptions& o, size_t, std::vector<float>&) {
    o.security = SecurityOptions{};
    o.security.insecure_plaintext = true;
    o.security.audit_log = (dir.path() / (o.node_id + ".audit.jsonl")).string();
  };
  setup.aggregator = [&](AggregatorOptions& o) {
    o.security = SecurityOptions{};
    o.security.insecure_plaintext = true;
    o.security.audit_log = (dir.path() / (o.node_id + ".audit.jsonl")).string();
    if (topo.node(o.node_id).role == Role::kRoot) {
      o.on_model = [&](uint64_t, const std::vector<float>& g) {
        std::lock_guard<std::mutex> lock(mu);
        out.globals.push_back(g);
      };
    }
  };
  out.run = run_threads(topo, synthetic::initial_model(kElements, kSeed), kSeed, 8, setup);
  out.root_audit = read_audit(dir.path() / "root.audit.jsonl");
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role == Role::kSite)
      out.site_audits.push_back(read_audit(dir.path() / (n.id + ".audit.jsonl")));
  }
  return out;
}

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sq = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    sq += d * d;
  }
  return std::sqrt(sq);
}

std::vector<AuditEntry> events(const std::vector<AuditEntry>& audit, const std::string& name) {
  std::vector<AuditEntry> out;
  for (const AuditEntry& e : audit) {
    if (e.event == name) out.push_back(e);
  }
  return out;
}

ReferenceResult reference(const Topology& topo) {
  return run_reference(topo, synthetic::initial_model(kElements, kSeed),
                       [](uint32_t site, uint64_t, std::vector<float>& p) {
                         synthetic::local_steps(p.data(), p.size(), site, 3, kSeed);
                       });
}

// Noise far below the updates and a clip far above them: the federation's
// model is the plain one, so the clip, the weights and the noise's place in
// the pipeline are right; the audit has one privacy entry a round with the
// accountant's epsilon.
TEST(Privacy, CentralWithNegligibleNoiseIsThePlainFederation) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 4, federation("central", 100, 1e-7), true);
  const PrivateRun r = run_private(dir, topo);
  ASSERT_TRUE(r.run.errors.empty()) << r.run.error_text();
  EXPECT_EQ(r.run.root.privacy_clipped, 0u);
  const ReferenceResult ref = reference(topo);
  EXPECT_LT(distance(r.run.root.global_model, ref.global), 1e-3);
  const std::vector<AuditEntry> p = events(r.root_audit, "privacy");
  ASSERT_EQ(p.size(), 3u);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].fields.value("round", 99u), i);
    EXPECT_EQ(p[i].fields.value("mode", ""), "central");
    EXPECT_DOUBLE_EQ(p[i].fields.value("epsilon", -1.0), gaussian_epsilon(1e-7, i + 1, 1e-5));
  }
  EXPECT_DOUBLE_EQ(r.run.root.privacy_epsilon, gaussian_epsilon(1e-7, 3, 1e-5));
}

// A clip far below the updates: every site's copy is clipped where it
// arrives, so no round moves the model by more than the clip.
TEST(Privacy, CentralClipBoundsEveryRoundsStepAtEveryTier) {
  for (int regions : {0, 2}) {
    TempDir dir;
    const double clip = 1e-3;
    const Topology topo = make_tree(dir.path(), regions, regions == 0 ? 4 : 2,
                                    federation("central", clip, 1e-4), true);
    const PrivateRun r = run_private(dir, topo);
    ASSERT_TRUE(r.run.errors.empty()) << r.run.error_text();
    ASSERT_EQ(r.globals.size(), 3u);
    std::vector<float> prev = synthetic::initial_model(kElements, kSeed);
    for (const std::vector<float>& g : r.globals) {
      const double step = distance(g, prev);
      EXPECT_GT(step, 0.0);
      EXPECT_LT(step, clip * 1.05) << "regions " << regions;
      prev = g;
    }
    // Clipped where the sites' copies arrive: 4 sites x 3 chunks x 3 rounds.
    uint64_t clipped = r.run.root.privacy_clipped;
    for (const AggregatorSummary& s : r.run.regions) clipped += s.privacy_clipped;
    EXPECT_EQ(clipped, 36u) << "regions " << regions;
    if (regions > 0) EXPECT_EQ(r.run.root.privacy_clipped, 0u);
  }
}

// Local mode: every site releases one noised update a round (its own audit
// log says so); with negligible noise the model is the plain one, over a
// lossy codec and regions.
TEST(Privacy, LocalNoisesEachSitesUpdateBeforeItsCodec) {
  TempDir dir;
  const Topology topo =
      make_tree(dir.path(), 2, 2, federation("local", 100, 1e-7, 3, "fp16"), true);
  const PrivateRun r = run_private(dir, topo);
  ASSERT_TRUE(r.run.errors.empty()) << r.run.error_text();
  for (const auto& audit : r.site_audits) {
    const std::vector<AuditEntry> rel = events(audit, "privacy_release");
    ASSERT_EQ(rel.size(), 3u);
    for (size_t i = 0; i < rel.size(); ++i) {
      EXPECT_EQ(rel[i].fields.value("round", 99u), i);
      EXPECT_FALSE(rel[i].fields.value("clipped", true));
    }
  }
  const ReferenceResult ref = reference(topo);
  EXPECT_LT(distance(r.run.root.global_model, ref.global), 2e-2);  // fp16 both ways
  EXPECT_DOUBLE_EQ(r.run.root.privacy_epsilon, gaussian_epsilon(1e-7, 3, 1e-5));
}

// Noise that matters: with z = 1 and the clip at the updates' scale, the
// model moves away from the plain one by about what the noise predicts.
TEST(Privacy, CentralNoiseHasTheCalibratedScale) {
  TempDir dir;
  const double clip = 0.05;
  const Topology topo = make_tree(dir.path(), 0, 4, federation("central", clip, 1.0, 1), true);
  const PrivateRun r = run_private(dir, topo);
  ASSERT_TRUE(r.run.errors.empty()) << r.run.error_text();
  ASSERT_EQ(r.globals.size(), 1u);
  // The mean's noise: z x clip x the largest weight over the total weight,
  // per coordinate; over 3000 coordinates its norm is that x sqrt(3000).
  double max_w = 0, total = 0;
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role != Role::kSite) continue;
    max_w = std::max(max_w, n.weight);
    total += n.weight;
  }
  const double expected = 1.0 * clip * max_w / total * std::sqrt(static_cast<double>(kElements));
  // The clipped mean's own step is at most the clip.
  const double step = distance(r.globals[0], synthetic::initial_model(kElements, kSeed));
  // The noise's norm is within 1.3% of that (a chi distribution over 3000
  // coordinates): these bounds are over seven of its deviations away.
  EXPECT_GT(step, expected * 0.9 - clip);
  EXPECT_LT(step, expected * 1.1 + clip);
}

// The budget ends the federation after the last round within it; every
// node finishes cleanly, and the root audits the end.
TEST(Privacy, TheBudgetStopsTheFederationAtTheRightRound) {
  TempDir dir;
  FederationSpec f = federation("central", 1.0, 1.0, 10);
  f.privacy.epsilon_budget = 12;  // z = 1: rounds_within(12) rounds
  const Topology topo = make_tree(dir.path(), 2, 2, f, true);
  const uint64_t allowed = rounds_within(12, 1e-5, 1.0);
  ASSERT_GT(allowed, 0u);
  ASSERT_LT(allowed, 10u);
  ASSERT_EQ(topo.rounds_to_run(), allowed);
  const PrivateRun r = run_private(dir, topo);
  ASSERT_TRUE(r.run.errors.empty()) << r.run.error_text();
  EXPECT_EQ(r.run.root.reports.size(), allowed);
  EXPECT_EQ(r.globals.size(), allowed);
  EXPECT_LE(r.run.root.privacy_epsilon, 12.0);
  const std::vector<AuditEntry> end = events(r.root_audit, "privacy_budget_reached");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].fields.value("round", 0u), allowed - 1);
  EXPECT_EQ(end[0].fields.value("rounds_asked", 0u), 10u);
  for (const auto& m : r.run.site_models) EXPECT_LT(distance(m, r.run.root.global_model), 1e-5);
}

}  // namespace
}  // namespace fedwan::testing

namespace fedwan::testing {
namespace {

// Adaptive clipping (federation.privacy.target_quantile): the root moves the
// clip each round toward the quantile of the sites' update norms, from a
// noised count of the sites it did not clip; the audit log has each move.
std::vector<double> clips_of(const std::vector<AuditEntry>& audit) {
  std::vector<double> out;
  for (const AuditEntry& e : events(audit, "privacy_clip")) {
    if (out.empty()) out.push_back(e.fields.value("clip", 0.0));
    out.push_back(e.fields.value("next_clip", 0.0));
  }
  return out;
}

FederationSpec adaptive(double clip, uint64_t rounds) {
  FederationSpec f = federation("central", clip, 0.05, rounds);
  f.privacy.target_quantile = 0.5;
  f.privacy.clip_learning_rate = 1.0;
  f.privacy.clip_count_budget = 0.5;  // the count's multiplier: 0.05 / sqrt(0.5), a tenth of a site
  return f;
}

TEST(PrivacyAdaptiveClip, AClipFarBelowTheNormsGrowsEveryRound) {
  TempDir dir;
  const uint64_t rounds = 6;
  const Topology topo = make_tree(dir.path(), 0, 8, adaptive(1e-6, rounds), true);
  const PrivateRun r = run_private(dir, topo);
  ASSERT_TRUE(r.run.errors.empty()) << r.run.error_text();
  const std::vector<double> clips = clips_of(r.root_audit);
  ASSERT_EQ(clips.size(), rounds + 1);
  EXPECT_EQ(clips.front(), 1e-6);
  // Every site clipped: each round multiplies the clip by about exp(0.5).
  for (size_t i = 1; i < clips.size(); ++i) {
    EXPECT_GT(clips[i], clips[i - 1] * std::exp(0.3)) << "round " << i;
    EXPECT_LT(clips[i], clips[i - 1] * std::exp(0.7)) << "round " << i;
  }
  // The root's audit, status and report say where it is.
  const std::vector<AuditEntry> spent = events(r.root_audit, "privacy");
  ASSERT_FALSE(spent.empty());
  EXPECT_DOUBLE_EQ(spent.back().fields.value("clip", 0.0), clips.back());
  ASSERT_TRUE(spent.back().fields.contains("adaptive_clip"));
  EXPECT_EQ(spent.back().fields["adaptive_clip"].value("target_quantile", 0.0), 0.5);
  // Epsilon is what the fixed clip would have spent: the count took its
  // share of every round.
  EXPECT_NEAR(r.run.root.privacy_epsilon, gaussian_epsilon(0.05, rounds, 1e-5),
              1e-9 * r.run.root.privacy_epsilon);
}

TEST(PrivacyAdaptiveClip, AClipFarAboveTheNormsShrinksEveryRound) {
  TempDir dir;
  const uint64_t rounds = 4;
  const Topology topo = make_tree(dir.path(), 0, 8, adaptive(1e6, rounds), true);
  const PrivateRun r = run_private(dir, topo);
  ASSERT_TRUE(r.run.errors.empty()) << r.run.error_text();
  const std::vector<double> clips = clips_of(r.root_audit);
  ASSERT_EQ(clips.size(), rounds + 1);
  // No site clipped: about exp(-0.5) a round.
  for (size_t i = 1; i < clips.size(); ++i) {
    EXPECT_LT(clips[i], clips[i - 1] * std::exp(-0.3)) << "round " << i;
    EXPECT_GT(clips[i], clips[i - 1] * std::exp(-0.7)) << "round " << i;
  }
}

TEST(PrivacyAdaptiveClip, TheTopologyRefusesWhatCannotWork) {
  TempDir dir;
  FederationSpec f = adaptive(1, 3);
  f.privacy.mode = "local";
  EXPECT_THROW(make_tree(dir.path(), 0, 4, f, true), ConfigError);
  f = adaptive(1, 3);
  f.codec = "fp16";  // a region would re-encode its clipped sum
  EXPECT_THROW(make_tree(dir.path(), 2, 2, f, true), ConfigError);
}

// The clips a region audited taking from its parent, by round.
std::vector<std::pair<uint64_t, double>> region_clips(const TempDir& dir, const std::string& id) {
  std::vector<std::pair<uint64_t, double>> out;
  for (const AuditEntry& e :
       events(read_audit(dir.path() / (id + ".audit.jsonl")), "privacy_clip")) {
    EXPECT_EQ(e.fields.value("from", ""), "root");
    out.emplace_back(e.fields.value("round", uint64_t{0}), e.fields.value("clip", 0.0));
  }
  return out;
}

// Over regions: each region counts its own unclipped sites up with its
// last chunk, the root moves the clip on the sum, and every region clips
// the next round with exactly the clip the root chose.
TEST(PrivacyAdaptiveClip, RegionsCountTheirSitesUpAndTakeTheClipDown) {
  for (const double start : {1e6, 1e-6}) {
    SCOPED_TRACE("clip " + std::to_string(start));
    TempDir dir;
    const uint64_t rounds = 4;
    const Topology topo = make_tree(dir.path(), 2, 3, adaptive(start, rounds), true);
    const PrivateRun r = run_private(dir, topo);
    ASSERT_TRUE(r.run.errors.empty()) << r.run.error_text();
    const std::vector<double> clips = clips_of(r.root_audit);
    ASSERT_EQ(clips.size(), rounds + 1);
    // All six sites unclipped (far above), or none (far below): if the
    // regions' counts did not reach the root it would see none unclipped
    // either way, and the clip would grow both times.
    const std::vector<AuditEntry> steps = events(r.root_audit, "privacy_clip");
    for (size_t i = 1; i < clips.size(); ++i) {
      const double share = steps[i - 1].fields.value("noised_unclipped_share", -1.0);
      if (start > 1) {
        EXPECT_NEAR(share, 1.0, 0.35) << "round " << i - 1;
        EXPECT_LT(clips[i], clips[i - 1] * std::exp(-0.2)) << "round " << i;
      } else {
        EXPECT_NEAR(share, 0.0, 0.35) << "round " << i - 1;
        EXPECT_GT(clips[i], clips[i - 1] * std::exp(0.2)) << "round " << i;
      }
    }
    // Each region took rounds 1..3's clips, bit for bit, before opening
    // them (round 0's is the topology's; the last clip has no round).
    for (const std::string id : {"region-0", "region-1"}) {
      const auto taken = region_clips(dir, id);
      ASSERT_EQ(taken.size(), rounds - 1) << id;
      for (size_t i = 0; i < taken.size(); ++i) {
        EXPECT_EQ(taken[i].first, i + 1) << id;
        EXPECT_EQ(taken[i].second, clips[i + 1]) << id << " round " << i + 1;
      }
    }
  }
}

}  // namespace
}  // namespace fedwan::testing
