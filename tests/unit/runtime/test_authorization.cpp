#include <gtest/gtest.h>

#include "runtime/authorization.hpp"

namespace fedwan::runtime {
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
  EXPECT_NE(why(authorize_child(t, eu, id("eu-a", Role::kSite, "eu"), "us-a"))
                .find("node id mismatch"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("eu-a", Role::kSite, "eu", "other"), "eu-a"))
                .find("job 'other'"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("eu-a", Role::kRegion, "eu-a"), "eu-a"))
                .find("gives role 'region'"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("eu-a", Role::kSite, "us"), "eu-a"))
                .find("names region 'us'"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("us-a", Role::kSite, "us"), "us-a"))
                .find("reports to 'us', not to 'eu'"),
            std::string::npos);
  EXPECT_NE(why(authorize_child(t, eu, id("ghost", Role::kSite, "eu"), "ghost"))
                .find("not a node"),
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
  EXPECT_NE(why(authorize_parent(t, t.node("root"), id("eu", Role::kRegion, "eu")))
                .find("no parent"),
            std::string::npos);
}

}  // namespace
}  // namespace fedwan::runtime
