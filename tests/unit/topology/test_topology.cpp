#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"

namespace fedwan {
namespace {

const char* kExample = R"(
job: fashion-demo
federation:            # optional; every key optional
  rounds: 20
  inner_steps: 50
  codec: fp16
  chunk_bytes: 1048576
  round_timeout_s: 600
  outer_optimizer: {name: diloco, lr: 0.7, momentum: 0.9}
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000"}
  - {id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", bind: "tcp://*:7001"}
  - {id: site-a, role: site, parent: eu, weight: 6000}
  - {id: us, role: region, parent: root, endpoint: "tcp://127.0.0.1:7002"}
  - {id: site-b, role: site, parent: eu, weight: 4000}
  - {id: site-c, role: site, parent: us}
)";

// The example with one node line replaced (`line` is the index in `nodes`),
// or with extra text appended to the node list when line < 0.
std::string example_with(int line, const std::string& replacement) {
  std::vector<std::string> nodes = {
      R"({id: root, role: root, endpoint: "tcp://127.0.0.1:7000"})",
      R"({id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001"})",
      R"({id: site-a, role: site, parent: eu, weight: 6000})",
      R"({id: us, role: region, parent: root, endpoint: "tcp://127.0.0.1:7002"})",
      R"({id: site-b, role: site, parent: eu, weight: 4000})",
      R"({id: site-c, role: site, parent: us})"};
  if (line >= 0) nodes[static_cast<size_t>(line)] = replacement;
  std::string y = "job: fashion-demo\nnodes:\n";
  for (const std::string& n : nodes) {
    if (!n.empty()) y += "  - " + n + "\n";
  }
  if (line < 0) y += replacement;
  return y;
}

