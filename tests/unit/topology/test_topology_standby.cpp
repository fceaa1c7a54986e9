// Topology standby root and checkpoint replication: the standby and
// replica_every keys, where they are refused, and their place in the digest
// and the YAML round trip.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "topology_test_util.hpp"

namespace fedwan {
namespace {

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

}  // namespace
}  // namespace fedwan
