#include <gtest/gtest.h>

#include "security/authorization.hpp"

namespace fedwan::security {
namespace {

const char* kYaml = R"(job: auth
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000"}
  - {id: eu, role: region, parent: root, jurisdiction: EU, endpoint: "tcp://127.0.0.1:7001"}
  - {id: us, role: region, parent: root, jurisdiction: US, endpoint: "tcp://127.0.0.1:7002"}
  - {id: eu-a, role: site, parent: eu, allowed_jurisdictions: [EU]}
  - {id: us-a, role: site, parent: us}
)";

security::NodeIdentity id(const std::string& node, Role role, const std::string& region,
                          const std::string& job = "auth") {
  return {node, role, region, job};
}

std::string why(const std::optional<std::string>& r) { return r ? *r : std::string("accepted"); }

TEST(Authorization, ChildMustMatchTheTopology) {
  const Topology t = Topology::parse(kYaml);
  const NodeSpec& eu = t.node("eu");
  EXPECT_EQ(authorize_child(t, eu, id("eu-a", Role::kSite, "eu"), "eu-a"), std::nullopt);
  EXPECT_NE(
      why(authorize_child(t, eu, id("eu-a", Role::kSite, "eu"), "us-a")).find("node id mismatch"),
      std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("eu-a", Role::kSite, "eu", "other"), "eu-a"))
                .find("job 'other'"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("eu-a", Role::kRegion, "eu-a"), "eu-a"))
                .find("gives role 'region'"),
            std::string::npos);
  EXPECT_NE(
      why(authorize_child(t, eu, id("eu-a", Role::kSite, "us"), "eu-a")).find("names region 'us'"),
      std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("us-a", Role::kSite, "us"), "us-a"))
                .find("reports to 'us', not to 'eu'"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("ghost", Role::kSite, "eu"), "ghost")).find("not a node"),
            std::string::npos);
  const NodeSpec& root = t.node("root");
  EXPECT_EQ(authorize_child(t, root, id("eu", Role::kRegion, "eu"), "eu"), std::nullopt);
  EXPECT_NE(why(authorize_child(t, root, id("eu-a", Role::kSite, "eu"), "eu-a"))
                .find("may send its delta only to [EU]"),
            std::string::npos);
}

TEST(Authorization, ParentMustBeOwnAndAllowed) {
  const Topology t = Topology::parse(kYaml);
  EXPECT_EQ(authorize_parent(t, t.node("eu-a"), id("eu", Role::kRegion, "eu")), std::nullopt);
  EXPECT_EQ(authorize_parent(t, t.node("eu"), id("root", Role::kRoot, "")), std::nullopt);
  const std::string wrong = why(authorize_parent(t, t.node("eu-a"), id("us", Role::kRegion, "us")));
  EXPECT_NE(wrong.find("reports to 'eu'"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("residency"), std::string::npos) << wrong;
  EXPECT_NE(why(authorize_parent(t, t.node("eu-a"), id("eu", Role::kSite, "eu")))
                .find("gives role 'site'"),
            std::string::npos);
  EXPECT_NE(
      why(authorize_parent(t, t.node("root"), id("eu", Role::kRegion, "eu"))).find("no parent"),
      std::string::npos);
}

// The same federation with a standby root: a second process that runs as
// node "root" with the root's credentials.
const char* kStandbyYaml = R"(job: auth
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000", standby_endpoint: "tcp://127.0.0.2:7000"}
  - {id: eu, role: region, parent: root, jurisdiction: EU, endpoint: "tcp://127.0.0.1:7001"}
  - {id: us, role: region, parent: root, jurisdiction: US, endpoint: "tcp://127.0.0.1:7002"}
  - {id: eu-a, role: site, parent: eu, allowed_jurisdictions: [EU]}
  - {id: us-a, role: site, parent: us}
  - {id: solo, role: site, parent: root}
)";

