// Topology residency policy: jurisdictions, allowed_jurisdictions and k_min,
// how parsing refuses bad values and trees that break them, the refusal at
// run time, and their place in the digest and the YAML round trip.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "topology_test_util.hpp"

namespace fedwan {
namespace {

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

}  // namespace
}  // namespace fedwan
