// The CRL over time: one that expires, one refreshed, one replaced by a
// half-written file while nodes run. Nodes keep serving and raise alarms;
// only a CRL past its grace period stops new handshakes, and the error then
// says how to refresh it.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include "fedwan/error.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_threads.hpp"
#include "harness/process.hpp"
#include "harness/raw_site.hpp"
#include "harness/reference_federation.hpp"
#include "security/certs.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 31;
constexpr size_t kParams = 3000;  // 3 chunks of 1024, 1024, 952
constexpr int64_t kDay = 86400;

uint32_t chunk_n(uint32_t c) { return c < 2 ? 1024 : 952; }

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += s + "\n";
  return out;
}

// Signs the federation's CRL as if it had been issued `days_ago` days ago,
// valid for 30 days, and puts it in every bundle.
void age_crl(const Topology& topo, int64_t days_ago) {
  security::refresh_crl(credentials_dir_for(topo), std::chrono::hours(24 * 30),
                        std::time(nullptr) - days_ago * kDay);
}

// The finding: 30 days after the last `certs init` or `revoke` no node
// started and no link re-handshook. Within the grace period the federation
// runs, and says what to do.
TEST(Crl, AnExpiredCrlWithinItsGraceKeepsTheFederationRunning) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 1, 2, small_fp32_federation(2));
  age_crl(topo, 31);  // expired a day ago
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const FederationRun run = run_threads(topo, init, kSeed);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  EXPECT_TRUE(has_alarm(run.root.alarms, "crl_expired")) << joined(run.root.alarms);
  ASSERT_EQ(run.regions.size(), 1u);
  EXPECT_TRUE(has_alarm(run.regions[0].alarms, "crl_expired")) << joined(run.regions[0].alarms);
  EXPECT_NE(joined(run.root.alarms).find("certs crl refresh"), std::string::npos);
}

TEST(Crl, ACrlAboutToExpireRaisesAnAlarmFirst) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 1, small_fp32_federation(1));
  age_crl(topo, 27);  // three days left
  std::vector<float> params(10, 0.0f);
  SiteCore site(site_options(topo, "site-0", std::chrono::seconds(5)), params.data(),
                params.size());
  EXPECT_TRUE(has_alarm(site.alarms(), "crl_expiring")) << joined(site.alarms());
  EXPECT_FALSE(has_alarm(site.alarms(), "crl_expired"));
}

// Past the grace a node refuses to start, and its error names the command
// that fixes it (it used to advise `certs issue`, which does not).
TEST(Crl, PastItsGraceTheErrorSaysHowToRefreshIt) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 1, small_fp32_federation(1));
  age_crl(topo, 40);  // expired ten days ago
  std::vector<float> params(10, 0.0f);
  try {
    SiteCore site(site_options(topo, "site-0", std::chrono::seconds(5)), params.data(),
                  params.size());
    ADD_FAILURE() << "a node started with a CRL ten days past its nextUpdate";
  } catch (const CryptoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fedwan certs crl refresh"), std::string::npos) << what;
    EXPECT_EQ(what.find("certs issue"), std::string::npos) << what;
  }
#ifdef FEDWAN_CLI_PATH
  // The command it names fixes it.
  const fs::path log = dir.path() / "refresh.log";
  const pid_t pid = spawn_process(
      FEDWAN_CLI_PATH,
      {"certs", "crl", "refresh", "--out", credentials_dir_for(topo), "--crl-days", "90"},
      log.string());
  ASSERT_EQ(wait_processes({pid}, std::chrono::seconds(30))[0], 0) << read_text(log);
  EXPECT_NE(read_text(log).find("valid until"), std::string::npos) << read_text(log);
  SiteCore site(site_options(topo, "site-0", std::chrono::seconds(5)), params.data(),
                params.size());
  EXPECT_TRUE(site.alarms().empty()) << joined(site.alarms());
#endif
}

