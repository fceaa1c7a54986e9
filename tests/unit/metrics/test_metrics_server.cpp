// MetricsServer (metrics/metrics_server.hpp) over loopback TCP, with a plain
// POSIX socket client: what a Prometheus scrape gets, and what a broken or
// hostile client cannot do to it.
#include "metrics/metrics_server.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "fedwan/error.hpp"
#include "harness/http_test_client.hpp"
#include "metrics/metrics_registry.hpp"

namespace fedwan::metrics {
namespace {

using namespace std::chrono_literals;

using Client = testing::HttpTestClient;

std::string get(uint16_t port, const std::string& request) {
  Client c(port);
  c.send(request);
  return c.read_all();
}

std::string body_of(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

MetricsServer::Options options_for(MetricsRegistry* registry) {
  MetricsServer::Options o;
  o.metrics = [registry] { return registry->render(); };
  return o;
}

TEST(MetricsServer, ServesTheRenderedRegistry) {
  MetricsRegistry registry;
  registry.counter("fedwan_frames_total", "Frames.", {"kind"}).with({"data"}).add(3);
  MetricsServer server(options_for(&registry));
  ASSERT_NE(server.port(), 0);
  const std::string r =
      get(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), std::string::npos)
      << r;
  EXPECT_EQ(body_of(r), registry.render());
  // A query string does not change the path.
  EXPECT_EQ(get(server.port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 200", 0), 0u);
}

TEST(MetricsServer, KeepAliveServesSeveralRequests) {
  MetricsRegistry registry;
  auto& c = registry.counter("fedwan_scrapes_total", "Scrapes.").get();
  auto o = options_for(&registry);
  o.metrics = [&registry, &c] {
    c.inc();
    return registry.render();
  };
  MetricsServer server(o);
  Client client(server.port());
  client.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(client.read_response().find("fedwan_scrapes_total 1\n"), std::string::npos);
  client.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(client.read_response().find("fedwan_scrapes_total 2\n"), std::string::npos);
}

TEST(MetricsServer, StatusAndUnknownPathsAndMethods) {
  MetricsRegistry registry;
  auto o = options_for(&registry);
  MetricsServer no_status(o);
  EXPECT_EQ(get(no_status.port(), "GET /status HTTP/1.1\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 404", 0),
            0u);
  o.status = [] { return std::string("{\"round\":4}"); };
  MetricsServer server(o);
  const std::string s = get(server.port(), "GET /status HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(s.rfind("HTTP/1.1 200", 0), 0u) << s;
  EXPECT_NE(s.find("Content-Type: application/json\r\n"), std::string::npos) << s;
  EXPECT_EQ(body_of(s), "{\"round\":4}");
  EXPECT_EQ(get(server.port(), "GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 404", 0),
            0u);
  const std::string post = get(
      server.port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET\r\n"), std::string::npos) << post;
  EXPECT_EQ(get(server.port(), "DELETE /status HTTP/1.1\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 405", 0),
            0u);
}

TEST(MetricsServer, MalformedRequestsAreRefusedAndTheServerLivesOn) {
  MetricsRegistry registry;
  MetricsServer server(options_for(&registry));
  const auto refused = [](const std::string& r, const char* status) {
    return r.empty() || r.rfind(std::string("HTTP/1.1 ") + status, 0) == 0;
  };
  for (const std::string& bad :
       {std::string("GARBAGE\r\n\r\n"), std::string("\x01\x02\xff\r\n\r\n"),
        std::string("GET /metrics HTTP/1.1\r\nBad Header\r\n\r\n"),
        std::string("GET /metrics HTTP/1.1\r\nContent-Length: x\r\n\r\n")}) {
    const std::string r = get(server.port(), bad);
    EXPECT_TRUE(refused(r, "400")) << r;
  }
  // A body: refused, not read.
  const std::string body =
      get(server.port(), "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_TRUE(refused(body, "413")) << body;
  // Headers past 8 KiB.
  const std::string huge =
      get(server.port(), "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(16384, 'a') + "\r\n\r\n");
  EXPECT_TRUE(refused(huge, "431")) << huge;
  EXPECT_EQ(get(server.port(), "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 200", 0),
            0u);
}

TEST(MetricsServer, ACallbackThatThrowsGets500) {
  MetricsServer::Options o;
  o.metrics = []() -> std::string { throw std::runtime_error("registry gone"); };
  MetricsServer server(o);
  EXPECT_EQ(get(server.port(), "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 500", 0), 0u);
}

TEST(MetricsServer, ASilentClientIsDroppedWithoutBlockingOthers) {
  MetricsRegistry registry;
  auto o = options_for(&registry);
  o.io_timeout = 300ms;
  MetricsServer server(o);
  Client silent(server.port());
  ASSERT_TRUE(silent.connected());
  Client half(server.port());
  half.send("GET /metrics HTTP/1.1\r\nHo");  // slowloris: never finishes
  EXPECT_EQ(get(server.port(), "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 200", 0),
            0u);
  bool closed = false;
  EXPECT_EQ(silent.read_all(&closed), "");
  EXPECT_TRUE(closed) << "the server kept a silent connection past its timeout";
  half.read_all(&closed);
  EXPECT_TRUE(closed) << "the server kept a half-sent request past its timeout";
}

TEST(MetricsServer, AFullServerClosesTheLongestIdleConnectionForANewcomer) {
  MetricsRegistry registry;
  auto o = options_for(&registry);
  o.max_connections = 2;
  o.io_timeout = 30s;
  o.idle_timeout = 30s;
  MetricsServer server(o);
  Client first(server.port()), second(server.port());
  // Served, so both are now idle: the first the longer.
  first.send("GET /metrics HTTP/1.1\r\n\r\n");
  ASSERT_EQ(first.read_response().rfind("HTTP/1.1 200", 0), 0u);
  std::this_thread::sleep_for(20ms);
  second.send("GET /metrics HTTP/1.1\r\n\r\n");
  ASSERT_EQ(second.read_response().rfind("HTTP/1.1 200", 0), 0u);
  // The newcomer is served, not refused.
  EXPECT_EQ(get(server.port(), "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 200", 0),
            0u);
  bool closed = false;
  EXPECT_EQ(first.read_all(&closed), "");
  EXPECT_TRUE(closed) << "the longest idle connection was kept";
  // The other one was left alone (the newcomer, gone, made room again).
  second.send("GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(second.read_response().rfind("HTTP/1.1 200", 0), 0u);
}

TEST(MetricsServer, StopReturnsPromptlyWithConnectionsOpen) {
  MetricsRegistry registry;
  auto o = options_for(&registry);
  o.io_timeout = 60s;
  auto server = std::make_unique<MetricsServer>(o);
  const uint16_t port = server->port();
  Client idle(port);
  idle.send("GET /metrics HTTP/1.1\r\n\r\n");
  ASSERT_EQ(idle.read_response().rfind("HTTP/1.1 200", 0), 0u);  // now kept alive
  Client silent(port);
  auto stopped = std::async(std::launch::async, [&] { server->stop(); });
  ASSERT_EQ(stopped.wait_for(10s), std::future_status::ready) << "stop() hung";
  bool closed = false;
  idle.read_all(&closed);
  EXPECT_TRUE(closed) << "stop() left a connection open";
  server->stop();  // again: nothing to do
  server.reset();
  EXPECT_FALSE(Client(port).connected()) << "still listening after stop()";
}

TEST(MetricsServer, BadAddressesThrowNamingTheAddress) {
  MetricsRegistry registry;
  auto o = options_for(&registry);
  for (const char* bad :
       {"nonsense", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:http", "::1:80", ":9464"}) {
    o.bind = bad;
    try {
      MetricsServer server(o);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  o.bind = "127.0.0.1:0";
  MetricsServer first(o);
  o.bind = "127.0.0.1:" + std::to_string(first.port());
  try {
    MetricsServer second(o);
    ADD_FAILURE() << "bound a port already in use";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find(o.bind), std::string::npos) << e.what();
  }
  MetricsServer::Options none;
  EXPECT_THROW(MetricsServer{none}, ConfigError);
  o.bind = "[::1]:0";  // IPv6 loopback, where the machine has one
  try {
    MetricsServer v6(o);
    EXPECT_NE(v6.port(), 0);
  } catch (const TransportError&) {
  }
}

}  // namespace
}  // namespace fedwan::metrics
