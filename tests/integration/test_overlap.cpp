// Overlapped rounds (federation.overlap_steps): sites keep training while
// their update goes up and merge the next anchor tau steps late. A whole
// federation must equal the in-process reference of that schedule bit for
// bit, and the calls must refuse misuse clearly.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <thread>

#include "fedwan/error.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/model_compare.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
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

// Sites whose anchor lives in a mapped file and whose update frames wait on
// disk (SiteOptions::page_out_from_bytes, as a large model's do) end exactly
// where the reference ends, blocking (tau 0) and overlapped (the anchor is
// updated in place), and leave no named file in their checkpoint directory.
class PagedOutMatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(PagedOutMatchesReference, OneRegionTwoSites) {
  TempDir dir;
  const Case& c = GetParam();
  const Topology topo = make_tree(dir.path(), 1, 2, overlap_spec(c.codec, c.outer, c.tau));
  const std::vector<float> init = synthetic::initial_model(6000, kSeed);  // 6 chunks
  SiteSetup setup;
  setup.options = [&dir](SiteOptions& o, size_t site, std::vector<float>&) {
    o.page_out_from_bytes = 0;
    o.checkpoint_dir = (dir / ("site-ckpt-" + std::to_string(site))).string();
  };
  FederationRun run = run_threads(topo, init, kSeed, 8, setup);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref =
      c.tau > 0 ? run_reference_overlap(topo, init, synthetic_steps())
                : run_reference(topo, init, [](uint32_t site, uint64_t, std::vector<float>& p) {
                    synthetic::local_steps(p.data(), p.size(), site, 3, kSeed);
                  });
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
  for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, ref.held));
  for (size_t s = 0; s < 2; ++s) {
    const std::filesystem::path d = dir / ("site-ckpt-" + std::to_string(s));
    ASSERT_TRUE(std::filesystem::is_directory(d));
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      EXPECT_EQ(e.path().filename().string().find(".fedwan-unnamed"), std::string::npos)
          << e.path();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, PagedOutMatchesReference,
                         ::testing::Values(Case{"fp16", "diloco", 0}, Case{"int8", "fedavg", 0},
                                           Case{"fp16", "diloco", 1}),
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

// The handle begin_sync() returns: it waits for the sync with a timeout and
// merges it like finish_sync(), and is spent once the sync is merged, by it
// or by finish_sync().
TEST(Overlap, APendingSyncHandleWaitsAndIsSpentOnceMerged) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 1, overlap_spec("fp16", "fedavg", 1));
  const std::vector<float> init = synthetic::initial_model(3000, kSeed);
  AggregatorSummary summary;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &summary);
  {
    PendingSync none;
    EXPECT_FALSE(none.valid());
    EXPECT_FALSE(none.ready());
    EXPECT_THROW((void)none.wait(std::chrono::milliseconds(1)), Error);
    std::vector<float> params = init;
    SiteCore site(site_options(topo, "site-0", std::chrono::seconds(30)), params.data(),
                  params.size());
    site.join();
    synthetic::local_steps(params.data(), params.size(), 1, 3, kSeed);
    PendingSync p = site.begin_sync();
    EXPECT_TRUE(p.valid());
    std::optional<SyncResult> r;
    while (!(r = p.wait(std::chrono::milliseconds(2)))) EXPECT_TRUE(p.valid());
    EXPECT_EQ(r->round, 1u);
    EXPECT_FALSE(site.sync_pending());
    EXPECT_FALSE(p.valid());
    try {
      (void)p.wait(std::chrono::milliseconds(1));
      ADD_FAILURE() << "a spent handle waited";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("refers to no sync"), std::string::npos) << e.what();
    }
    // Merged by finish_sync() instead: the handle is spent too, and a
    // handle of the round before does not stand for the next sync.
    PendingSync q = site.begin_sync();
    PendingSync moved = std::move(q);
    EXPECT_FALSE(q.valid());  // NOLINT(bugprone-use-after-move): moved-from refers to nothing
    EXPECT_TRUE(moved.valid());
    EXPECT_EQ(site.finish_sync().round, 2u);
    EXPECT_FALSE(moved.valid());
    try {
      (void)moved.wait(std::chrono::milliseconds(1));
      ADD_FAILURE() << "a handle merged by finish_sync() waited";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("merged already"), std::string::npos) << e.what();
    }
    PendingSync third = site.begin_sync();
    EXPECT_FALSE(moved.valid()) << "an old handle stood for the next sync";
    EXPECT_TRUE(third.wait(std::chrono::seconds(30)).has_value());
    PendingSync last = site.begin_sync();
    r = last.wait(std::chrono::seconds(30));
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(r->finished);
    EXPECT_EQ(r->round, 4u);
  }
  nodes.join();
  EXPECT_TRUE(nodes.error_list().empty()) << ::testing::PrintToString(nodes.error_list());
}