// Parses and returns the ConfigError message ("" if it parsed).
std::string error_of(const std::string& yaml) {
  try {
    Topology::parse(yaml, "topo.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& yaml, const std::vector<std::string>& parts) {
  std::string msg = error_of(yaml);
  ASSERT_FALSE(msg.empty()) << "accepted:\n" << yaml;
  EXPECT_EQ(msg.rfind("topo.yaml", 0), 0u) << msg;
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

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

// ---- residency policy ------------------------------------------------------

// Two regions, EU and US-CA, each aggregating at least k_min sites, and one
// site reporting straight to the (EU) root.
std::string residency_with(int line, const std::string& replacement,
                           const std::string& policy = "policy: {k_min: 2}\n") {
  std::vector<std::string> nodes = {
      R"({id: root, role: root, endpoint: "tcp://127.0.0.1:7000", jurisdiction: EU})",
      R"({id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", jurisdiction: EU})",
      R"({id: us, role: region, parent: root, endpoint: "tcp://127.0.0.1:7002",)"
      R"( jurisdiction: US-CA, k_min: 3})",
      "{id: eu-a, role: site, parent: eu, allowed_jurisdictions: [EU]}",
      "{id: eu-b, role: site, parent: eu, allowed_jurisdictions: [CH, EU]}",
      "{id: us-a, role: site, parent: us}",
      "{id: us-b, role: site, parent: us, allowed_jurisdictions: [US-CA]}",
      "{id: us-c, role: site, parent: us}",
      "{id: solo, role: site, parent: root, allowed_jurisdictions: [EU]}"};
  if (line >= 0) nodes[static_cast<size_t>(line)] = replacement;
  std::string y = "job: residency\n" + policy + "nodes:\n";
  for (const std::string& n : nodes) {
    if (!n.empty()) y += "  - " + n + "\n";
  }
  if (line < 0) y += replacement;
  return y;
}

TEST(Topology, ResidencyKeysParse) {
  Topology t = Topology::parse(residency_with(-1, ""));
  EXPECT_EQ(t.policy().k_min, 2u);
  EXPECT_EQ(t.root().jurisdiction, "EU");
  EXPECT_EQ(t.node("eu").jurisdiction, "EU");
  EXPECT_EQ(t.node("eu").k_min, 0u);  // inherits policy.k_min
  EXPECT_EQ(t.node("us").jurisdiction, "US-CA");
  EXPECT_EQ(t.node("us").k_min, 3u);
  EXPECT_EQ(t.node("eu-b").allowed_jurisdictions, (std::vector<std::string>{"CH", "EU"}));
  EXPECT_TRUE(t.node("us-a").allowed_jurisdictions.empty());
  EXPECT_TRUE(t.node("us-a").jurisdiction.empty());

  // Without the new keys: no jurisdictions, no lists, k_min 1 everywhere.
  Topology old = Topology::parse(kExample);
  EXPECT_EQ(old.policy().k_min, 1u);
  for (const NodeSpec& n : old.nodes()) {
    EXPECT_TRUE(n.jurisdiction.empty()) << n.id;
    EXPECT_TRUE(n.allowed_jurisdictions.empty()) << n.id;
    EXPECT_EQ(n.k_min, 0u) << n.id;
  }

  // An empty list means "any"; labels YAML would read as booleans or numbers
  // stay strings; 32 characters is the longest label.
  const std::string longest(32, 'J');
  const std::string extra =
      "  - {id: no, role: region, parent: root, endpoint: \"tcp://h:9\", jurisdiction: NO, "
      "k_min: 1}\n"
      "  - {id: no-a, role: site, parent: no, allowed_jurisdictions: [NO, 1, " +
      longest + "]}\n  - {id: no-b, role: site, parent: no, allowed_jurisdictions: []}\n";
  Topology odd = Topology::parse(residency_with(-1, extra));
  EXPECT_EQ(odd.node("no").jurisdiction, "NO");
  EXPECT_EQ(odd.node("no-a").allowed_jurisdictions, (std::vector<std::string>{"NO", "1", longest}));
  EXPECT_TRUE(odd.node("no-b").allowed_jurisdictions.empty());
  EXPECT_EQ(Topology::parse(example_with(-1, "policy: {}\n")).policy().k_min, 1u);
}

TEST(Topology, ResidencyRejectsBadValues) {
  const std::string region =
      R"({id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", )";
  for (const std::string& label :
       std::vector<std::string>{"E U", "EU/FR", "\"\"", std::string(33, 'J')}) {
    expect_error(residency_with(1, region + "jurisdiction: " + label + "}"),
                 {"topo.yaml:5:", "node 'eu'", "is invalid", "1..32 characters"});
  }
  expect_error(residency_with(1, region + "jurisdiction: [EU]}"),
               {"node 'eu'", "'jurisdiction' must be a string"});
  expect_error(residency_with(3, "{id: eu-a, role: site, parent: eu, allowed_jurisdictions: EU}"),
               {"topo.yaml:7:", "node 'eu-a'", "must be a list of jurisdictions"});
  expect_error(
      residency_with(3, "{id: eu-a, role: site, parent: eu, allowed_jurisdictions: [EU, e u]}"),
      {"node 'eu-a'", "allowed jurisdiction 'e u' is invalid"});
  expect_error(
      residency_with(3, "{id: eu-a, role: site, parent: eu, allowed_jurisdictions: [EU, EU]}"),
      {"node 'eu-a'", "lists 'EU' twice"});
  for (const char* k : {"0", "4294967296"}) {
    expect_error(residency_with(1, region + "jurisdiction: EU, k_min: " + k + "}"),
                 {"node 'eu'", std::string("k_min ") + k + " is invalid", ">= 1"});
  }
  for (const char* k : {"-1", "2.5", "two"}) {
    expect_error(residency_with(1, region + "jurisdiction: EU, k_min: " + k + "}"),
                 {"node 'eu'", std::string("'k_min' must be a non-negative integer, got '") + k});
  }
  expect_error(residency_with(1, region + "jurisdiction: EU, jurisdiction: US}"),
               {"node 'eu'", "'jurisdiction' given twice"});
  expect_error(residency_with(-1, "", "policy: {k_min: 0}\n"),
               {"topo.yaml:2:", "policy", "k_min 0 is invalid"});
  expect_error(residency_with(-1, "", "policy: {kmin: 2}\n"),
               {"policy", "unknown key 'kmin'", "k_min"});
  expect_error(residency_with(-1, "", "policy: {k_min: 2, k_min: 3}\n"),
               {"policy", "'k_min' given twice"});
  expect_error(residency_with(-1, "", "policy: 2\n"), {"policy", "expected a mapping"});
  expect_error(residency_with(-1, "", "policy: {}\npolicy: {}\n"), {"'policy' given twice"});
}

