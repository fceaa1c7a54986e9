// The smaller findings of the security review, each tried the way a peer,
// an operator or an attacker would: text a peer chooses in the logs, a
// forged refusal during a site's first handshake, oversized input files,
// numeric options out of range, and the demo's working directory.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <zmq.hpp>

#include "harness/federation_fixture.hpp"
#include "harness/node_threads.hpp"
#include "harness/process.hpp"
#include "harness/raw_site.hpp"
#include "harness/reference_federation.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 29;
constexpr size_t kParams = 3000;

#ifdef FEDWAN_CLI_PATH

struct CliRun {
  int code = -1;
  long max_rss_kib = 0;
  std::string output;
};

// Runs the fedwan CLI with `args` to completion (killed after `limit`).
CliRun run_cli(const std::vector<std::string>& args, const fs::path& log,
               std::chrono::seconds limit = std::chrono::seconds(60)) {
  const pid_t pid = spawn_process(FEDWAN_CLI_PATH, args, log.string());
  const auto give_up = std::chrono::steady_clock::now() + limit;
  CliRun r;
  int status = 0;
  rusage usage{};
  for (;;) {
    const pid_t done = ::wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) {
      r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      break;
    }
    if (std::chrono::steady_clock::now() > give_up) {
      ::kill(pid, SIGKILL);
      ::wait4(pid, &status, 0, &usage);
      r.code = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.max_rss_kib = usage.ru_maxrss;
  r.output = read_text(log);
  return r;
}

// A file of `mib` MiB of 'x' with no newline.
fs::path big_file(const fs::path& dir, size_t mib) {
  const fs::path p = dir / "big";
  std::ofstream out(p, std::ios::binary);
  const std::string block(1 << 20, 'x');
  for (size_t i = 0; i < mib; ++i) out << block;
  return p;
}

// Files a user points the tools at are untrusted: each is refused or
// streamed within a bounded memory, never read whole.
TEST(Hardening, InputFilesAreReadWithinBounds) {
  TempDir dir;
  const fs::path big = big_file(dir.path(), 256);
  const fs::path small = dir.path() / "small.jsonl";
  std::ofstream(small) << "{}\n";
  const CliRun baseline = run_cli({"audit", "show", small.string()}, dir.path() / "base.log");
  ASSERT_GT(baseline.max_rss_kib, 0);
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const Case cases[] = {
      {{"audit", "show", big.string()}, "not a readable entry"},
      {{"audit", "verify", big.string()}, "longer than"},
      {{"certs", "show", big.string()}, "larger than"},
      {{"aggregator", "--topology", big.string(), "--node", "root"}, "larger than"},
  };
  for (const Case& c : cases) {
    const CliRun r = run_cli(c.args, dir.path() / "case.log");
    EXPECT_NE(r.code, 0) << c.args[0] << " " << c.args[1];
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    // Not the 256 MiB: what the process holds stays within 32 MiB of a run
    // on a two-byte file.
    EXPECT_LT(r.max_rss_kib - baseline.max_rss_kib, 32 * 1024)
        << c.args[0] << " " << c.args[1] << ": " << r.max_rss_kib << " KiB vs "
        << baseline.max_rss_kib;
  }
}

// Options out of range are refused at once, naming the range, instead of
// wrapping ("-1" rounds was 2^64-1) or passing NaN on.
TEST(Hardening, NumericOptionsAreRangeChecked) {
  TempDir dir;
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  FederationSpec fed;
  const Topology topo = make_tree(dir.path(), 0, 1, fed);
  const fs::path t = dir.path() / "t.yaml";
  std::ofstream(t) << topo.to_yaml();
  std::string bad_port = topo.to_yaml();
  const std::string ep = topo.node("root").endpoint;
  bad_port.replace(bad_port.find(ep), ep.size(), "tcp://127.0.0.1:70000");
  const fs::path tp = dir.path() / "port.yaml";
  std::ofstream(tp) << bad_port;
  std::string slow_timeout = topo.to_yaml();
  slow_timeout.replace(slow_timeout.find("round_timeout_s: 600"), 20, "round_timeout_s: 1e300");
  const fs::path tt = dir.path() / "timeout.yaml";
  std::ofstream(tt) << slow_timeout;
  const Case cases[] = {
      {{"demo", "--rounds", "-1", "--trainer", "synthetic", "--no-baseline", "--dir",
        (dir.path() / "d").string()},
       "--rounds: must be a whole number in [1, 1000000], not negative"},
      {{"demo", "--inner-steps", "nan"}, "--inner-steps"},
      {{"demo", "--base-port", "70000"}, "--base-port"},
      {{"site", "--topology", t.string(), "--node", "site-0", "--join-timeout", "nan"},
       "--join-timeout: must be a number"},
      {{"site", "--topology", t.string(), "--node", "site-0", "--rank", "-3"}, "--rank"},
      {{"certs", "init", "--topology", tp.string(), "--out", (dir.path() / "p").string()},
       "a port in 1..65535"},
      {{"certs", "init", "--topology", tt.string(), "--out", (dir.path() / "q").string()},
       "round_timeout_s 1e+300 must be between"},
  };
  for (const Case& c : cases) {
    const CliRun r = run_cli(c.args, dir.path() / "case.log", std::chrono::seconds(20));
    EXPECT_GT(r.code, 0) << c.args[0] << " " << c.args[1] << " " << c.args[2] << ": " << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
  }
}

// `fedwan demo --dir X` used to replace a CA already in X without a word.
TEST(Hardening, TheDemoNeverReplacesAnExistingCaUnasked) {
  TempDir dir;
  const std::vector<std::string> demo = {"demo",
                                         "--dir",
                                         (dir.path() / "d").string(),
                                         "--rounds",
                                         "1",
                                         "--inner-steps",
                                         "1",
                                         "--trainer",
                                         "synthetic",
                                         "--synthetic-size",
                                         "2000",
                                         "--sites",
                                         "2",
                                         "--regions",
                                         "1",
                                         "--no-baseline"};
  CliRun r = run_cli(demo, dir.path() / "first.log", std::chrono::seconds(120));
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string key = read_text(dir.path() / "d" / "pki" / "ca" / "ca.key");
  ASSERT_FALSE(key.empty());
  r = run_cli(demo, dir.path() / "second.log", std::chrono::seconds(120));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("reusing the federation CA"), std::string::npos) << r.output;
  EXPECT_EQ(read_text(dir.path() / "d" / "pki" / "ca" / "ca.key"), key);
  // A CA that cannot serve this demo (another federation's) is refused.
  fs::remove_all(dir.path() / "d" / "pki" / "site-1");
  std::vector<std::string> three = demo;
  r = run_cli(three, dir.path() / "third.log", std::chrono::seconds(60));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
  EXPECT_EQ(read_text(dir.path() / "d" / "pki" / "ca" / "ca.key"), key);
  three.push_back("--force");
  r = run_cli(three, dir.path() / "fourth.log", std::chrono::seconds(120));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(read_text(dir.path() / "d" / "pki" / "ca" / "ca.key"), key);
}