// A caller that abandons a pending sync (an exception in its training, say)
// destroys the SiteCore: the worker stops promptly instead of holding the
// process until the round timeout; a sync that failed leaves the core
// refusing to go on, with a message that says how to recover.
TEST(Overlap, AnAbandonedOrFailedSyncEndsPromptlyAndIsNotReused) {
  TempDir dir;
  FederationSpec f = overlap_spec("fp16", "fedavg", 1);
  f.round_timeout_s = 60;
  const Topology topo = make_tree(dir.path(), 0, 2, f);
  const std::vector<float> init = synthetic::initial_model(3000, kSeed);
  AggregatorSummary summary;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &summary);
  std::optional<std::chrono::steady_clock::duration> destroyed_in;
  // The sites on the test's thread; the root on its own. site-1 joins and
  // never syncs, so the round stays open: site-0's sync is still pending
  // when it is stopped or abandoned, however fast the root is.
  {
    std::vector<float> params = init;
    std::vector<float> held = init;
    SiteCore other(site_options(topo, "site-1", std::chrono::seconds(30)), held.data(),
                   held.size());
    {
      SiteCore site(site_options(topo, "site-0", std::chrono::seconds(30)), params.data(),
                    params.size());
      // The root welcomes its children once all have joined.
      auto other_joined = std::async(std::launch::async, [&other] { other.join(); });
      site.join();
      other_joined.get();
      synthetic::local_steps(params.data(), params.size(), 1, 3, kSeed);
      site.begin_sync();
      EXPECT_TRUE(site.sync_pending());
      EXPECT_FALSE(site.finished());
      EXPECT_EQ(site.round(), 0u);  // the round that ended, until the merge
      try {
        site.sync();
        ADD_FAILURE() << "sync() with a sync pending accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("a sync is pending; call finish_sync() first"),
                  std::string::npos)
            << e.what();
      }
      try {
        site.begin_sync();
        ADD_FAILURE() << "a second begin_sync() accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("already pending"), std::string::npos) << e.what();
      }
      // A stop with no grace fails the pending sync at its next check.
      site.stop();
      EXPECT_THROW(site.finish_sync(), StoppedError);
      try {
        site.begin_sync();
        ADD_FAILURE() << "begin_sync() after a failed sync accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("build a new SiteCore"), std::string::npos)
            << e.what();
      }
    }
    // Abandoned while pending: the destructor stops and joins the worker.
    auto site = std::make_unique<SiteCore>(site_options(topo, "site-0", std::chrono::seconds(30)),
                                           params.data(), params.size());
    site->join();
    site->begin_sync();
    const auto t0 = std::chrono::steady_clock::now();
    site.reset();
    destroyed_in = std::chrono::steady_clock::now() - t0;
  }
  nodes.stop();
  nodes.join();
  ASSERT_TRUE(destroyed_in.has_value()) << ::testing::PrintToString(nodes.error_list());
  // Well within the 30 s round timeout (the worker checks every 50 ms).
  EXPECT_LT(*destroyed_in, std::chrono::seconds(5));
}

// The sync is done long before the caller merges it (a long step after a
// quick round): the link is kept meanwhile, heartbeats both ways, so the
// parent never loses the site and the site never its parent.
TEST(Overlap, ASyncDoneLongBeforeItsMergeKeepsTheLinkAlive) {
  TempDir dir;
  FederationSpec f = overlap_spec("fp16", "fedavg", 1);
  f.rounds = 2;
  f.heartbeat_s = 0.1;
  f.heartbeat_timeout_s = 2;
  const Topology topo = make_tree(dir.path(), 0, 1, f);
  const std::vector<float> init = synthetic::initial_model(3000, kSeed);
  AggregatorSummary summary;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &summary);
  {
    std::vector<float> params = init;
    SiteCore site(site_options(topo, "site-0", std::chrono::seconds(30)), params.data(),
                  params.size());
    site.join();
    for (uint64_t r = 0; r < f.rounds; ++r) {
      synthetic::local_steps(params.data(), params.size(), 1, 3, kSeed);
      site.begin_sync();
      while (!site.sync_ready()) {
        (void)site.service();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      // Over two heartbeat timeouts of training before the merge,
      // servicing the link as a caller does between steps.
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(4500);
      while (std::chrono::steady_clock::now() < until) {
        (void)site.service();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const SyncResult res = site.finish_sync();
      EXPECT_FALSE(res.resynced) << "round " << r;
    }
    EXPECT_TRUE(site.finished());
  }
  nodes.join();
  EXPECT_TRUE(nodes.error_list().empty()) << ::testing::PrintToString(nodes.error_list());
  EXPECT_EQ(summary.children_lost, 0u) << "the root lost a site whose sync was done";
  EXPECT_EQ(summary.rejoins, 0u) << "the site rejoined";
}

}  // namespace
}  // namespace fedwan::testing