// Acceptance: a CRL replaced by a half-written file, then by one that has
// expired, while the region serves. It keeps the last good CRL, then applies
// the expired one for its grace; new sessions come up throughout and the
// federation ends with the right model.
TEST(Crl, AnUnusableOrExpiredCrlMidRunLeavesTheRegionServing) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 1, 2, small_fp32_federation(3));
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const fs::path region_crl = fs::path(security_for(topo, "region-0").credentials_dir) / "crl.pem";
  AggregatorSummary root_summary, region_summary;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &root_summary);
  spawn_aggregator(nodes, topo, "region-0", init, &region_summary);
  spawn_synthetic_site(nodes, topo, "site-0", init, kSeed, 2);

  const std::string bundle = security_for(topo, "site-1").credentials_dir;
  std::vector<uint8_t> buf;
  // site-1 plays its rounds by hand; before rounds 1 and 2 it starts a new
  // session, after the region's crl.pem was damaged, then expired.
  const auto play_round = [&](RawSite& s, uint64_t round) {
    for (uint32_t c = 0; c < 3; ++c) s.send(s.delta(round, c, 3, chunk_n(c), chunk_n(c), kParams));
    for (int got = 0; got < 3;) {
      const wire::ParsedFrame f = s.recv(&buf);
      ASSERT_TRUE(f.ok()) << "round " << round << ": " << f.detail;
      if (f.header.type == wire::MsgType::kAnchor) ++got;
    }
  };
  auto rogue =
      std::make_unique<RawSite>(topo, "site-1", test_client_security(topo, "site-1", bundle));
  rogue->hello(init);
  wire::ParsedFrame f = rogue->recv(&buf);
  ASSERT_TRUE(f.ok()) << f.detail;
  ASSERT_EQ(f.header.type, wire::MsgType::kWelcome);
  play_round(*rogue, 0);

  {
    SCOPED_TRACE("crl.pem half-written (a copy in progress)");
    const std::string text = read_text(region_crl);
    std::ofstream(region_crl, std::ios::trunc) << text.substr(0, text.size() / 2);
    rogue.reset();
    rogue = std::make_unique<RawSite>(topo, "site-1", test_client_security(topo, "site-1", bundle));
    rogue->link().wait_established(std::chrono::seconds(10));
    play_round(*rogue, 1);
  }
  {
    SCOPED_TRACE("crl.pem replaced by one that expired yesterday");
    TempDir copy;
    fs::copy(credentials_dir_for(topo), copy.path() / "pki", fs::copy_options::recursive);
    security::refresh_crl((copy.path() / "pki").string(), std::chrono::hours(24 * 30),
                          std::time(nullptr) - 31 * kDay);
    fs::copy_file(copy.path() / "pki" / "ca" / "crl.pem", region_crl,
                  fs::copy_options::overwrite_existing);
    rogue = std::make_unique<RawSite>(topo, "site-1", test_client_security(topo, "site-1", bundle));
    rogue->link().wait_established(std::chrono::seconds(10));
    play_round(*rogue, 2);
  }
  do {
    f = rogue->recv(&buf);
    ASSERT_TRUE(f.ok()) << f.detail;
  } while (f.header.type != wire::MsgType::kDone);
  rogue->send(
      node::make_frame(node::node_header(topo, rogue->node().index, wire::MsgType::kDone, 3), {}));
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");

  const uint32_t rogue_index = rogue->node().index;
  const ReferenceResult ref = run_reference(topo, init, [&](uint32_t site, uint64_t, auto& p) {
    if (site != rogue_index) synthetic::local_steps(p.data(), p.size(), site, 2, kSeed);
  });
  EXPECT_EQ(root_summary.global_model, ref.global);
  EXPECT_TRUE(has_alarm(region_summary.alarms, "crl_unusable")) << joined(region_summary.alarms);
  EXPECT_TRUE(has_alarm(region_summary.alarms, "crl_expired")) << joined(region_summary.alarms);
  EXPECT_EQ(region_summary.handshake_ms.size(), 4u);  // site-0, and site-1 three times
}

}  // namespace
}  // namespace fedwan::testing
