// A federation of real `fedwan` processes over loopback TCP: the final global
// model (and every site's model) equals the in-process reference bit for bit,
// also with sites that pace their steps (--step-time-ms) and report
// (--report).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/federation_fixture.hpp"
#include "harness/process.hpp"
#include "harness/reference_federation.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

// `fedwan site|aggregator` for node `n` of `topo` (its file at `topo_path`),
// training the synthetic model, with the test PKI's credentials.
std::vector<std::string> node_args(const Topology& topo, const std::filesystem::path& topo_path,
                                   const NodeSpec& n, size_t params, uint64_t seed) {
  return {n.role == Role::kSite ? "site" : "aggregator",
          "--topology",
          topo_path.string(),
          "--node",
          n.id,
          "--trainer",
          "synthetic",
          "--synthetic-size",
          std::to_string(params),
          "--seed",
          std::to_string(seed),
          "--join-timeout",
          "60",
          "--credentials",
          security_for(topo, n.id).credentials_dir};
}

// A codec, overlap_steps (0: blocking rounds) and streams per link.
struct ProcessCase {
  std::string codec;
  uint64_t overlap = 0;
  uint64_t streams = 1;
};
void PrintTo(const ProcessCase& c, std::ostream* os) {
  *os << c.codec << ", overlap_steps " << c.overlap << ", streams " << c.streams;
}
class ProcessFederation : public ::testing::TestWithParam<ProcessCase> {};

TEST_P(ProcessFederation, MatchesInProcessReference) {
  TempDir dir;
  constexpr uint64_t kSeed = 5;
  constexpr size_t kParams = 20000;
  FederationSpec fed;
  fed.rounds = 4;
  fed.inner_steps = 3;
  fed.codec = GetParam().codec;
  fed.overlap_steps = GetParam().overlap;
  fed.streams = GetParam().streams;
  fed.chunk_bytes = 16384;
  fed.outer.name = "diloco";
  fed.round_timeout_s = 60;
  // root -> 2 regions -> 2 sites each, over TCP.
  Topology tree = make_tree(dir.path(), 2, 2, fed);
  std::vector<NodeSpec> nodes = tree.nodes();
  for (NodeSpec& n : nodes) {
    if (n.role != Role::kSite) {
      n.endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
      n.bind = n.endpoint;
    }
  }
  const Topology topo = Topology::build("process-test", fed, nodes);
  const auto topo_path = dir.path() / "topology.yaml";
  std::ofstream(topo_path) << topo.to_yaml();

  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (const NodeSpec& n : topo.nodes()) {
    const bool site = n.role == Role::kSite;
    std::vector<std::string> args = node_args(topo, topo_path, n, kParams, kSeed);
    args.insert(args.end(), {"--audit-log", (dir.path() / (n.id + ".audit")).string()});
    if (site || n.role == Role::kRoot) {
      args.insert(args.end(), {"--out", (dir.path() / (n.id + ".bin")).string()});
    }
    logs.push_back((dir.path() / (n.id + ".log")).string());
    pids.push_back(spawn_process(FEDWAN_CLI_PATH, args, logs.back()));
  }
  const std::vector<int> codes = wait_processes(pids, std::chrono::seconds(120));
  for (size_t i = 0; i < codes.size(); ++i) {
    ASSERT_EQ(codes[i], 0) << topo.nodes()[i].id << " log:\n" << read_text(logs[i]);
  }

  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const LocalSteps steps = [&](uint32_t site, uint64_t n, std::vector<float>& p) {
    synthetic::local_steps(p.data(), p.size(), site, n, kSeed);
  };
  const ReferenceResult ref = fed.overlap_steps == 0
                                  ? run_reference(topo, init,
                                                  [&](uint32_t site, uint64_t, auto& p) {
                                                    steps(site, fed.inner_steps, p);
                                                  })
                                  : run_reference_overlap(topo, init, steps);
  const std::vector<float> global = read_model(dir.path() / "root.bin");
  ASSERT_EQ(global.size(), kParams);
  EXPECT_EQ(0, std::memcmp(global.data(), ref.global.data(), kParams * sizeof(float)));
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role != Role::kSite) continue;
    const std::vector<float> site = read_model(dir.path() / (n.id + ".bin"));
    ASSERT_EQ(site.size(), kParams) << n.id;
    EXPECT_EQ(0, std::memcmp(site.data(), ref.held.data(), kParams * sizeof(float))) << n.id;
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, ProcessFederation,
                         ::testing::Values(ProcessCase{"fp32"}, ProcessCase{"fp16"},
                                           ProcessCase{"fp16", 2}, ProcessCase{"fp16", 0, 3}),
                         [](const auto& info) {
                           const ProcessCase& c = info.param;
                           std::string name = c.codec;
                           if (c.overlap != 0) name += "_overlap" + std::to_string(c.overlap);
                           if (c.streams != 1) name += "_streams" + std::to_string(c.streams);
                           return name;
                         });

