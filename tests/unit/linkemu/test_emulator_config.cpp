#include <gtest/gtest.h>

#include "emulator.hpp"

namespace fedwan::linkemu {
namespace {

nlohmann::json two_hosts() {
  return nlohmann::json::parse(R"({
    "hosts": [{"name": "site", "netns": "ns-site", "address": "10.77.0.2"},
              {"name": "root", "netns": "ns-root", "address": "10.77.0.1"}],
    "links": [{"a": "site", "b": "root",
               "profile": {"rate_mbit": 200, "delay_ms": 40, "loss_percent": 0.1},
               "b_to_a": {"rate_mbit": 1000}}]})");
}

std::string error_of(const nlohmann::json& j) {
  try {
    config_from_json(j);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(EmulatorConfig, ADirectionOverridesOnlyTheKeysItNames) {
  const EmulatorConfig c = config_from_json(two_hosts());
  ASSERT_EQ(c.hosts.size(), 2u);
  ASSERT_EQ(c.links.size(), 1u);
  const LinkConfig& l = c.links[0];
  EXPECT_DOUBLE_EQ(l.a_to_b.rate_bps, 200e6);
  EXPECT_DOUBLE_EQ(l.b_to_a.rate_bps, 1000e6);
  EXPECT_DOUBLE_EQ(l.b_to_a.delay_s, 0.04);
  EXPECT_DOUBLE_EQ(l.b_to_a.loss, 0.001);
}

TEST(EmulatorConfig, RefusesWhatWouldBeIgnoredOrAmbiguous) {
  nlohmann::json j = two_hosts();
  j["links"][0]["profile"]["delay"] = 5;
  EXPECT_NE(error_of(j).find("unknown link profile key 'delay'"), std::string::npos);
  j = two_hosts();
  j["links"][0]["b"] = "region";
  EXPECT_NE(error_of(j).find("no host 'region'"), std::string::npos);
  j = two_hosts();
  j["links"].push_back({{"a", "root"}, {"b", "site"}});
  EXPECT_NE(error_of(j).find("listed twice"), std::string::npos);
  j = two_hosts();
  j["hosts"][1]["address"] = "10.77.0.2";
  EXPECT_NE(error_of(j).find("used twice"), std::string::npos);
  j = two_hosts();
  j["links"][0]["profile"]["jitter_ms"] = 50;  // more than the delay
  EXPECT_NE(error_of(j).find("jitter"), std::string::npos);
  j = two_hosts();
  j["links"][0]["profile"]["loss_percent"] = 100;
  EXPECT_NE(error_of(j).find("loss_percent"), std::string::npos);
  j = two_hosts();
  j["speed"] = 1;
  EXPECT_NE(error_of(j).find("unknown configuration key 'speed'"), std::string::npos);
  j = two_hosts();
  j["hosts"][0]["address"] = "10.77.0";
  EXPECT_NE(error_of(j).find("IPv4"), std::string::npos);
}

TEST(EmulatorConfig, AProfileReadsBackAsItWasWritten) {
  const LinkProfile p = config_from_json(two_hosts()).links[0].a_to_b;
  const LinkProfile q = profile_from_json(profile_to_json(p));
  EXPECT_DOUBLE_EQ(q.rate_bps, p.rate_bps);
  EXPECT_DOUBLE_EQ(q.delay_s, p.delay_s);
  EXPECT_DOUBLE_EQ(q.loss, p.loss);
  EXPECT_EQ(q.effective_queue_bytes(), p.effective_queue_bytes());
}

// site -> region -> root, and a path for the site to the root over both.
nlohmann::json relayed() {
  return nlohmann::json::parse(R"({
    "hosts": [{"name": "site", "netns": "ns-site", "address": "10.77.0.3"},
              {"name": "region", "netns": "ns-region", "address": "10.77.0.2"},
              {"name": "root", "netns": "ns-root", "address": "10.77.0.1"}],
    "links": [{"a": "site", "b": "region", "profile": {"rate_mbit": 1000, "delay_ms": 2}},
              {"a": "region", "b": "root", "profile": {"rate_mbit": 200, "delay_ms": 40}}],
    "paths": [{"from": "site", "to": "root", "via": ["region"]}]})");
}

TEST(EmulatorConfig, APathCrossesExistingLinksBetweenHostsWithoutOne) {
  const EmulatorConfig c = config_from_json(relayed());
  ASSERT_EQ(c.paths.size(), 1u);
  EXPECT_EQ(c.paths[0].from, "site");
  EXPECT_EQ(c.paths[0].to, "root");
  EXPECT_EQ(c.paths[0].via, std::vector<std::string>{"region"});
  // Without paths, a configuration reads as before.
  EXPECT_TRUE(config_from_json(two_hosts()).paths.empty());

  const auto refused = [](const nlohmann::json& j, const std::string& why) {
    const std::string e = error_of(j);
    EXPECT_NE(e.find(why), std::string::npos) << "'" << why << "' not in: " << e;
  };
  nlohmann::json j = relayed();
  j["paths"][0]["via"] = nlohmann::json::array();
  refused(j, "path site -> root: via names no host");
  j = relayed();
  j["paths"][0]["via"] = {"nowhere"};
  refused(j, "no host 'nowhere'");
  j = relayed();
  j["links"].erase(1);
  refused(j, "path site -> root: no link region <-> root");
  j = relayed();
  j["paths"].push_back({{"from", "root"}, {"to", "site"}, {"via", {"region"}}});
  refused(j, "listed twice (each path serves both directions)");
  j = relayed();
  j["links"].push_back({{"a", "site"}, {"b", "root"}});
  refused(j, "the two hosts have a link of their own");
  j = relayed();
  j["paths"][0]["via"] = {"region", "site"};
  refused(j, "visits 'site' twice");
  j = relayed();
  j["paths"][0]["hops"] = 2;
  refused(j, "unknown key 'hops'");
  j = relayed();
  j["paths"] = {{"from", "site"}};
  refused(j, "paths must be a list");
}

}  // namespace
}  // namespace fedwan::linkemu