// A routing id and a refusal text are chosen by the peer; every log line
// comes out escaped, so neither can start a line of its own.
TEST(Hardening, PeerChosenTextCannotForgeLogLines) {
  TempDir dir;
  FederationSpec fed;
  fed.rounds = 1;
  std::vector<NodeSpec> nodes = make_tree(dir.path(), 1, 2, fed).nodes();
  for (NodeSpec& n : nodes) {
    if (n.role == Role::kSite) continue;
    n.endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
    n.bind = n.endpoint;
  }
  const Topology topo = Topology::build("log-test", fed, nodes);
  const fs::path t = dir.path() / "t.yaml";
  std::ofstream(t) << topo.to_yaml();
  const fs::path log = dir.path() / "region.log";
  const pid_t region = spawn_process(
      FEDWAN_CLI_PATH,
      {"--log-level", "info", "aggregator", "--topology", t.string(), "--node", "region-0",
       "--trainer", "synthetic", "--credentials", security_for(topo, "region-0").credentials_dir},
      log.string());
  const std::string forged = "2026-01-01T00:00:00.000 error [root] FORGED";
  {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::routing_id, "x\n" + forged + " by a routing id\x1b[2K");
    s.set(zmq::sockopt::linger, 1000);
    s.set(zmq::sockopt::rcvtimeo, 20000);
    s.connect(topo.node("region-0").endpoint);
    s.send(zmq::str_buffer("hello"), zmq::send_flags::none);
    zmq::message_t reply;
    ASSERT_TRUE(s.recv(reply).has_value()) << read_text(log);  // the refusal: the region read it
  }
  // A child with a session sends a refusal text of its own.
  RawSite site(topo, "site-1",
               test_client_security(topo, "site-1", security_for(topo, "site-1").credentials_dir));
  site.send(node::reject_frame(topo, site.node().index, 0, "bye\n" + forged + " by a child"));
  site.hello(std::vector<float>(10, 0.0f));  // the region answers once it read both
  std::vector<uint8_t> buf;
  (void)site.recv(&buf);
  ::kill(region, SIGTERM);
  wait_processes({region}, std::chrono::seconds(30));
  const std::string text = read_text(log);
  EXPECT_EQ(text.find("\n" + forged), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("x\\n" + forged + " by a routing id\\x1b[2K"), std::string::npos) << text;
  EXPECT_NE(text.find("bye\\n" + forged + " by a child"), std::string::npos) << text;
}

