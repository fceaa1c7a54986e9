// MetricsServer's limits (metrics/metrics_server.hpp) over loopback TCP:
// clients that hold connections open cannot keep a scraper out, and a
// token-guarded endpoint answers only those that present the token.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness/http_test_client.hpp"
#include "metrics/metrics_server.hpp"

namespace fedwan::metrics {
namespace {

using namespace std::chrono_literals;
using testing::has_status;
using testing::HttpTestClient;

const std::string kKeepAlive = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
const std::string kOnce = "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

MetricsServer::Options options() {
  MetricsServer::Options o;
  o.metrics = [] { return std::string("fedwan_up 1\n"); };
  o.status = [] { return std::string("{\"node\":\"n\"}"); };
  return o;
}

// A client that holds a connection to the server and sends a request every
// 100 ms to 3 s on it, reading each answer; when the server closes it, it
// connects again at once. What 16 of them did to the old server: no slot
// was ever free for anyone else.
class Hammer {
 public:
  Hammer(uint16_t port, std::string source, unsigned seed)
      : port_(port), source_(std::move(source)), thread_([this, seed] { run(seed); }) {}
  ~Hammer() {
    stop_ = true;
    thread_.join();
  }
  bool served_once() const { return served_ > 0; }

 private:
  void run(unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> pause_ms(100, 3000);
    std::unique_ptr<HttpTestClient> c;
    while (!stop_) {
      if (!c) c = std::make_unique<HttpTestClient>(port_, source_, 2s);
      if (!c->send(kKeepAlive) || !has_status(c->read_response(), "200")) {
        c.reset();  // closed on us: straight back
        continue;
      }
      ++served_;
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(pause_ms(rng));
      while (!stop_ && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    }
  }

  uint16_t port_;
  std::string source_;
  std::atomic<bool> stop_{false};
  std::atomic<int> served_{0};
  std::thread thread_;
};

// The acceptance test of the eviction: 16 keep-alive clients (from 16
// addresses, so the per-source limit is not what saves the day) hold every
// slot of a server with the default limits; a scraper on a new connection
// is still answered within 1 s, every time.
TEST(MetricsServerLimits, HammeredByKeepAliveClientsAScraperIsStillAnswered) {
  MetricsServer server(options());
  const MetricsServer::Options defaults;
  ASSERT_EQ(defaults.max_connections, 16u);
  std::vector<std::unique_ptr<Hammer>> hammers;
  for (unsigned i = 0; i < 16; ++i) {
    hammers.push_back(
        std::make_unique<Hammer>(server.port(), "127.0.0." + std::to_string(10 + i), i));
  }
  for (int i = 0; i < 500; ++i) {
    bool all = true;
    for (const auto& h : hammers) all = all && h->served_once();
    if (all) break;
    std::this_thread::sleep_for(10ms);
  }
  int answered = 0;
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    HttpTestClient scraper(server.port(), "127.0.0.200", 1s);
    const bool sent = scraper.connected() && scraper.send(kOnce);
    const std::string r = sent ? scraper.read_all() : std::string();
    const auto took = std::chrono::steady_clock::now() - start;
    if (has_status(r, "200") && took < 1s) {
      ++answered;
    } else {
      ADD_FAILURE() << "attempt " << i << ": no answer within 1 s: '" << r << "'";
    }
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(answered, 20);
}

TEST(MetricsServerLimits, AConnectionServesAtMostItsRequests) {
  auto o = options();
  o.max_requests_per_connection = 3;
  MetricsServer server(o);
  HttpTestClient c(server.port());
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(c.send(kKeepAlive));
    const std::string r = c.read_response();
    ASSERT_TRUE(has_status(r, "200")) << i << ": " << r;
    EXPECT_EQ(r.find("Connection: close") != std::string::npos, i == 3) << i << ": " << r;
  }
  bool closed = false;
  EXPECT_EQ(c.read_all(&closed), "");
  EXPECT_TRUE(closed) << "served past max_requests_per_connection";
}

TEST(MetricsServerLimits, AnIdleKeptAliveConnectionIsClosedAfterTheIdleLimit) {
  auto o = options();
  o.io_timeout = 30s;
  o.idle_timeout = 200ms;
  MetricsServer server(o);
  HttpTestClient c(server.port());
  ASSERT_TRUE(c.send(kKeepAlive));
  ASSERT_TRUE(has_status(c.read_response(), "200"));
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  EXPECT_EQ(c.read_all(&closed), "");
  EXPECT_TRUE(closed);
  // Closed by the idle limit, not the 30 s io_timeout (nor the 10 s guard).
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(MetricsServerLimits, AConnectionIsNotKeptAlivePastItsAge) {
  auto o = options();
  o.io_timeout = 30s;
  o.idle_timeout = 30s;
  o.max_connection_age = 300ms;
  MetricsServer server(o);
  HttpTestClient c(server.port());
  ASSERT_TRUE(c.send(kKeepAlive));
  ASSERT_TRUE(has_status(c.read_response(), "200"));
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  EXPECT_EQ(c.read_all(&closed), "");
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(MetricsServerLimits, ASourceOverItsLimitPushesOutItsOwnIdlestConnection) {
  auto o = options();
  o.io_timeout = 30s;
  o.idle_timeout = 30s;
  o.max_connections_per_source = 2;
  MetricsServer server(o);
  HttpTestClient other(server.port(), "127.0.0.2");
  ASSERT_TRUE(other.send(kKeepAlive));
  ASSERT_TRUE(has_status(other.read_response(), "200"));
  std::this_thread::sleep_for(20ms);
  HttpTestClient a(server.port(), "127.0.0.3");
  ASSERT_TRUE(a.send(kKeepAlive));
  ASSERT_TRUE(has_status(a.read_response(), "200"));
  std::this_thread::sleep_for(20ms);
  HttpTestClient b(server.port(), "127.0.0.3");
  ASSERT_TRUE(b.send(kKeepAlive));
  ASSERT_TRUE(has_status(b.read_response(), "200"));
  // A third from 127.0.0.3: served, and a, that source's idlest, closed;
  // `other`, idle longer but from another address, kept.
  HttpTestClient c(server.port(), "127.0.0.3");
  ASSERT_TRUE(c.send(kKeepAlive));
  EXPECT_TRUE(has_status(c.read_response(), "200"));
  bool closed = false;
  EXPECT_EQ(a.read_all(&closed), "");
  EXPECT_TRUE(closed) << "the source's idlest connection was kept";
  for (HttpTestClient* kept : {&other, &b, &c}) {
    ASSERT_TRUE(kept->send(kKeepAlive));
    EXPECT_TRUE(has_status(kept->read_response(), "200"));
  }
}

TEST(MetricsServerLimits, ATokenIsRequiredWhenConfigured) {
  auto o = options();
  o.bearer_token = "s3cret-token-0123456789";
  MetricsServer server(o);
  const auto ask = [&](const std::string& auth) {
    HttpTestClient c(server.port());
    c.send("GET /metrics HTTP/1.1\r\nHost: x\r\n" + auth + "Connection: close\r\n\r\n");
    return c.read_all();
  };
  const std::string none = ask("");
  EXPECT_TRUE(has_status(none, "401")) << none;
  EXPECT_NE(none.find("WWW-Authenticate: Bearer"), std::string::npos) << none;
  EXPECT_EQ(none.find("fedwan_up"), std::string::npos) << none;
  for (const char* wrong :
       {"Authorization: Bearer s3cret-token-0123456788\r\n",
        "Authorization: Bearer s3cret-token-012345678\r\n", "Authorization: Bearer \r\n",
        "Authorization: Basic czNjcmV0\r\n", "Authorization: s3cret-token-0123456789\r\n"}) {
    const std::string r = ask(wrong);
    EXPECT_TRUE(has_status(r, "401")) << wrong << r;
  }
  const std::string right = ask("Authorization: Bearer s3cret-token-0123456789\r\n");
  EXPECT_TRUE(has_status(right, "200")) << right;
  EXPECT_NE(right.find("fedwan_up 1"), std::string::npos) << right;
  EXPECT_TRUE(has_status(ask("authorization: bearer s3cret-token-0123456789\r\n"), "200"));
  // /status too, and a wrong path says nothing before the token.
  HttpTestClient s(server.port());
  s.send("GET /status HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(has_status(s.read_all(), "401"));
  HttpTestClient n(server.port());
  n.send("GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(has_status(n.read_all(), "401"));
}

}  // namespace
}  // namespace fedwan::metrics