// --step-time-ms stands in for a GPU's step: each inner step takes that much
// wall time, the model moves one synthetic step per stretch of steps between
// syncs, and --report accounts for every round. tau = overlap_steps.
void paced_steps_report_every_round(uint64_t tau) {
  TempDir dir;
  constexpr uint64_t kSeed = 7;
  constexpr size_t kParams = 5000;
  constexpr double kStepMs = 25;
  FederationSpec fed;
  fed.rounds = 3;
  fed.inner_steps = 4;
  fed.codec = "fp32";
  fed.chunk_bytes = 8192;
  fed.outer.name = "diloco";
  fed.round_timeout_s = 60;
  fed.overlap_steps = tau;
  std::vector<NodeSpec> nodes = make_tree(dir.path(), 0, 2, fed).nodes();
  nodes[0].endpoint = nodes[0].bind = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
  const Topology topo = Topology::build("paced-test", fed, nodes);
  const auto topo_path = dir.path() / "topology.yaml";
  std::ofstream(topo_path) << topo.to_yaml();
  auto path = [&](const std::string& id, const std::string& ext) {
    return (dir.path() / (id + ext)).string();
  };

  std::vector<pid_t> pids;
  for (const NodeSpec& n : topo.nodes()) {
    const bool site = n.role == Role::kSite;
    std::vector<std::string> args = node_args(topo, topo_path, n, kParams, kSeed);
    args.insert(args.end(), {"--out", path(n.id, ".bin")});
    if (site) {
      args.insert(args.end(),
                  {"--step-time-ms", std::to_string(kStepMs), "--report", path(n.id, ".json")});
    }
    pids.push_back(spawn_process(FEDWAN_CLI_PATH, args, path(n.id, ".log")));
  }
  const std::vector<int> codes = wait_processes(pids, std::chrono::seconds(120));
  for (size_t i = 0; i < codes.size(); ++i) {
    const std::string id = topo.nodes()[i].id;
    ASSERT_EQ(codes[i], 0) << id << " log:\n" << read_text(path(id, ".log"));
  }

  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const LocalSteps one_step = [&](uint32_t site, uint64_t n, std::vector<float>& p) {
    if (n > 0) synthetic::local_steps(p.data(), p.size(), site, 1, kSeed);
  };
  const ReferenceResult ref =
      tau == 0 ? run_reference(topo, init,
                               [&](uint32_t site, uint64_t, auto& p) { one_step(site, 1, p); })
               : run_reference_overlap(topo, init, one_step);
  const std::vector<float> global = read_model(path("root", ".bin"));
  ASSERT_EQ(global.size(), kParams);
  EXPECT_EQ(0, std::memcmp(global.data(), ref.global.data(), kParams * sizeof(float)));
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role != Role::kSite) continue;
    const std::vector<float> model = read_model(path(n.id, ".bin"));
    ASSERT_EQ(model.size(), kParams) << n.id;
    EXPECT_EQ(0, std::memcmp(model.data(), ref.held.data(), kParams * sizeof(float))) << n.id;
    EXPECT_EQ(0, std::memcmp(model.data(), global.data(), kParams * sizeof(float))) << n.id;

    const nlohmann::json report = nlohmann::json::parse(read_text(path(n.id, ".json")));
    SCOPED_TRACE(n.id + " report: " + report.dump());
    EXPECT_EQ(report["node"], n.id);
    EXPECT_EQ(report["step_time_ms"].get<double>(), kStepMs);
    EXPECT_FALSE(report["stopped"].get<bool>());
    const nlohmann::json& rounds = report["rounds"];
    ASSERT_EQ(rounds.size(), fed.rounds);
    double train = 0, sync = 0;
    uint64_t sent = 0, received = 0;
    for (size_t r = 0; r < rounds.size(); ++r) {
      EXPECT_EQ(rounds[r]["round"].get<uint64_t>(), r);
      // A step never takes less than its sleep; far more would mean the
      // model's work was not cut to one step per round.
      EXPECT_GE(rounds[r]["train_s"].get<double>(), fed.inner_steps * kStepMs / 1000 * 0.95);
      EXPECT_LT(rounds[r]["train_s"].get<double>(), 5.0);
      EXPECT_GT(rounds[r]["bytes_sent"].get<uint64_t>(), 0u);
      train += rounds[r]["train_s"].get<double>();
      sync += rounds[r]["sync_s"].get<double>();
      sent += rounds[r]["bytes_sent"].get<uint64_t>();
      // Overlapped, sync_s is what the site waited at begin and merge; the
      // span from the update to the merge is overlap_s.
      EXPECT_EQ(rounds[r].contains("overlap_s"), tau > 0);
      if (tau > 0) {
        EXPECT_GE(rounds[r]["overlap_s"].get<double>(), rounds[r]["sync_s"].get<double>());
      }
      received += rounds[r]["bytes_received"].get<uint64_t>();
    }
    EXPECT_DOUBLE_EQ(report["train_s_total"].get<double>(), train);
    EXPECT_DOUBLE_EQ(report["sync_s_total"].get<double>(), sync);
    EXPECT_EQ(report["bytes_sent_total"].get<uint64_t>(), sent);
    EXPECT_EQ(report["bytes_received_total"].get<uint64_t>(), received);
    const double utilisation = report["utilisation"].get<double>();
    EXPECT_GT(utilisation, 0.0);
    EXPECT_LE(utilisation, 1.0);
    EXPECT_GE(report["wall_s"].get<double>(), train + sync - 1e-9);
  }

  // A fashion-cnn step is timed by its own work: pacing it is refused
  // before the site loads anything.
  const std::string log = path("refused", ".log");
  const pid_t refused =
      spawn_process(FEDWAN_CLI_PATH,
                    {"site", "--topology", topo_path.string(), "--node", "site-0", "--trainer",
                     "fashion-cnn", "--step-time-ms", "5", "--insecure-plaintext"},
                    log);
  EXPECT_EQ(wait_processes({refused}, std::chrono::seconds(60))[0], 2) << read_text(log);
  EXPECT_NE(read_text(log).find("--step-time-ms"), std::string::npos) << read_text(log);
}

TEST(ProcessFederationSite, PacedStepsReportEveryRound) { paced_steps_report_every_round(0); }

TEST(ProcessFederationSite, OverlappedPacedStepsReportEveryRound) {
  paced_steps_report_every_round(3);
}

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