#endif  // FEDWAN_CLI_PATH

// Before a session is up, a refusal comes in plain text that anyone on the
// path can forge. One such refusal used to stop a site for good; now it is
// tried again until the join timeout, and the site joins the real parent.
TEST(Hardening, AForgedRefusalDuringTheFirstHandshakeIsRetried) {
  TempDir dir;
  FederationSpec fed;
  fed.rounds = 2;
  fed.inner_steps = 2;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;
  fed.heartbeat_s = 0.1;
  fed.heartbeat_timeout_s = 1;
  const Topology topo = make_tree(dir.path(), 1, 2, fed);
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const std::string region_ep = topo.node("region-0").endpoint;

  // Someone else answers at the region's address first, refuses site-0 in
  // plain text, and goes away.
  auto impostor_ctx = std::make_unique<zmq::context_t>();
  auto impostor = std::make_unique<zmq::socket_t>(*impostor_ctx, zmq::socket_type::router);
  impostor->set(zmq::sockopt::linger, 1000);
  impostor->bind(region_ep);

  NodeSpawner nodes;
  spawn_synthetic_site(nodes, topo, "site-0", init, kSeed, 2);
  spawn_synthetic_site(nodes, topo, "site-1", init, kSeed, 2);
  // Refuse the first ClientHello that comes, then leave.
  {
    zmq::message_t id, body;
    ASSERT_TRUE(impostor->recv(id).has_value());
    ASSERT_TRUE(impostor->recv(body).has_value());
    const std::vector<uint8_t> no = transport::plain_reject_frame(
        topo.job_id(), topo.node("region-0").index, "you are not welcome");
    impostor->send(id, zmq::send_flags::sndmore);
    impostor->send(zmq::buffer(no), zmq::send_flags::none);
  }
  impostor->close();
  impostor_ctx.reset();
  // The real region and root come up at the addresses the sites use.
  AggregatorSummary root_summary;
  spawn_aggregator(nodes, topo, "region-0", init);
  spawn_aggregator(nodes, topo, "root", init, &root_summary);
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");
  const ReferenceResult ref = run_reference(topo, init, [&](uint32_t site, uint64_t, auto& p) {
    synthetic::local_steps(p.data(), p.size(), site, 2, kSeed);
  });
  EXPECT_EQ(root_summary.global_model, ref.global);
}

}  // namespace
}  // namespace fedwan::testing
