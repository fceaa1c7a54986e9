// A federation of real `fedwan` processes over loopback TCP: the final global
// model (and every site's model) equals the in-process reference bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "harness/federation_fixture.hpp"
#include "harness/process.hpp"
#include "harness/reference_federation.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

class ProcessFederation : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessFederation, MatchesInProcessReference) {
  TempDir dir;
  constexpr uint64_t kSeed = 5;
  constexpr size_t kParams = 20000;
  FederationSpec fed;
  fed.rounds = 4;
  fed.inner_steps = 3;
  fed.codec = GetParam();
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
    std::vector<std::string> args = {site ? "site" : "aggregator",
                                     "--topology",
                                     topo_path.string(),
                                     "--node",
                                     n.id,
                                     "--trainer",
                                     "synthetic",
                                     "--synthetic-size",
                                     std::to_string(kParams),
                                     "--seed",
                                     std::to_string(kSeed),
                                     "--join-timeout",
                                     "60",
                                     "--credentials",
                                     security_for(topo, n.id).credentials_dir,
                                     "--audit-log",
                                     (dir.path() / (n.id + ".audit")).string()};
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
  const ReferenceResult ref = run_reference(topo, init, [&](uint32_t site, uint64_t, auto& p) {
    synthetic::local_steps(p.data(), p.size(), site, fed.inner_steps, kSeed);
  });
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

INSTANTIATE_TEST_SUITE_P(Codecs, ProcessFederation, ::testing::Values("fp32", "fp16"));

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
