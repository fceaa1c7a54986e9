// Stopping a node while it waits on the network: SiteCore::stop() and
// Aggregator::stop() end a join, a sync or a replica fetch within seconds
// (not at the round or join timeout), nothing is checkpointed that a
// restart would count twice, and the CLI's nodes and the demo honour
// SIGTERM and never outlive the process that started them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "fedwan/aggregator.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/process.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kSeed = 41;
constexpr size_t kParams = 3000;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Every file under `dir` with its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    files[e.path().string()] =
        std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  return files;
}

FederationSpec quick_federation() {
  FederationSpec fed;
  fed.rounds = 10;
  fed.inner_steps = 1;
  fed.codec = "fp16";  // lossy: the site keeps a residual a checkpoint holds
  fed.chunk_bytes = 4096;
  fed.heartbeat_s = 0.1;
  fed.heartbeat_timeout_s = 1;
  return fed;
}

// The call `fn` throws StoppedError within `limit` of stop() being called
// `after` it started.
template <class Fn, class Stop>
void expect_stopped_in_time(Fn fn, Stop stop, double limit_s,
                            std::chrono::milliseconds after = std::chrono::milliseconds(400)) {
  NodeSpawner node;
  node.spawn("node", fn, stop);
  std::this_thread::sleep_for(after);
  const auto asked = Clock::now();
  node.stop();
  node.join();
  const double took = seconds_since(asked);
  std::string error = "no exception";
  bool stopped = false;
  try {
    node.rethrow_first_error();
  } catch (const StoppedError& e) {
    stopped = true;
    error = e.what();
  } catch (const std::exception& e) {
    error = std::string("not a StoppedError: ") + e.what();
  }
  EXPECT_TRUE(stopped) << error;
  EXPECT_LT(took, limit_s) << error;
}

TEST(Stop, ASiteWithNoParentStopsWhileJoining) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 1, quick_federation());
  std::vector<float> params = synthetic::initial_model(kParams, kSeed);
  SiteCore site(site_options(topo, "site-0", std::chrono::seconds(120)), params.data(),
                params.size());
  expect_stopped_in_time([&] { site.join(); }, [&] { site.stop(); }, 3.0);
  // For good: a later call throws at once.
  EXPECT_THROW(site.join(), StoppedError);
}

// The parent goes away after round 0; the site's next sync waits for an
// anchor that will not come. stop() ends it, and the checkpoint of the round
// boundary stays what a restart resumes from: the half-sent round (params
// and residual already moved on) is not written over it.
TEST(Stop, ASiteWaitingForAGoneParentStopsAndKeepsTheRoundBoundaryCheckpoint) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 1, quick_federation());
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  AggregatorOptions ro;
  ro.topology = topo;
  ro.node_id = "root";
  ro.initial_model = init;
  ro.join_timeout = std::chrono::seconds(60);
  ro.security = security_for(topo, "root");
  Aggregator root(std::move(ro));
  NodeSpawner nodes;
  nodes.spawn_node("root", root);

  const fs::path ckpt = dir.path() / "site-0-ckpt";
  SiteOptions so = site_options(topo, "site-0", std::chrono::seconds(120));
  so.checkpoint_dir = ckpt.string();
  std::vector<float> params = init;
  SiteCore site(std::move(so), params.data(), params.size());
  site.join();
  synthetic::local_steps(params.data(), params.size(), 0, 1, kSeed);
  ASSERT_EQ(site.sync().round, 1u);

  nodes.stop();
  nodes.join();
  EXPECT_NE(nodes.errors().find("stopped"), std::string::npos) << nodes.errors();
  const auto boundary = snapshot(ckpt);
  ASSERT_FALSE(boundary.empty());

  synthetic::local_steps(params.data(), params.size(), 0, 1, kSeed);
  // Well past a heartbeat timeout: the site is reconnecting, not sending.
  expect_stopped_in_time([&] { site.sync(); }, [&] { site.stop(); }, 3.0,
                         std::chrono::milliseconds(1500));
  site.checkpoint();  // what a SIGTERM handler does next
  EXPECT_EQ(snapshot(ckpt), boundary);
  EXPECT_EQ(site.round(), 1u);
  EXPECT_THROW(site.sync(), StoppedError);
}