TEST(Topology, ResidencyKeysRefusedOnWrongRole) {
  expect_error(residency_with(3, "{id: eu-a, role: site, parent: eu, jurisdiction: EU}"),
               {"topo.yaml:7:", "node 'eu-a'", "'jurisdiction' applies to root and region",
                "allowed_jurisdictions"});
  expect_error(residency_with(1, R"({id: eu, role: region, parent: root, endpoint: "tcp://h:1",
                                     allowed_jurisdictions: [EU]})"),
               {"node 'eu'", "'allowed_jurisdictions' applies to sites only"});
  expect_error(residency_with(0, R"({id: root, role: root, endpoint: "tcp://h:7000",
                                     allowed_jurisdictions: [EU]})"),
               {"node 'root'", "'allowed_jurisdictions' applies to sites only"});
  expect_error(residency_with(3, "{id: eu-a, role: site, parent: eu, k_min: 2}"),
               {"node 'eu-a'", "'k_min' applies to regions only", "its own delta"});
  expect_error(
      residency_with(0, R"({id: root, role: root, endpoint: "tcp://h:7000", k_min: 2})"),
      {"node 'root'", "'k_min' applies to regions only", "final destination", "policy.k_min"});

  // build() applies the same rules to hand-made nodes.
  const Topology t = Topology::parse(residency_with(-1, ""));
  auto build_error = [&](const std::function<void(std::vector<NodeSpec>&)>& edit,
                         PolicySpec policy = PolicySpec{2}) {
    std::vector<NodeSpec> n = t.nodes();
    edit(n);
    try {
      Topology::build(t.job(), t.federation(), n, policy);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::vector<std::pair<std::function<void(std::vector<NodeSpec>&)>, std::string>> cases = {
      {[](auto& n) { n[3].jurisdiction = "EU"; },
       "<build>: node 'eu-a': 'jurisdiction' applies to root and region"},
      {[](auto& n) { n[1].allowed_jurisdictions = {"EU"}; },
       "node 'eu': 'allowed_jurisdictions' applies to sites only"},
      {[](auto& n) { n[0].k_min = 2; }, "node 'root': 'k_min' applies to regions only"},
      {[](auto& n) { n[5].k_min = 1; }, "node 'us-a': 'k_min' applies to regions only"},
      {[](auto& n) { n[1].jurisdiction = "E U"; }, "node 'eu': jurisdiction 'E U' is invalid"},
      {[](auto& n) {
         n[3].allowed_jurisdictions = {"EU", "EU"};
       },
       "lists 'EU' twice"},
      {[](auto& n) { n[3].allowed_jurisdictions = {"US-CA"}; }, "site 'eu-a' may send"},
  };
  for (const auto& [edit, part] : cases) {
    std::string msg = build_error(edit);
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
  EXPECT_NE(build_error([](auto&) {}, PolicySpec{0}).find("<build>: policy: k_min 0 is invalid"),
            std::string::npos);
  EXPECT_NE(build_error([](auto&) {}, PolicySpec{4}).find("region 'eu' aggregates 2 sites"),
            std::string::npos);
  EXPECT_EQ(build_error([](auto&) {}), "");
}

TEST(Topology, ResidencyRefusesSiteWhoseParentIsOutsideItsList) {
  expect_error(residency_with(6, "{id: us-b, role: site, parent: us, allowed_jurisdictions: [EU]}"),
               {"site 'us-b' may send its delta only to [EU]; its parent 'us' is in "
                "jurisdiction 'US-CA'",
                "add 'US-CA' to its allowed_jurisdictions"});
  expect_error(
      residency_with(2, R"({id: us, role: region, parent: root, endpoint: "tcp://h:2", k_min: 3})"),
      {"site 'us-b' may send its delta only to [US-CA]; its parent 'us' has no jurisdiction",
       "give 'us' a jurisdiction"});
  // Labels compare exactly: "eu" is not "EU".
  expect_error(residency_with(3, "{id: eu-a, role: site, parent: eu, allowed_jurisdictions: [eu]}"),
               {"site 'eu-a' may send its delta only to [eu]", "jurisdiction 'EU'"});
  // A site directly under the root is checked against the root's jurisdiction.
  expect_error(
      residency_with(0, R"({id: root, role: root, endpoint: "tcp://h:7000", jurisdiction: US})"),
      {"site 'solo' may send its delta only to [EU]; its parent 'root' is in jurisdiction 'US'"});
  expect_error(residency_with(0, R"({id: root, role: root, endpoint: "tcp://h:7000"})"),
               {"site 'solo'", "its parent 'root' has no jurisdiction"});
  // Without an allowed list any parent will do, jurisdiction or not.
  EXPECT_EQ(error_of(residency_with(8, "{id: solo, role: site, parent: root}")), "");
}

TEST(Topology, ResidencyRefusesRegionBelowKMin) {
  // policy k_min 2, region eu with one site left.
  expect_error(residency_with(4, ""),
               {"region 'eu' aggregates 1 site but residency policy requires k_min 2: no single "
                "site's delta may leave its region; add sites or lower k_min",
                "(set by policy.k_min"});
  // us's own k_min 3 with two sites.
  expect_error(residency_with(7, ""),
               {"region 'us' aggregates 2 sites but residency policy requires k_min 3: no "
                "aggregate of fewer than 3 sites may leave its region",
                "(set on the region)"});
  // A region's own k_min overrides the policy in both directions.
  EXPECT_EQ(error_of(residency_with(
                1,
                R"({id: eu, role: region, parent: root, endpoint: "tcp://h:1", jurisdiction: EU,)"
                " k_min: 1}",
                "policy: {k_min: 5}\n")),
            "");
  // Sites in nested regions count toward the outer region; the root, the
  // final destination, has no k_min even with a single site under it.
  std::string nested = R"(job: nested
policy: {k_min: 3}
nodes:
  - {id: r, role: root, endpoint: "inproc://r"}
  - {id: outer, role: region, parent: r, endpoint: "inproc://o"}
  - {id: inner, role: region, parent: outer, endpoint: "inproc://i", k_min: 2}
  - {id: s1, role: site, parent: inner}
  - {id: s2, role: site, parent: inner}
  - {id: s3, role: site, parent: outer}
)";
  EXPECT_EQ(error_of(nested), "");
  EXPECT_EQ(error_of("job: one\npolicy: {k_min: 4}\nnodes:\n"
                     "  - {id: r, role: root, endpoint: \"inproc://r\"}\n"
                     "  - {id: s, role: site, parent: r}\n"),
            "");
}

TEST(Topology, KMinForGivesTheEffectiveValue) {
  Topology t = Topology::parse(residency_with(-1, ""));
  EXPECT_EQ(t.k_min_for(t.node("eu").index), 2u);  // policy.k_min
  EXPECT_EQ(t.k_min_for(t.node("us").index), 3u);  // its own
  EXPECT_EQ(t.k_min_for(t.root().index), 1u);      // the final destination
  EXPECT_EQ(t.k_min_for(t.node("eu-a").index), 1u);
  EXPECT_THROW((void)t.k_min_for(static_cast<uint32_t>(t.nodes().size())), std::out_of_range);
  Topology old = Topology::parse(kExample);
  for (const NodeSpec& n : old.nodes()) EXPECT_EQ(old.k_min_for(n.index), 1u) << n.id;
}

TEST(Topology, ResidencyRefusalAtRunTime) {
  Topology t = Topology::parse(residency_with(
      -1, "  - {id: eu2, role: region, parent: root, endpoint: \"tcp://h:9\", jurisdiction: EU}\n"
          "  - {id: eu2-a, role: site, parent: eu2}\n  - {id: eu2-b, role: site, parent: eu2}\n"));
  EXPECT_EQ(t.residency_refusal("eu-a", "eu"), std::nullopt);
  EXPECT_EQ(t.residency_refusal("us-a", "us"), std::nullopt);    // no list: any parent
  EXPECT_EQ(t.residency_refusal("solo", "root"), std::nullopt);  // under the root
  EXPECT_EQ(t.residency_refusal("eu-a", "eu2"), "site 'eu-a' reports to 'eu', not to 'eu2'");
  EXPECT_EQ(t.residency_refusal("us-a", "eu"), "site 'us-a' reports to 'us', not to 'eu'");
  EXPECT_EQ(t.residency_refusal("eu-a", "root"), "site 'eu-a' reports to 'eu', not to 'root'");
  // Out of its jurisdictions: that is the reason given, not the wrong parent.
  EXPECT_EQ(t.residency_refusal("eu-a", "us"),
            "site 'eu-a' may send its delta only to [EU]; aggregator 'us' is in jurisdiction "
            "'US-CA'");
  EXPECT_EQ(t.residency_refusal("us-b", "root"),
            "site 'us-b' may send its delta only to [US-CA]; aggregator 'root' is in "
            "jurisdiction 'EU'");

  auto refused = [&](const std::string& site, const std::string& agg, const std::string& part) {
    std::optional<std::string> why;
    EXPECT_NO_THROW(why = t.residency_refusal(site, agg));
    ASSERT_TRUE(why.has_value()) << site << " -> " << agg;
    EXPECT_NE(why->find(part), std::string::npos) << *why;
  };
  refused("nobody", "eu", "sender 'nobody' is not a node of topology 'residency'");
  refused("eu-a", "nowhere", "aggregator 'nowhere' is not a node of topology 'residency'");
  refused("", "", "is not a node");
  refused("eu", "root", "'eu' is a region, not a site");
  refused("root", "eu", "'root' is a root, not a site");
  refused("eu-a", "eu-b", "'eu-b' is a site, not an aggregator");

  // A topology without a policy only checks parentage.
  Topology old = Topology::parse(kExample);
  EXPECT_EQ(old.residency_refusal("site-a", "eu"), std::nullopt);
  EXPECT_EQ(old.residency_refusal("site-a", "us"), "site 'site-a' reports to 'eu', not to 'us'");
}

TEST(Topology, ResidencyDigest) {
  // The digest of a topology without residency keys is the one it had before
  // they existed: mixed versions of fedwan still accept each other.
  const Topology old = Topology::parse(kExample);
  EXPECT_EQ(old.digest_hex(), "e2cf2b7782add3697133af5e241965efcc5f5fbe1f2dfa4fc54d58ca4cedc13e");
  EXPECT_EQ(old.to_yaml().find("policy"), std::string::npos);
  EXPECT_EQ(old.to_yaml().find("jurisdiction"), std::string::npos);
  EXPECT_EQ(old.to_yaml().find("k_min"), std::string::npos);
  // Spelling out the defaults changes nothing.
  std::string defaults = example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, "
                                         "allowed_jurisdictions: []}");
  EXPECT_EQ(Topology::parse(defaults + "policy: {k_min: 1}\n").digest(),
            Topology::parse(example_with(-1, "")).digest());
  // The allowed list is a set: order does not matter.
  EXPECT_EQ(Topology::parse(residency_with(4, "{id: eu-b, role: site, parent: eu, "
                                              "allowed_jurisdictions: [EU, CH]}"))
                .digest(),
            Topology::parse(residency_with(-1, "")).digest());

  const Topology base = Topology::parse(residency_with(-1, ""));
  using Edit = std::function<void(PolicySpec&, std::vector<NodeSpec>&)>;
  const std::vector<Edit> edits = {
      [](auto& p, auto&) { p.k_min = 1; },
      [](auto& p, auto& n) {  // same effective k_min of eu, but stated on the region
        p.k_min = 1;
        n[1].k_min = 2;
      },
      [](auto&, auto& n) { n[2].k_min = 2; },
      [](auto&, auto& n) { n[2].k_min = 0; },
      [](auto&, auto& n) {
        n[1].jurisdiction = "EU-DE";
        n[3].allowed_jurisdictions = {"EU-DE"};
        n[4].allowed_jurisdictions = {"EU-DE"};
      },
      [](auto&, auto& n) { n[5].allowed_jurisdictions = {"US-CA"}; },
      [](auto&, auto& n) { n[4].allowed_jurisdictions = {"EU"}; },
      [](auto&, auto& n) { n[4].allowed_jurisdictions.clear(); },
      [](auto&, auto& n) {
        n[2].jurisdiction.clear();
        n[6].allowed_jurisdictions.clear();
      },
      [](auto&, auto& n) {
        n[0].jurisdiction = "CH";
        n[8].allowed_jurisdictions = {"CH"};
      },
  };
  std::set<std::string> digests = {base.digest_hex(), old.digest_hex()};
  for (size_t i = 0; i < edits.size(); ++i) {
    PolicySpec p = base.policy();
    std::vector<NodeSpec> n = base.nodes();
    edits[i](p, n);
    Topology t = Topology::build(base.job(), base.federation(), n, p);
    EXPECT_TRUE(digests.insert(t.digest_hex()).second)
        << "edit " << i << " left the digest unchanged";
    EXPECT_EQ(Topology::parse(t.to_yaml()).digest(), t.digest()) << "edit " << i;
  }
}

TEST(Topology, ResidencyToYamlRoundTrips) {
  const Topology t = Topology::parse(residency_with(-1, ""));
  const std::string y = t.to_yaml();
  EXPECT_NE(y.find("policy:\n  k_min: 2\n"), std::string::npos) << y;
  EXPECT_NE(y.find(R"(jurisdiction: "US-CA", k_min: 3)"), std::string::npos) << y;
  EXPECT_NE(y.find(R"(allowed_jurisdictions: ["CH", "EU"])"), std::string::npos) << y;
  const Topology back = Topology::parse(y);
  EXPECT_EQ(back.digest(), t.digest());
  EXPECT_EQ(back.to_yaml(), y);
  EXPECT_EQ(back.policy().k_min, 2u);
  for (const NodeSpec& n : t.nodes()) {
    const NodeSpec& m = back.node(n.id);
    EXPECT_EQ(m.jurisdiction, n.jurisdiction) << n.id;
    EXPECT_EQ(m.allowed_jurisdictions, n.allowed_jurisdictions) << n.id;
    EXPECT_EQ(m.k_min, n.k_min) << n.id;
  }
  // Labels YAML would read as booleans or numbers survive as strings.
  std::vector<NodeSpec> nodes(2);
  nodes[0].id = "r";
  nodes[0].role = Role::kRoot;
  nodes[0].endpoint = "inproc://r";
  nodes[0].jurisdiction = "NO";
  nodes[1].id = "s";
  nodes[1].parent = "r";
  nodes[1].allowed_jurisdictions = {"NO", "1", "null"};
  const Topology odd = Topology::build("j", FederationSpec{}, nodes, PolicySpec{7});
  const Topology odd_back = Topology::parse(odd.to_yaml());
  EXPECT_EQ(odd_back.digest(), odd.digest());
  EXPECT_EQ(odd_back.root().jurisdiction, "NO");
  EXPECT_EQ(odd_back.node("s").allowed_jurisdictions,
            (std::vector<std::string>{"NO", "1", "null"}));
  EXPECT_EQ(odd_back.policy().k_min, 7u);
}

// ---- standby root and checkpoint replication --------------------------------

// The example with a standby root (standby_bind given when not empty) and
// extra federation settings.
std::string standby_with(const std::string& standby_bind = "", const std::string& federation = "") {
  std::string root =
      R"({id: root, role: root, endpoint: "tcp://127.0.0.1:7000", standby_endpoint: )"
      R"("tcp://127.0.0.2:7000")";
  if (!standby_bind.empty()) root += ", standby_bind: \"" + standby_bind + "\"";
  std::string y = example_with(0, root + "}");
  if (!federation.empty()) y += "federation: {" + federation + "}\n";
  return y;
}

TEST(Topology, StandbyAndReplicaKeysParse) {
  const Topology t = Topology::parse(standby_with("", "replica_every: 5"));
  EXPECT_TRUE(t.has_standby());
  EXPECT_EQ(t.root().standby_endpoint, "tcp://127.0.0.2:7000");
  EXPECT_EQ(t.root().standby_bind, "tcp://127.0.0.2:7000");  // defaults to standby_endpoint
  EXPECT_EQ(t.federation().replica_every, 5u);
  for (const NodeSpec& n : t.nodes()) {
    if (n.role == Role::kRoot) continue;
    EXPECT_TRUE(n.standby_endpoint.empty() && n.standby_bind.empty()) << n.id;
  }
  const Topology bound = Topology::parse(standby_with("tcp://*:7100"));
  EXPECT_EQ(bound.root().standby_bind, "tcp://*:7100");
  EXPECT_EQ(bound.federation().replica_every, 1u);
  EXPECT_EQ(Topology::parse(example_with(-1, "federation: {replica_every: 0}\n"))
                .federation()
                .replica_every,
            0u);  // never replicate

  const Topology old = Topology::parse(kExample);
  EXPECT_FALSE(old.has_standby());
  EXPECT_TRUE(old.root().standby_endpoint.empty());
  EXPECT_TRUE(old.root().standby_bind.empty());
  EXPECT_EQ(old.federation().replica_every, 1u);
  // ipc:// and inproc:// standbys are as valid as tcp:// ones.
  for (const char* e : {"ipc:///tmp/standby.sock", "inproc://standby"}) {
    EXPECT_EQ(error_of(example_with(0, R"({id: root, role: root, endpoint: "tcp://h:7000", )"
                                       R"(standby_endpoint: ")" +
                                           std::string(e) + "\"}")),
              "")
        << e;
  }
}

TEST(Topology, StandbyKeysRefusedWhereTheyDoNotApply) {
  const std::string region = R"({id: eu, role: region, parent: root, endpoint: "tcp://h:1", )";
  expect_error(example_with(1, region + R"(standby_endpoint: "tcp://h:11"})"),
               {"topo.yaml:4:", "node 'eu'", "'standby_endpoint' applies to the root only",
                "a region has no standby of its own"});
  expect_error(example_with(1, region + R"(standby_bind: "tcp://*:11"})"),
               {"node 'eu'", "'standby_bind' applies to the root only"});
  expect_error(
      example_with(2, R"({id: site-a, role: site, parent: eu, standby_endpoint: "tcp://h:3"})"),
      {"node 'site-a'", "'standby_endpoint' applies to the root only",
       "a site has no standby of its own"});

  const std::string root = R"({id: root, role: root, endpoint: "tcp://h:7000", )";
  expect_error(example_with(0, root + R"(standby_endpoint: "http://h:0"})"),
               {"node 'root'", "standby_endpoint 'http://h:0' is invalid", "tcp://"});
  expect_error(example_with(0, root + R"(standby_endpoint: "tcp://h 2:0"})"),
               {"node 'root'", "standby_endpoint 'tcp://h 2:0' is invalid"});
  expect_error(
      example_with(0, root + R"(standby_endpoint: "tcp://h2:7000", standby_bind: "tcp://"})"),
      {"node 'root'", "standby_bind 'tcp://' is invalid"});
  expect_error(example_with(0, root + R"(standby_endpoint: "tcp://h:7000"})"),
               {"node 'root'", "standby_endpoint 'tcp://h:7000' is the root's own endpoint",
                "endpoint of its own"});
  expect_error(example_with(0, root + R"(standby_bind: "tcp://*:7100"})"),
               {"node 'root'", "standby_bind 'tcp://*:7100' is given without standby_endpoint",
                "set standby_endpoint"});
  expect_error(example_with(0, root + "standby_endpoint: [tcp://h2:7000]}"),
               {"node 'root'", "'standby_endpoint' must be a string"});
  expect_error(example_with(0, root + R"(standby_endpoint: "tcp://h2:7000", )"
                                      R"(standby_endpoint: "tcp://h3:7000"})"),
               {"node 'root'", "'standby_endpoint' given twice"});

  // build() applies the same rules to hand-made nodes.
  const Topology t = Topology::parse(standby_with());
  auto build_error = [&](const std::function<void(std::vector<NodeSpec>&)>& edit) {
    std::vector<NodeSpec> n = t.nodes();
    edit(n);
    try {
      Topology::build(t.job(), t.federation(), n);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::vector<std::pair<std::function<void(std::vector<NodeSpec>&)>, std::string>> cases = {
      {[](auto& n) { n[1].standby_endpoint = "tcp://h:11"; },
       "<build>: node 'eu': 'standby_endpoint' applies to the root only"},
      {[](auto& n) { n[2].standby_bind = "tcp://*:12"; },
       "node 'site-a': 'standby_bind' applies to the root only"},
      {[](auto& n) { n[0].standby_endpoint = n[0].endpoint; }, "is the root's own endpoint"},
      {[](auto& n) { n[0].standby_endpoint.clear(); }, "given without standby_endpoint"},
      {[](auto& n) { n[0].standby_bind = "udp://*:1"; }, "standby_bind 'udp://*:1' is invalid"},
  };
  for (const auto& [edit, part] : cases) {
    std::string msg = build_error(edit);
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
  EXPECT_EQ(build_error([](auto&) {}), "");
  EXPECT_EQ(build_error([](auto& n) {  // removing the standby takes both fields
              n[0].standby_endpoint.clear();
              n[0].standby_bind.clear();
            }),
            "");
}

TEST(Topology, ReplicaEveryRejectsBadValues) {
  for (const char* v : {"-1", "2.5", "often", "[1]"}) {
    expect_error(example_with(-1, std::string("federation: {replica_every: ") + v + "}\n"),
                 {"federation", "'replica_every' must be a non-negative integer"});
  }
  expect_error(example_with(-1, "federation: {replica_every: 1, replica_every: 2}\n"),
               {"federation", "'replica_every' given twice"});
  expect_error(example_with(-1, "federation: {replica: 2}\n"),
               {"unknown key 'replica'", "replica_every"});
}

TEST(Topology, StandbyAndReplicaDigest) {
  // Absent or spelt out at their defaults, the new keys leave the digest as
  // it was before they existed (pinned in ResidencyDigest).
  const Topology old = Topology::parse(kExample);
  const Topology plain = Topology::parse(example_with(-1, ""));
  EXPECT_EQ(Topology::parse(example_with(-1, "federation: {replica_every: 1}\n")).digest(),
            plain.digest());
  EXPECT_EQ(old.to_yaml().find("standby"), std::string::npos);
  // A standby_bind equal to standby_endpoint is the default.
  EXPECT_EQ(Topology::parse(standby_with("tcp://127.0.0.2:7000")).digest(),
            Topology::parse(standby_with()).digest());

  const Topology base = Topology::parse(standby_with());
  using Edit = std::function<void(FederationSpec&, std::vector<NodeSpec>&)>;
  const std::vector<Edit> edits = {
      [](auto& f, auto&) { f.replica_every = 0; },
      [](auto& f, auto&) { f.replica_every = 2; },
      [](auto&, auto& n) { n[0].standby_endpoint = "tcp://127.0.0.3:7000"; },
      [](auto&, auto& n) { n[0].standby_bind = "tcp://*:7000"; },
      [](auto&, auto& n) {  // both changed together, bind still equal to the endpoint
        n[0].standby_endpoint = "ipc:///tmp/standby";
        n[0].standby_bind = "ipc:///tmp/standby";
      },
      [](auto&, auto& n) {
        n[0].standby_endpoint.clear();
        n[0].standby_bind.clear();
      },
  };
  std::set<std::string> digests = {base.digest_hex(), old.digest_hex()};
  for (size_t i = 0; i < edits.size(); ++i) {
    FederationSpec f = base.federation();
    std::vector<NodeSpec> n = base.nodes();
    edits[i](f, n);
    Topology t = Topology::build(base.job(), f, n);
    EXPECT_TRUE(digests.insert(t.digest_hex()).second)
        << "edit " << i << " left the digest unchanged";
    EXPECT_EQ(Topology::parse(t.to_yaml()).digest(), t.digest()) << "edit " << i;
  }
  // Removing the standby from base gives back a topology without one.
  std::vector<NodeSpec> n = base.nodes();
  n[0].standby_endpoint.clear();
  n[0].standby_bind.clear();
  EXPECT_EQ(Topology::build(base.job(), base.federation(), n).digest(), plain.digest());
}

TEST(Topology, StandbyAndReplicaToYamlRoundTrip) {
  const Topology t = Topology::parse(standby_with("tcp://*:7100", "replica_every: 3"));
  const std::string y = t.to_yaml();
  EXPECT_NE(y.find(R"(standby_endpoint: "tcp://127.0.0.2:7000", standby_bind: "tcp://*:7100")"),
            std::string::npos)
      << y;
  EXPECT_NE(y.find("  replica_every: 3\n"), std::string::npos) << y;
  const Topology back = Topology::parse(y);
  EXPECT_EQ(back.digest(), t.digest());
  EXPECT_EQ(back.to_yaml(), y);
  EXPECT_EQ(back.root().standby_endpoint, "tcp://127.0.0.2:7000");
  EXPECT_EQ(back.root().standby_bind, "tcp://*:7100");
  EXPECT_EQ(back.federation().replica_every, 3u);
  // A standby_bind equal to standby_endpoint is not written out.
  const std::string same = Topology::parse(standby_with()).to_yaml();
  EXPECT_EQ(same.find("standby_bind"), std::string::npos) << same;
  EXPECT_EQ(Topology::parse(same).root().standby_bind, "tcp://127.0.0.2:7000");
}

TEST(Topology, RoleNames) {
  EXPECT_STREQ(role_name(Role::kRoot), "root");
  EXPECT_STREQ(role_name(Role::kRegion), "region");
  EXPECT_STREQ(role_name(Role::kSite), "site");
  EXPECT_STREQ(role_name(static_cast<Role>(9)), "unknown");
}

}  // namespace
}  // namespace fedwan