TEST(Authorization, StandbyAcceptsTheActiveRootAsChild) {
  const Topology t = Topology::parse(kStandbyYaml);
  ASSERT_TRUE(t.has_standby());
  const NodeSpec& root = t.root();
  // The active root connects to its standby to stream its checkpoints.
  EXPECT_EQ(authorize_child(t, root, id("root", Role::kRoot, ""), "root"), std::nullopt);
  // ... but only with a certificate that is exactly the root's.
  EXPECT_NE(why(authorize_child(t, root, id("root", Role::kRegion, "root"), "root"))
                .find("gives role 'region'"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, root, id("root", Role::kRoot, "eu"), "root"))
                .find("names region 'eu'"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, root, id("root", Role::kRoot, "", "other"), "root"))
                .find("job 'other'"),
            std::string::npos);
  EXPECT_NE(
      why(authorize_child(t, root, id("root", Role::kRoot, ""), "eu")).find("node id mismatch"),
      std::string::npos);
  EXPECT_NE(
      why(authorize_child(t, root, id("eu", Role::kRoot, ""), "eu")).find("gives role 'root'"),
      std::string::npos);
  // Its ordinary children are checked as before.
  EXPECT_EQ(authorize_child(t, root, id("eu", Role::kRegion, "eu"), "eu"), std::nullopt);
  EXPECT_EQ(authorize_child(t, root, id("solo", Role::kSite, "root"), "solo"), std::nullopt);
}

TEST(Authorization, RootPeerRefusedAsChildElsewhere) {
  // Without a standby nothing connects to the root as the root.
  const Topology plain = Topology::parse(kYaml);
  const std::string no_standby =
      why(authorize_child(plain, plain.root(), id("root", Role::kRoot, ""), "root"));
  EXPECT_NE(no_standby.find("'root' is the root; it has no parent to connect to"),
            std::string::npos)
      << no_standby;
  EXPECT_NE(no_standby.find("no standby_endpoint"), std::string::npos) << no_standby;
  // A region or site never takes the root as a child, standby or not.
  for (const Topology& t : {plain, Topology::parse(kStandbyYaml)}) {
    const std::string at_region =
        why(authorize_child(t, t.node("eu"), id("root", Role::kRoot, ""), "root"));
    EXPECT_NE(at_region.find("'root' is the root; it has no parent to connect to"),
              std::string::npos)
        << at_region;
    EXPECT_EQ(at_region.find("standby"), std::string::npos) << at_region;
  }
}

TEST(Authorization, RootAcceptsItsStandbyAsParent) {
  const Topology t = Topology::parse(kStandbyYaml);
  const NodeSpec& root = t.root();
  EXPECT_EQ(authorize_parent(t, root, id("root", Role::kRoot, "")), std::nullopt);
  const std::string other = why(authorize_parent(t, root, id("eu", Role::kRegion, "eu")));
  EXPECT_NE(other.find("the standby at tcp://127.0.0.2:7000 presents a certificate for 'eu'"),
            std::string::npos)
      << other;
  EXPECT_NE(
      why(authorize_parent(t, root, id("root", Role::kRegion, "root"))).find("gives role 'region'"),
      std::string::npos);
  EXPECT_NE(
      why(authorize_parent(t, root, id("root", Role::kRoot, "", "other"))).find("job 'other'"),
      std::string::npos);
  // Without a standby the root has no upstream peer at all.
  const Topology plain = Topology::parse(kYaml);
  EXPECT_EQ(why(authorize_parent(plain, plain.root(), id("root", Role::kRoot, ""))),
            "the root has no parent");
}

TEST(Authorization, ChildrenOfTheRootAcceptTheStandby) {
  // The standby presents the root's identity, so a region or site under the
  // root that fails over to the standby endpoint accepts it as its parent,
  // and nobody else's certificate.
  const Topology t = Topology::parse(kStandbyYaml);
  EXPECT_EQ(authorize_parent(t, t.node("eu"), id("root", Role::kRoot, "")), std::nullopt);
  EXPECT_EQ(authorize_parent(t, t.node("solo"), id("root", Role::kRoot, "")), std::nullopt);
  EXPECT_NE(why(authorize_parent(t, t.node("eu"), id("us", Role::kRegion, "us")))
                .find("reports to 'root'"),
            std::string::npos);
  // A site under a region keeps its region as its only parent.
  EXPECT_NE(
      why(authorize_parent(t, t.node("eu-a"), id("root", Role::kRoot, ""))).find("reports to 'eu'"),
      std::string::npos);
}

}  // namespace
}  // namespace fedwan::security