// stop(grace) while a sync waits on a healthy federation: the round still
// ends (the site's work of the round is kept) when it ends within the
// grace; only the next call is refused.
TEST(Stop, ASyncWithinItsGraceFinishesItsRound) {
  TempDir dir;
  FederationSpec fed = quick_federation();
  fed.rounds = 1;  // the round that ends is the federation's last
  const Topology topo = make_tree(dir.path(), 0, 2, fed);
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init);
  // site-1 ends round 0 only 1.5 s after site-0 began waiting for it.
  nodes.spawn("site-1", [&](NodeStopper& stopper) {
    std::vector<float> params = init;
    SiteCore site(site_options(topo, "site-1", std::chrono::seconds(60)), params.data(),
                  params.size());
    const auto bound = stopper.bind([&site] { site.stop(); });
    site.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    for (SyncResult r; !r.finished;) r = site.sync();
  });
  std::vector<float> params = init;
  SiteCore site(site_options(topo, "site-0", std::chrono::seconds(60)), params.data(),
                params.size());
  site.join();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    site.stop(std::chrono::seconds(20));
  });
  const SyncResult r = site.sync();  // not a StoppedError: the round ended in time
  stopper.join();
  EXPECT_EQ(r.round, 1u);
  EXPECT_TRUE(r.finished);
  nodes.join();
  EXPECT_EQ(nodes.errors(), "");
}

// A region restarted with an empty checkpoint directory asks its parent for
// its replica; with the parent down that waits up to the join timeout. It
// now happens in run(), where stop() reaches it (it used to happen in the
// constructor, before anyone could call stop()).
TEST(Stop, ARegionFetchingItsReplicaFromAGoneParentStops) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 1, 1, quick_federation());
  AggregatorOptions o;
  o.topology = topo;
  o.node_id = "region-0";
  o.join_timeout = std::chrono::seconds(120);
  o.security = security_for(topo, "region-0");
  o.checkpoint_dir = (dir.path() / "region-ckpt").string();
  fs::create_directories(o.checkpoint_dir);
  const auto built = Clock::now();
  Aggregator region(std::move(o));
  EXPECT_LT(seconds_since(built), 5.0) << "the constructor waited on the parent";
  expect_stopped_in_time([&] { region.run(); }, [&] { region.stop(); }, 3.0);
}

#ifdef FEDWAN_CLI_PATH

// A topology file for CLI nodes on loopback TCP (root + `sites` sites).
fs::path cli_topology(const fs::path& dir, int sites) {
  FederationSpec fed = quick_federation();
  fed.rounds = 100000;
  std::vector<NodeSpec> nodes = make_tree(dir, 0, sites, fed).nodes();
  for (NodeSpec& n : nodes) {
    if (n.role == Role::kSite) continue;
    n.endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
    n.bind = n.endpoint;
  }
  const fs::path t = dir / "t.yaml";
  std::ofstream(t) << Topology::build("stop-test", fed, nodes).to_yaml();
  return t;
}

