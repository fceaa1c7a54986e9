// Topology files (fedwan/topology.hpp): parsing and validation of the node
// tree and federation settings, building, YAML round trips, the digest, and
// loading from a file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "topology_test_util.hpp"

namespace fedwan {
namespace {

TEST(Topology, ValidThreeLevelTree) {
  Topology t = Topology::parse(kExample);
  EXPECT_EQ(t.job(), "fashion-demo");
  Sha256Digest h = sha256("fashion-demo", 12);
  uint64_t want = 0;
  for (int i = 7; i >= 0; --i) want = (want << 8) | h[i];
  EXPECT_EQ(t.job_id(), want);

  const FederationSpec& f = t.federation();
  EXPECT_EQ(f.rounds, 20u);
  EXPECT_EQ(f.inner_steps, 50u);
  EXPECT_EQ(f.codec, "fp16");
  EXPECT_EQ(f.chunk_bytes, 1048576u);
  EXPECT_EQ(f.round_timeout_s, 600.0);
  EXPECT_EQ(f.outer.name, "diloco");
  EXPECT_EQ(f.outer.param("lr"), 0.7);
  EXPECT_EQ(f.outer.param("momentum"), 0.9);
  EXPECT_FALSE(f.outer.param("beta1").has_value());

  ASSERT_EQ(t.nodes().size(), 6u);
  EXPECT_EQ(t.root().id, "root");
  EXPECT_EQ(t.root().children, (std::vector<uint32_t>{1, 3}));
  const NodeSpec& eu = t.node("eu");
  EXPECT_EQ(eu.index, 1u);
  EXPECT_EQ(eu.role, Role::kRegion);
  EXPECT_EQ(eu.parent_index, 0u);
  EXPECT_EQ(eu.bind, "tcp://*:7001");
  EXPECT_EQ(eu.children, (std::vector<uint32_t>{2, 4}));
  EXPECT_EQ(t.node("us").bind, "tcp://127.0.0.1:7002");  // bind defaults to endpoint
  EXPECT_EQ(t.node("site-a").weight, 6000.0);
  EXPECT_EQ(t.node("site-c").weight, 1.0);
  EXPECT_EQ(t.node("site-c").parent_index, 3u);
  EXPECT_EQ(t.node(5).id, "site-c");

  EXPECT_EQ(t.sites_under(0), (std::vector<uint32_t>{2, 4, 5}));
  EXPECT_EQ(t.sites_under(1), (std::vector<uint32_t>{2, 4}));
  EXPECT_EQ(t.sites_under(2), (std::vector<uint32_t>{2}));
  EXPECT_EQ(t.weight_under(0), 10001.0);
  EXPECT_EQ(t.weight_under(1), 10000.0);
  EXPECT_EQ(t.weight_under(5), 1.0);
  EXPECT_THROW(t.sites_under(6), std::out_of_range);

  EXPECT_EQ(t.find("nope"), nullptr);
  EXPECT_EQ(t.find("us"), &t.node("us"));
  EXPECT_THROW(t.node("nope"), ConfigError);
  EXPECT_EQ(t.digest_hex().size(), 64u);
}

TEST(Topology, FederationDefaultsWhenAbsent) {
  Topology t = Topology::parse(example_with(-1, ""));
  FederationSpec d;
  EXPECT_EQ(t.federation().rounds, d.rounds);
  EXPECT_EQ(t.federation().codec, d.codec);
  EXPECT_EQ(t.federation().chunk_bytes, d.chunk_bytes);
  EXPECT_EQ(t.federation().outer.name, "fedavg");
}

TEST(Topology, DeeperTree) {
  Topology t = Topology::parse(R"(
job: deep
nodes:
  - {id: r, role: root, endpoint: "inproc://r"}
  - {id: s1, role: site, parent: sub, weight: 2}
  - {id: eu, role: region, parent: r, endpoint: "inproc://eu"}
  - {id: sub, role: region, parent: eu, endpoint: "ipc:///tmp/sub"}
  - {id: s2, role: site, parent: sub, weight: 3}
  - {id: s3, role: site, parent: eu, weight: 5}
  - {id: s4, role: site, parent: r, weight: 7}
)");
  EXPECT_EQ(t.root().index, 0u);
  EXPECT_EQ(t.node("sub").parent_index, 2u);
  EXPECT_EQ(t.node("sub").children, (std::vector<uint32_t>{1, 4}));
  EXPECT_EQ(t.node("eu").children, (std::vector<uint32_t>{3, 5}));
  EXPECT_EQ(t.root().children, (std::vector<uint32_t>{2, 6}));
  EXPECT_EQ(t.sites_under(0), (std::vector<uint32_t>{1, 4, 5, 6}));
  EXPECT_EQ(t.sites_under(2), (std::vector<uint32_t>{1, 4, 5}));
  EXPECT_EQ(t.sites_under(3), (std::vector<uint32_t>{1, 4}));
  EXPECT_EQ(t.weight_under(0), 17.0);
  EXPECT_EQ(t.weight_under(2), 10.0);
  EXPECT_EQ(t.weight_under(3), 5.0);
}

TEST(Topology, RejectsYamlAndKeyMistakes) {
  expect_error("job: x\nnodes: [ {id: a", {"topo.yaml:2:", "YAML syntax error"});
  expect_error("- a\n- b\n", {"expected a mapping"});
  expect_error(std::string(kExample) + "federaton: {}\n",
               {"unknown key 'federaton'", "federation"});
  expect_error(example_with(-1, "federation: {round: 3}\n"), {"unknown key 'round'", "rounds"});
  expect_error(example_with(-1, "federation: {outer_optimizer: {name: diloco, mom: 0.9}}\n"),
               {"unknown key 'mom'", "outer_optimizer"});
  expect_error(example_with(1, R"({id: eu, role: region, parent: root, endpiont: "tcp://h:1"})"),
               {"node 'eu'", "unknown key 'endpiont'", "endpoint"});
  expect_error(example_with(2, "{id: site-a, role: site, parent: eu, weight: 1, weight: 2}"),
               {"node 'site-a'", "'weight' given twice"});
  expect_error("nodes: []\n", {"missing 'job'"});
  expect_error("job: x\nnodes: []\n", {"'nodes' must be a non-empty list"});
  expect_error("job: x\nnodes: {a: 1}\n", {"'nodes' must be a non-empty list"});
  expect_error(example_with(-1, "  - {role: site, parent: eu}\n"), {"nodes[6]", "missing 'id'"});
  expect_error(example_with(2, "{id: site-a, parent: eu}"), {"node 'site-a'", "missing 'role'"});
  expect_error(example_with(-1, "job2: x\n"), {"unknown key 'job2'"});
}

TEST(Topology, RejectsBadIdsAndRoles) {
  expect_error(example_with(2, "{id: site a, role: site, parent: eu}"),
               {"node 'site a'", "invalid id"});
  expect_error(example_with(2, "{id: " + std::string(65, 'x') + ", role: site, parent: eu}"),
               {"invalid id"});
  expect_error(example_with(5, "{id: site-a, role: site, parent: us}"),
               {"node 'site-a'", "duplicate id", "nodes 2 and 5"});
  expect_error(example_with(1, R"({id: eu, role: regoin, parent: root, endpoint: "tcp://h:1"})"),
               {"node 'eu'", "unknown role 'regoin'"});
  expect_error(example_with(0, R"({id: root, role: region, endpoint: "tcp://h:1"})"),
               {"no node has role root"});
  expect_error(example_with(3, R"({id: us, role: root, endpoint: "tcp://h:2"})"),
               {"2 nodes have role root", "root, us"});
  expect_error("job: bad job\nnodes:\n  - {id: r, role: root}\n", {"job 'bad job' is invalid"});
}

TEST(Topology, RejectsBadParentLinks) {
  expect_error(example_with(0, R"({id: root, role: root, parent: eu, endpoint: "tcp://h:7000"})"),
               {"node 'root'", "the root has parent 'eu'"});
  expect_error(example_with(2, "{id: site-a, role: site}"), {"node 'site-a'", "missing parent"});
  expect_error(example_with(1, R"({id: eu, role: region, endpoint: "tcp://h:1"})"),
               {"node 'eu'", "missing parent"});
  expect_error(example_with(2, "{id: site-a, role: site, parent: ue}"),
               {"node 'site-a'", "parent 'ue' is not a node"});
  expect_error(example_with(4, "{id: site-b, role: site, parent: site-a}"),
               {"node 'site-b'", "parent 'site-a' is a site"});
  // eu and us point at each other: a cycle, unreachable from the root.
  std::string cyc = R"(job: j
nodes:
  - {id: root, role: root, endpoint: "tcp://h:7000"}
  - {id: eu, role: region, parent: us, endpoint: "tcp://h:1"}
  - {id: us, role: region, parent: eu, endpoint: "tcp://h:2"}
  - {id: s, role: site, parent: eu}
)";
  expect_error(cyc, {"node 'eu'", "cycle in parent links eu -> us -> eu", "unreachable from root"});
  // A region whose chain runs into a cycle without being on it.
  std::string tail =
      example_with(-1, "  - {id: x, role: region, parent: y, endpoint: \"tcp://h:9\"}\n"
                       "  - {id: y, role: region, parent: z, endpoint: \"tcp://h:9\"}\n"
                       "  - {id: z, role: region, parent: y, endpoint: \"tcp://h:9\"}\n"
                       "  - {id: sx, role: site, parent: x}\n");
  expect_error(
      tail, {"node 'x'", "unreachable from root 'root'", "x -> y -> z -> y", "cycle y -> z -> y"});
  expect_error(example_with(1, R"({id: eu, role: region, parent: eu, endpoint: "tcp://h:1"})"),
               {"node 'eu'", "cycle in parent links eu -> eu"});
}

TEST(Topology, RejectsBadEndpointsAndWeights) {
  expect_error(example_with(1, "{id: eu, role: region, parent: root}"),
               {"node 'eu'", "region needs an endpoint"});
  expect_error(example_with(0, "{id: root, role: root}"),
               {"node 'root'", "root needs an endpoint"});
  expect_error(example_with(1, R"({id: eu, role: region, parent: root, endpoint: "http://h:1"})"),
               {"node 'eu'", "endpoint 'http://h:1' is invalid", "tcp://"});
  expect_error(example_with(1, R"({id: eu, role: region, parent: root, endpoint: "tcp://h:1",
                                   bind: "tcp://* :1"})"),
               {"node 'eu'", "endpoint 'tcp://* :1' is invalid"});
  expect_error(example_with(1, R"({id: eu, role: region, parent: root, endpoint: "tcp://"})"),
               {"node 'eu'", "is invalid"});
  expect_error(example_with(2, R"({id: site-a, role: site, parent: eu, endpoint: "tcp://h:3"})"),
               {"node 'site-a'", "a site has no endpoint"});
  expect_error(example_with(2, R"({id: site-a, role: site, parent: eu, bind: "tcp://*:3"})"),
               {"node 'site-a'", "a site has no endpoint or bind"});
  expect_error(
      example_with(-1, "  - {id: lonely, role: region, parent: root, endpoint: \"tcp://h:4\"}\n"),
      {"node 'lonely'", "region has no children"});
  for (const char* w : {"0", "-1", "nan", "inf", "1e300", "1.5e12"}) {
    expect_error(
        example_with(2, std::string("{id: site-a, role: site, parent: eu, weight: ") + w + "}"),
        {"node 'site-a'", "weight", "must be > 0 and at most 1e+12"});
  }
  // A TCP endpoint names a port in 1..65535.
  for (const char* e : {"tcp://h:65536", "tcp://h:0", "tcp://h:99999999", "tcp://h", "tcp://:70",
                        "tcp://h:-1", "tcp://h:7x"}) {
    expect_error(
        example_with(1, std::string(R"({id: eu, role: region, parent: root, endpoint: ")") + e +
                            "\"}"),
        {"node 'eu'", std::string("endpoint '") + e + "' is invalid", "1..65535"});
  }
  for (const char* e : {"tcp://h:65535", "tcp://h:1", "tcp://[::1]:7000", "tcp://*:7000"}) {
    EXPECT_EQ(
        error_of(example_with(
            1, std::string(R"({id: eu, role: region, parent: root, endpoint: ")") + e + "\"}")),
        "")
        << e;
  }
  expect_error(example_with(2, "{id: site-a, role: site, parent: eu, weight: heavy}"),
               {"node 'site-a'", "'weight' must be a number, got 'heavy'"});
  expect_error(
      example_with(1, R"({id: eu, role: region, parent: root, endpoint: "tcp://h:1", weight: 2})"),
      {"node 'eu'", "'weight' applies to sites only"});
}

TEST(Topology, RejectsFederationValuesOutOfRange) {
  auto fed = [](const std::string& body) {
    return example_with(-1, "federation: {" + body + "}\n");
  };
  expect_error(fed("rounds: 0"), {"federation", "rounds is 0"});
  expect_error(fed("rounds: -3"), {"'rounds' must be a non-negative integer, got '-3'"});
  expect_error(fed("rounds: 2.5"), {"'rounds' must be a non-negative integer"});
  expect_error(fed("inner_steps: 0"), {"inner_steps is 0"});
  for (const char* cb : {"1000", "4092", "4194308", "4098"}) {
    expect_error(fed(std::string("chunk_bytes: ") + cb),
                 {std::string("chunk_bytes ") + cb + " is invalid", "multiple of 4"});
  }
  EXPECT_EQ(error_of(fed("chunk_bytes: 4096")), "");
  EXPECT_EQ(error_of(fed("chunk_bytes: 4194304")), "");
  expect_error(fed("codec: fp8"), {"federation", "codec", "fp8"});
  expect_error(fed("round_timeout_s: 0"), {"round_timeout_s 0 must be between 0.1 and 2592000"});
  // Every setting is bounded, so no conversion to milliseconds overflows and
  // no timer spins.
  expect_error(fed("round_timeout_s: 1e300"), {"round_timeout_s 1e+300 must be between"});
  expect_error(fed("round_timeout_s: nan"), {"round_timeout_s nan must be between"});
  expect_error(fed("heartbeat_s: 0.0001"), {"heartbeat_s 1e-04 must be between 0.01 and 3600"});
  expect_error(fed("heartbeat_s: 2, heartbeat_timeout_s: 1e9"),
               {"heartbeat_timeout_s 1e+09", "at most 86400"});
  expect_error(fed("deadline_s: 700"), {"deadline_s 700", "round_timeout_s 600"});
  expect_error(fed("rounds: 18446744073709551615"), {"rounds 18446744073709551615 is more than"});
  expect_error(fed("inner_steps: 2000000000"), {"inner_steps 2000000000 is more than"});
  expect_error(fed("outer_optimizer: {name: fedavg, lr: 1e300}"),
               {"lr 1e+300 must be in (0, 100]"});
  // A hostile file: nesting that would exhaust the parser's recursion.
  expect_error(std::string("job: x\nnodes: ") + std::string(100000, '[') +
                   std::string(100000, ']') + "\n",
               {"nested more than 64 levels deep"});
  expect_error(fed("outer_optimizer: {name: sgd}"), {"unknown outer_optimizer 'sgd'", "fedadam"});
  expect_error(fed("outer_optimizer: {name: diloco, lr: -1}"),
               {"diloco", "lr -1 must be in (0, 100]"});
  expect_error(fed("outer_optimizer: {name: diloco, momentum: 1}"),
               {"momentum 1 must be in [0, 1)"});
  expect_error(fed("outer_optimizer: {name: fedavg, momentum: 0.9}"),
               {"'fedavg'", "does not use 'momentum'"});
  expect_error(fed("outer_optimizer: {name: fedadam, eps: 0}"), {"eps 0 must be finite and > 0"});
  expect_error(fed("outer_optimizer: {name: diloco, lr_warmup_rounds: 2.5}"),
               {"lr_warmup_rounds 2.5 must be a whole number"});
  expect_error(fed("outer_optimizer: {name: fedadam, lr_warmup_rounds: 5}"),
               {"'fedadam'", "does not use 'lr_warmup_rounds'"});
  EXPECT_EQ(error_of(fed("outer_optimizer: {name: diloco, lr_warmup_rounds: 10}")), "");
  EXPECT_EQ(error_of(fed(
                "outer_optimizer: {name: fedadam, lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 0.001}")),
            "");
}

TEST(Topology, BuildValidatesLikeParse) {
  Topology t = Topology::parse(kExample);
  std::vector<NodeSpec> nodes = t.nodes();
  Topology same = Topology::build(t.job(), t.federation(), nodes);
  EXPECT_EQ(same.digest(), t.digest());
  EXPECT_EQ(same.node("eu").children, t.node("eu").children);

  nodes[2].endpoint = "tcp://h:9";
  try {
    Topology::build(t.job(), t.federation(), nodes);
    FAIL() << "site with an endpoint accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("<build>: node 'site-a'"), std::string::npos) << e.what();
  }
  nodes = t.nodes();
  nodes[3].role = static_cast<Role>(9);
  EXPECT_THROW(Topology::build(t.job(), t.federation(), nodes), ConfigError);
  EXPECT_THROW(Topology::build(t.job(), t.federation(), {}), ConfigError);
}

TEST(Topology, ToYamlRoundTrips) {
  Topology t = Topology::parse(kExample);
  Topology back = Topology::parse(t.to_yaml());
  EXPECT_EQ(back.digest(), t.digest());
  EXPECT_EQ(back.to_yaml(), t.to_yaml());

  // Ids YAML would read as null, numbers or booleans stay strings; odd doubles survive.
  FederationSpec f;
  f.outer.name = "fedadam";
  f.outer.params = {{"lr", 0.1 + 0.2}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}};
  f.round_timeout_s = 1.0 / 3.0;
  std::vector<NodeSpec> nodes(3);
  nodes[0] = {"null", Role::kRoot, "", "tcp://[::1]:7000", "tcp://*:7000", 1.0, 0, 0, {}};
  nodes[1] = {"1", Role::kSite, "null", "", "", 1e-300, 0, 0, {}};
  nodes[2] = {"true", Role::kSite, "null", "", "", 123456.789, 0, 0, {}};
  Topology odd = Topology::build("0", f, nodes);
  Topology odd_back = Topology::parse(odd.to_yaml());
  EXPECT_EQ(odd_back.digest(), odd.digest());
  EXPECT_EQ(odd_back.node("1").weight, 1e-300);
  EXPECT_EQ(odd_back.federation().outer.param("lr"), 0.1 + 0.2);
  EXPECT_EQ(odd_back.federation().round_timeout_s, 1.0 / 3.0);
}

TEST(Topology, DigestIgnoresFormattingOnly) {
  Topology a = Topology::parse(kExample);
  std::string reformatted = R"(
# same federation, written differently
nodes:
  - id: root
    endpoint: tcp://127.0.0.1:7000
    role: root
  - {role: region, id: eu, parent: root, endpoint: "tcp://127.0.0.1:7001", bind: "tcp://*:7001"}
  - {id: site-a, role: site, parent: eu, weight: 6.0e3}
  - {id: us, role: region, parent: root, endpoint: "tcp://127.0.0.1:7002", bind: "tcp://127.0.0.1:7002"}
  - {id: site-b, role: site, parent: eu, weight: 4000}
  - {id: site-c, role: site, parent: us, weight: 1}
federation:
  outer_optimizer: {momentum: 0.9, lr: 0.70, name: diloco}
  codec: "fp16"
  rounds: 20
  inner_steps: 50
  chunk_bytes: 1048576
  round_timeout_s: 600.0
job: fashion-demo
)";
  EXPECT_EQ(Topology::parse(reformatted).digest(), a.digest());
  EXPECT_EQ(Topology::parse(kExample).digest(), a.digest());
}

TEST(Topology, DigestChangesWithEveryField) {
  const Topology base = Topology::parse(kExample);
  using Edit = std::function<void(std::string&, FederationSpec&, std::vector<NodeSpec>&)>;
  const std::vector<Edit> edits = {
      [](auto& job, auto&, auto&) { job = "fashion-demo2"; },
      [](auto&, auto& f, auto&) { f.rounds = 21; },
      [](auto&, auto& f, auto&) { f.inner_steps = 51; },
      [](auto&, auto& f, auto&) { f.codec = "fp32"; },
      [](auto&, auto& f, auto&) { f.chunk_bytes = 4096; },
      [](auto&, auto& f, auto&) { f.round_timeout_s = 601; },
      [](auto&, auto& f, auto&) {
        f.outer.name = "fedavg";
        f.outer.params.erase("momentum");
      },
      [](auto&, auto& f, auto&) { f.outer.params["lr"] = 0.7000000000000001; },
      [](auto&, auto& f, auto&) { f.outer.params.erase("lr"); },
      [](auto&, auto& f, auto&) { f.outer.params["momentum"] = 0.8; },
      [](auto&, auto& f, auto&) {
        f.outer = OuterOptimizerSpec{"fedadam", {{"lr", 0.7}, {"beta1", 0.9}}};
      },
      [](auto&, auto& f, auto&) {
        f.outer = OuterOptimizerSpec{"fedadam", {{"lr", 0.7}, {"beta2", 0.99}}};
      },
      [](auto&, auto& f, auto&) {
        f.outer = OuterOptimizerSpec{"fedadam", {{"lr", 0.7}, {"eps", 1e-3}}};
      },
      [](auto&, auto&, auto& n) { n[2].id = "site-z"; },
      [](auto&, auto&, auto& n) { n[4].parent = "us"; },
      [](auto&, auto&, auto& n) { n[1].endpoint = "tcp://127.0.0.1:7009"; },
      [](auto&, auto&, auto& n) { n[1].bind = "tcp://127.0.0.1:7001"; },
      [](auto&, auto&, auto& n) { n[2].weight = 6000.5; },
      [](auto&, auto&, auto& n) { std::swap(n[2], n[4]); },
      [](auto&, auto& f, auto&) { f.tcp_congestion = "cubic"; },
      [](auto&, auto&, auto& n) { n[1].tcp_congestion = "reno"; },
      [](auto&, auto&, auto& n) {  // eu becomes the root and the old root a region under it
        n[0].role = Role::kRegion;
        n[0].parent = "eu";
        n[1].role = Role::kRoot;
        n[1].parent.clear();
      },
  };
  std::set<std::string> digests = {base.digest_hex()};
  for (size_t i = 0; i < edits.size(); ++i) {
    std::string job = base.job();
    FederationSpec f = base.federation();
    std::vector<NodeSpec> n = base.nodes();
    edits[i](job, f, n);
    Topology t = Topology::build(job, f, n);
    EXPECT_TRUE(digests.insert(t.digest_hex()).second)
        << "edit " << i << " left the digest unchanged";
    // And the edited topology still round-trips through YAML.
    EXPECT_EQ(Topology::parse(t.to_yaml()).digest(), t.digest()) << "edit " << i;
  }
}

TEST(Topology, TcpCongestionDefaultsToBbrAndANodeOverridesIt) {
  const Topology plain = Topology::parse(kExample);
  EXPECT_EQ(plain.federation().tcp_congestion, "bbr");
  for (const NodeSpec& n : plain.nodes()) EXPECT_TRUE(n.tcp_congestion.empty()) << n.id;

  const Topology t = Topology::parse(
      example_with(1, R"({id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", )"
                      R"(tcp_congestion: cubic})") +
      "federation: {tcp_congestion: system}\n");
  EXPECT_EQ(t.federation().tcp_congestion, "system");
  EXPECT_EQ(t.node("eu").tcp_congestion, "cubic");
  EXPECT_TRUE(t.node("site-a").tcp_congestion.empty());  // the federation's
  // Every role takes it, and any well-formed name (which the host has is
  // only known where the node runs).
  for (int line : {0, 2, 3}) {
    std::string spec = line == 0   ? R"({id: root, role: root, endpoint: "tcp://127.0.0.1:7000")"
                       : line == 2 ? "{id: site-a, role: site, parent: eu, weight: 6000"
                                   : R"({id: us, role: region, parent: root, )"
                                     R"(endpoint: "tcp://127.0.0.1:7002")";
    EXPECT_EQ(error_of(example_with(line, spec + ", tcp_congestion: reno}")), "") << line;
    EXPECT_EQ(error_of(example_with(line, spec + ", tcp_congestion: system}")), "") << line;
  }
  EXPECT_EQ(error_of(example_with(-1, "federation: {tcp_congestion: dctcp_2}\n")), "");
  EXPECT_EQ(error_of(example_with(-1, "federation: {tcp_congestion: abcdefghijklmno}\n")), "");
}

TEST(Topology, RefusesTcpCongestionThatIsNoAlgorithmName) {
  const auto fed = [](const std::string& v) {
    return example_with(-1, "federation: {tcp_congestion: " + v + "}\n");
  };
  for (const char* bad : {"\"BBR!\"", "BBR", "abcdefghijklmnop", "\"\"", "\"b b\"", "bbr-2"}) {
    expect_error(fed(bad), {"topo.yaml:", "federation: tcp_congestion '", "' is invalid",
                            "1..15 characters of [a-z0-9_]", "tcp_available_congestion_control",
                            "\"system\""});
  }
  expect_error(fed("[bbr]"), {"federation", "'tcp_congestion' must be a string"});
  expect_error(fed("bbr, tcp_congestion: reno"), {"'tcp_congestion' given twice"});
  expect_error(example_with(2, "{id: site-a, role: site, parent: eu, tcp_congestion: Cubic}"),
               {"topo.yaml:", "node 'site-a': tcp_congestion 'Cubic' is invalid", "system"});
  // On a node, "" is not "the federation's": that is leaving the key out.
  expect_error(example_with(3, R"({id: us, role: region, parent: root, )"
                               R"(endpoint: "tcp://127.0.0.1:7002", tcp_congestion: ""})"),
               {"node 'us': tcp_congestion '' is invalid"});

  // build() checks what parse() checks.
  const Topology t = Topology::parse(kExample);
  FederationSpec f = t.federation();
  f.tcp_congestion = "BBR!";
  try {
    Topology::build(t.job(), f, t.nodes());
    FAIL() << "tcp_congestion 'BBR!' accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("<build>: federation: tcp_congestion 'BBR!'"),
              std::string::npos)
        << e.what();
  }
  std::vector<NodeSpec> nodes = t.nodes();
  nodes[1].tcp_congestion = std::string(16, 'a');
  try {
    Topology::build(t.job(), t.federation(), nodes);
    FAIL() << "a 16-character tcp_congestion accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("<build>: node 'eu': tcp_congestion"), std::string::npos)
        << e.what();
  }
}

TEST(Topology, TcpCongestionInTheDigestOnlyWhenSet) {
  // A file without the key keeps the digest it had before the key existed
  // (test_topology_residency.cpp pins it), and so does one spelling out
  // the default.
  const Topology absent = Topology::parse(example_with(-1, ""));
  EXPECT_EQ(Topology::parse(example_with(-1, "federation: {tcp_congestion: bbr}\n")).digest(),
            absent.digest());
  std::set<std::string> digests = {absent.digest_hex()};
  for (const std::string& text :
       {example_with(-1, "federation: {tcp_congestion: system}\n"),
        example_with(-1, "federation: {tcp_congestion: cubic}\n"),
        example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, tcp_congestion: bbr}"),
        example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, tcp_congestion: reno}"),
        example_with(0, R"({id: root, role: root, endpoint: "tcp://127.0.0.1:7000", )"
                        R"(tcp_congestion: reno})")}) {
    const Topology t = Topology::parse(text);
    EXPECT_TRUE(digests.insert(t.digest_hex()).second) << text;
    // And it round-trips through YAML, setting for setting.
    const Topology back = Topology::parse(t.to_yaml());
    EXPECT_EQ(back.digest(), t.digest()) << t.to_yaml();
    EXPECT_EQ(back.federation().tcp_congestion, t.federation().tcp_congestion);
    for (const NodeSpec& n : t.nodes()) {
      EXPECT_EQ(back.node(n.id).tcp_congestion, n.tcp_congestion) << n.id;
    }
  }
}

TEST(Topology, OverlapStepsAtMostInnerStepsAndInTheDigestOnlyWhenSet) {
  const Topology absent = Topology::parse(example_with(-1, ""));
  EXPECT_EQ(absent.federation().overlap_steps, 0u);  // blocking rounds
  EXPECT_EQ(Topology::parse(example_with(-1, "federation: {overlap_steps: 0}\n")).digest(),
            absent.digest());
  std::set<std::string> digests = {absent.digest_hex()};
  for (const char* tau : {"1", "7", "10"}) {
    const Topology t = Topology::parse(example_with(
        -1, std::string("federation: {inner_steps: 10, overlap_steps: ") + tau + "}\n"));
    EXPECT_EQ(t.federation().overlap_steps, std::stoull(tau));
    const Topology back = Topology::parse(t.to_yaml());
    EXPECT_EQ(back.digest(), t.digest()) << t.to_yaml();
    EXPECT_EQ(back.federation().overlap_steps, t.federation().overlap_steps);
    EXPECT_TRUE(digests.insert(t.digest_hex()).second) << tau;
  }
  expect_error(
      example_with(-1, "federation: {inner_steps: 10, overlap_steps: 11}\n"),
      {"topo.yaml:", "federation: overlap_steps 11 is more than inner_steps 10", "0 = blocking"});
  expect_error(example_with(-1, "federation: {overlap_steps: -1}\n"), {"overlap_steps"});
  expect_error(example_with(-1, "federation: {overlap_steps: two}\n"), {"overlap_steps"});
  FederationSpec f = absent.federation();
  f.overlap_steps = f.inner_steps + 1;
  EXPECT_THROW(Topology::build(absent.job(), f, absent.nodes()), ConfigError);
}

TEST(Topology, LoadNamesTheFile) {
  std::string path = ::testing::TempDir() + "fedwan_topology_test.yaml";
  {
    std::ofstream out(path);
    out << example_with(2, "{id: site-a, role: site, parent: eu, weight: -2}");
  }
  try {
    Topology::load(path);
    FAIL() << "negative weight accepted";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": node 'site-a'", 0), 0u) << msg;
  }
  {
    std::ofstream out(path);
    out << kExample;
  }
  EXPECT_EQ(Topology::load(path).digest(), Topology::parse(kExample).digest());
  std::remove(path.c_str());
  try {
    Topology::load(path);
    FAIL() << "missing file accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

TEST(Topology, RoleNames) {
  EXPECT_STREQ(role_name(Role::kRoot), "root");
  EXPECT_STREQ(role_name(Role::kRegion), "region");
  EXPECT_STREQ(role_name(Role::kSite), "site");
  EXPECT_STREQ(role_name(static_cast<Role>(9)), "unknown");
}

}  // namespace
}  // namespace fedwan
