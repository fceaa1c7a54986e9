// NodeMetrics (node/node_metrics.hpp): the families every node serves, over
// a real loopback server, and the helpers both roles use.
#include "node/node_metrics.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>

#include "metrics/http_get.hpp"

namespace fedwan::node {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

NodeMetrics::Options options() {
  NodeMetrics::Options o;
  o.bind = "127.0.0.1:0";
  o.node = "site-0";
  o.role = "site";
  o.job = "job-a";
  o.log_tag = "site:site-0";
  return o;
}

std::string get(const NodeMetrics& m, const std::string& path) {
  const metrics::HttpResponse r =
      metrics::http_get("127.0.0.1:" + std::to_string(m.port()), path, 5s);
  EXPECT_EQ(r.status, 200) << r.error;
  return r.body;
}

TEST(NodeMetrics, NoAddressServesNothing) {
  NodeMetrics::Options o = options();
  o.bind.clear();
  EXPECT_EQ(NodeMetrics::start(o), nullptr);
}

TEST(NodeMetrics, ServesTheSharedFamiliesAndTheStatus) {
  std::unique_ptr<NodeMetrics> m = NodeMetrics::start(options());
  ASSERT_NE(m, nullptr);
  const auto now = Clock::now();
  m->round(3);
  m->link_bytes("region-0", 1000, 250);
  EXPECT_NEAR(m->parent_last_seen(now - 2s, now), 2.0, 1e-6);
  EXPECT_NEAR(m->checkpoints(now - 5s, 4, now), 5.0, 1e-6);
  m->publish_status(R"({"node":"site-0"})");
  const std::string text = get(*m, "/metrics");
  EXPECT_NE(text.find(R"(fedwan_info{node="site-0",role="site",federation="job-a"} 1)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(fedwan_round{node="site-0"} 3)"), std::string::npos) << text;
  // Declared before the first round completes: a dashboard sees 0, not nothing.
  EXPECT_NE(text.find(R"(fedwan_rounds_total{node="site-0"} 0)"), std::string::npos) << text;
  EXPECT_NE(
      text.find(R"(fedwan_link_bytes_total{node="site-0",peer="region-0",direction="sent"} 1000)"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find(
          R"(fedwan_link_bytes_total{node="site-0",peer="region-0",direction="received"} 250)"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(fedwan_checkpoints_total{node="site-0"} 4)"), std::string::npos) << text;
  EXPECT_EQ(get(*m, "/status"), R"({"node":"site-0"})");
  m->round_completed();
  EXPECT_NE(get(*m, "/metrics").find(R"(fedwan_rounds_total{node="site-0"} 1)"), std::string::npos);
}

TEST(NodeMetrics, CountersFollowRunningTotalsAndNeverGoDown) {
  std::unique_ptr<NodeMetrics> m = NodeMetrics::start(options());
  ASSERT_NE(m, nullptr);
  m->link_bytes("region-0", 500, 0);
  // A replaced link starts its count from zero: the counter keeps its value.
  m->link_bytes("region-0", 20, 0);
  m->link_bytes("region-0", 700, 0);
  EXPECT_NE(
      get(*m, "/metrics")
          .find(R"(fedwan_link_bytes_total{node="site-0",peer="region-0",direction="sent"} 700)"),
      std::string::npos);
}

TEST(NodeMetrics, NeverHeardAndNeverWrittenAreNaN) {
  std::unique_ptr<NodeMetrics> m = NodeMetrics::start(options());
  ASSERT_NE(m, nullptr);
  const auto now = Clock::now();
  EXPECT_TRUE(std::isnan(m->parent_last_seen(Clock::time_point{}, now)));
  EXPECT_TRUE(std::isnan(m->checkpoints(std::nullopt, 0, now)));
  EXPECT_TRUE(std::isnan(seconds_since(std::nullopt, now)));
  EXPECT_NEAR(seconds_since(now - 1500ms, now), 1.5, 1e-6);
}

TEST(NodeMetrics, AnUnreadableTokenFileIsAnError) {
  NodeMetrics::Options o = options();
  o.token_file = "/nonexistent/fedwan-token";
  EXPECT_ANY_THROW(NodeMetrics::start(o));
}

}  // namespace
}  // namespace fedwan::node