bool wait_for_text(const fs::path& log, const std::string& text, std::chrono::seconds limit) {
  const auto give_up = Clock::now() + limit;
  while (Clock::now() < give_up) {
    if (read_text(log).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// SIGTERM to a `fedwan site` blocked on its parent: the root was killed
// (SIGKILL) mid-federation. The site exits 0 once its sync's grace (5 s) is
// over, not at its round timeout (600 s).
TEST(Stop, SigtermStopsACliSiteWhoseParentWasKilled) {
  TempDir dir;
  const fs::path t = cli_topology(dir.path(), 1);
  const Topology topo = Topology::load(t.string());
  const fs::path root_log = dir.path() / "root.log", site_log = dir.path() / "site.log";
  const pid_t root = spawn_process(FEDWAN_CLI_PATH,
                                   {"aggregator", "--topology", t.string(), "--node", "root",
                                    "--trainer", "synthetic", "--synthetic-size", "3000",
                                    "--credentials", security_for(topo, "root").credentials_dir},
                                   root_log.string());
  const pid_t site =
      spawn_process(FEDWAN_CLI_PATH,
                    {"site", "--topology", t.string(), "--node", "site-0", "--trainer", "synthetic",
                     "--synthetic-size", "3000", "--checkpoint-dir", (dir.path() / "ckpt").string(),
                     "--credentials", security_for(topo, "site-0").credentials_dir},
                    site_log.string());
  ASSERT_TRUE(wait_for_text(root_log, "round   3/", std::chrono::seconds(60)))
      << read_text(root_log) << read_text(site_log);
  ::kill(root, SIGKILL);
  wait_processes({root}, std::chrono::seconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto asked = Clock::now();
  ::kill(site, SIGTERM);
  const std::vector<int> codes = wait_processes({site}, std::chrono::seconds(30));
  EXPECT_EQ(codes[0], 0) << read_text(site_log);
  // Its sync may try to finish the round for 5 s (the CLI's grace).
  EXPECT_LT(seconds_since(asked), 8.0) << read_text(site_log);
  EXPECT_NE(read_text(site_log).find("stopped by signal at round"), std::string::npos)
      << read_text(site_log);
}

// SIGTERM to a `fedwan site` that never reached its parent (blocked in join).
// Whether process `pid` installs a handler for `sig` within `limit` (the
// SigCgt mask in /proc/PID/status).
bool catches_signal_soon(pid_t pid, int sig, std::chrono::seconds limit) {
  const auto give_up = Clock::now() + limit;
  const uint64_t bit = uint64_t{1} << (sig - 1);
  while (Clock::now() < give_up) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("SigCgt:", 0) == 0 && (std::stoull(line.substr(7), nullptr, 16) & bit) != 0) {
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(Stop, SigtermStopsACliSiteThatIsStillJoining) {
  TempDir dir;
  const fs::path t = cli_topology(dir.path(), 1);
  const Topology topo = Topology::load(t.string());
  const fs::path log = dir.path() / "site.log";
  const pid_t site =
      spawn_process(FEDWAN_CLI_PATH,
                    {"site", "--topology", t.string(), "--node", "site-0", "--trainer", "synthetic",
                     "--synthetic-size", "3000", "--join-timeout", "600", "--credentials",
                     security_for(topo, "site-0").credentials_dir},
                    log.string());
  // Signalled only once its handler is in place (a loaded machine can take
  // seconds to get the process that far), and while it still waits to join.
  ASSERT_TRUE(catches_signal_soon(site, SIGTERM, std::chrono::seconds(60))) << read_text(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto asked = Clock::now();
  ::kill(site, SIGTERM);
  const std::vector<int> codes = wait_processes({site}, std::chrono::seconds(30));
  EXPECT_EQ(codes[0], 0) << read_text(log);
  EXPECT_LT(seconds_since(asked), 5.0) << read_text(log);
}

// The pids of live processes whose command line mentions `text`.
std::vector<pid_t> processes_mentioning(const std::string& text) {
  std::vector<pid_t> pids;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    const std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmd.find(text) == std::string::npos) continue;
    std::ifstream st(e.path() / "stat");
    std::string pid, comm, state;
    st >> pid >> comm >> state;
    if (state != "Z") pids.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return pids;
}

bool no_process_mentions(const std::string& text, std::chrono::seconds limit) {
  const auto give_up = Clock::now() + limit;
  while (Clock::now() < give_up) {
    if (processes_mentioning(text).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

class DemoStop : public ::testing::TestWithParam<int> {};

// The demo is ended by SIGTERM (it stops every node and exits 0) or by
// SIGKILL (every node is told to stop by the kernel): either way no node
// is left running.
TEST_P(DemoStop, NoNodeOutlivesTheDemo) {
  const int sig = GetParam();
  TempDir dir;
  const fs::path work = dir.path() / "demo";
  const fs::path log = dir.path() / "demo.log";
  const pid_t demo = spawn_process(FEDWAN_CLI_PATH,
                                   {"demo", "--trainer", "synthetic", "--synthetic-size", "3000",
                                    "--sites", "2", "--regions", "1", "--rounds", "100000",
                                    "--inner-steps", "1", "--no-baseline", "--dir", work.string()},
                                   log.string());
  // The nodes' command lines name the topology file; the demo's does not.
  const std::string nodes = (work / "topology.yaml").string();
  ASSERT_TRUE(wait_for_text(log, "round   3/", std::chrono::seconds(60))) << read_text(log);
  ASSERT_EQ(processes_mentioning(nodes).size(), 4u);  // root, region, 2 sites
  const auto asked = Clock::now();
  ::kill(demo, sig);
  const std::vector<int> codes = wait_processes({demo}, std::chrono::seconds(30));
  if (sig == SIGTERM) {
    EXPECT_EQ(codes[0], 0) << read_text(log);
    EXPECT_NE(read_text(log).find("stopped by signal"), std::string::npos) << read_text(log);
  }
  EXPECT_TRUE(no_process_mentions(nodes, std::chrono::seconds(15)))
      << processes_mentioning(nodes).size() << " nodes still running\n"
      << read_text(log);
  EXPECT_LT(seconds_since(asked), 20.0);
  // Whatever is left is killed, so a failure never leaks processes.
  for (pid_t p : processes_mentioning(nodes)) ::kill(p, SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(Signals, DemoStop, ::testing::Values(SIGTERM, SIGKILL),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param == SIGTERM ? std::string("Sigterm")
                                                     : std::string("Sigkill");
                         });

#endif  // FEDWAN_CLI_PATH

}  // namespace
}  // namespace fedwan::testing
