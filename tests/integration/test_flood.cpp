// What anyone who can reach an aggregator's port can cost it, without any
// credentials, and what a full disk does: real `fedwan` processes on
// loopback TCP, attacked by raw ZeroMQ peers.
//   * 10,000 identities, each sending a TLS ClientHello, leave the
//     aggregator's memory where it was, and the federation then finishes;
//   * 40,000 refused frames cost a bounded number of audit entries and log
//     lines, every one of them counted in a summary;
//   * an audit log whose disk is full is an alarm: the federation finishes.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "harness/federation_fixture.hpp"
#include "harness/process.hpp"
#include "harness/raw_site.hpp"
#include "harness/tiny_disk.hpp"
#include "security/audit_log.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A field of /proc/<pid>/status in KiB (VmRSS, VmHWM); -1 when unreadable.
long status_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

// root -> region-0 -> site-0, site-1 on loopback TCP, written to dir.
struct TcpFederation {
  Topology topo;
  fs::path topo_path;
  fs::path dir;

  TcpFederation(const fs::path& d, uint64_t rounds) : dir(d) {
    FederationSpec fed;
    fed.rounds = rounds;
    fed.inner_steps = 2;
    fed.codec = "fp16";
    fed.chunk_bytes = 16384;
    fed.round_timeout_s = 60;
    std::vector<NodeSpec> nodes = make_tree(d, 1, 2, fed).nodes();
    for (NodeSpec& n : nodes) {
      if (n.role == Role::kSite) continue;
      n.endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
      n.bind = n.endpoint;
    }
    topo = Topology::build("flood-test", fed, nodes);
    topo_path = d / "topology.yaml";
    std::ofstream(topo_path) << topo.to_yaml();
  }

  pid_t start(const std::string& node, const std::vector<std::string>& extra = {}) {
    const bool site = topo.node(node).role == Role::kSite;
    std::vector<std::string> args = {site ? "site" : "aggregator",
                                     "--topology",
                                     topo_path.string(),
                                     "--node",
                                     node,
                                     "--trainer",
                                     "synthetic",
                                     "--synthetic-size",
                                     "5000",
                                     "--join-timeout",
                                     "120",
                                     "--credentials",
                                     security_for(topo, node).credentials_dir};
    args.insert(args.end(), extra.begin(), extra.end());
    return spawn_process(FEDWAN_CLI_PATH, args, log(node).string());
  }
  fs::path log(const std::string& node) const { return dir / (node + ".log"); }
};

// Waits until `endpoint` (tcp://host:port) accepts connections.
bool wait_listening(const std::string& endpoint, std::chrono::seconds patience) {
  const size_t colon = endpoint.rfind(':');
  const int port = std::stoi(endpoint.substr(colon + 1));
  const auto give_up = Clock::now() + patience;
  while (Clock::now() < give_up) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A real TLS ClientHello frame, as a child sends it first.
std::vector<uint8_t> client_hello(const Topology& topo, const std::string& as) {
  transport::SecurityReplies first;
  test_client_security(topo, as, security_for(topo, as).credentials_dir)("endpoint")->start(&first);
  return first.at(0);
}

// Sends `frame` from `count` DEALER peers with the routing ids `id(i)`,
// keeping at most 64 connections open at once.
void flood(const std::string& endpoint, size_t count, const std::function<std::string(size_t)>& id,
           const std::vector<uint8_t>& frame) {
  zmq::context_t ctx(2);
  // Sockets closing (lingering) still count against libzmq's default of
  // 1023 per context.
  ctx.set(zmq::ctxopt::max_sockets, 16384);
  std::deque<zmq::socket_t> open;
  for (size_t i = 0; i < count; ++i) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::routing_id, id(i));
    s.set(zmq::sockopt::linger, 2000);
    // Sent only once the connection is up, and flushed before it closes:
    // every identity really reaches the target.
    s.set(zmq::sockopt::immediate, true);
    s.set(zmq::sockopt::sndtimeo, 10000);
    s.connect(endpoint);
    if (!s.send(zmq::buffer(frame), zmq::send_flags::none)) {
      ADD_FAILURE() << "could not send as peer " << i;
      return;
    }
    open.push_back(std::move(s));
    if (open.size() > 32) open.pop_front();
  }
  open.clear();
}

// A ClientHello under a child's id, answered: the target has read the
// messages that arrived before it (and is alive).
void probe(const Topology& topo, const std::string& endpoint) {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::routing_id, "site-0");
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, 20000);
  s.connect(endpoint);
  s.send(zmq::buffer(client_hello(topo, "site-0")), zmq::send_flags::none);
  zmq::message_t reply;
  ASSERT_TRUE(s.recv(reply).has_value()) << "no answer to a ClientHello";
  const auto f = wire::parse_frame(static_cast<uint8_t*>(reply.data()), reply.size());
  EXPECT_TRUE(f.ok() && f.header.type == wire::MsgType::kHandshake) << f.detail;
}

// The acceptance test of the finding: an identity costs nothing to choose,
// and each used to leave ~58 KiB of TLS state at the aggregator for good.
TEST(Flood, TenThousandUnauthenticatedIdentitiesLeaveTheAggregatorsMemoryAlone) {
  TempDir dir;
  TcpFederation fed(dir.path(), 3);
  const std::string region_ep = fed.topo.node("region-0").endpoint;
  std::vector<pid_t> pids = {fed.start("root"), fed.start("region-0")};
  const pid_t region = pids[1];
  ASSERT_TRUE(wait_listening(region_ep, std::chrono::seconds(60)))
      << read_text(fed.log("region-0"));
  const std::vector<uint8_t> hello = client_hello(fed.topo, "site-0");
  // Warm-up: the first connections make libzmq and OpenSSL allocate what
  // they keep for the life of the process.
  flood(
      region_ep, 200, [](size_t i) { return "warm-" + std::to_string(i); }, hello);
  probe(fed.topo, region_ep);
  const long before = status_kib(region, "VmRSS");
  ASSERT_GT(before, 0);

  std::mt19937_64 rng(7);
  long mid = 0;
  flood(
      region_ep, 5000, [&](size_t) { return "eve-" + std::to_string(rng()); }, hello);
  probe(fed.topo, region_ep);
  mid = status_kib(region, "VmRSS");
  flood(
      region_ep, 5000, [&](size_t) { return "eve-" + std::to_string(rng()); }, hello);
  // A few hundred more under the real children's ids: those may start a TLS
  // handshake, but only a handful at once, each for a bounded time.
  flood(
      region_ep, 300, [](size_t i) { return i % 2 ? "site-0" : "site-1"; }, hello);
  probe(fed.topo, region_ep);
  const long after = status_kib(region, "VmRSS");
  EXPECT_LE(after - before, 16 * 1024)
      << "RSS before " << before << " KiB, after " << after << " KiB";
  RecordProperty("rss_before_kib", std::to_string(before));
  RecordProperty("rss_after_kib", std::to_string(after));
  std::printf("[ rss      ] region before %ld KiB, after 5,000 identities %ld KiB, after 10,300 "
              "%ld KiB (+%ld KiB)\n",
              before, mid, after, after - before);

  // And the federation still forms and finishes.
  pids.push_back(fed.start("site-0"));
  pids.push_back(fed.start("site-1"));
  const std::vector<int> codes = wait_processes(pids, std::chrono::seconds(180));
  const char* names[] = {"root", "region-0", "site-0", "site-1"};
  for (size_t i = 0; i < codes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << names[i] << " log:\n" << read_text(fed.log(names[i]));
  }
}

// Refusals an unauthenticated peer provokes cost a bounded number of audit
// entries and log lines; what is held back is counted in "suppressed"
// summaries, so the audit trail still says how big the flood was.
TEST(Flood, RefusedFramesCostABoundedAuditAndLog) {
  TempDir dir;
  TcpFederation fed(dir.path(), 1);
  const fs::path audit = dir.path() / "region-0.audit";
  const pid_t region = fed.start("region-0", {"--audit-log", audit.string()});
  const std::string ep = fed.topo.node("region-0").endpoint;
  ASSERT_TRUE(wait_listening(ep, std::chrono::seconds(60))) << read_text(fed.log("region-0"));
  RawSite shape(fed.topo, "site-1", transport::plaintext_security_factory(fed.topo.job_id(), 0),
                "inproc://unused");
  const std::vector<uint8_t> plain = shape.hello_frame(std::vector<float>(10, 0.0f));
  // 20,000 frames from identities that are no node at all...
  flood(
      ep, 20000, [](size_t i) { return "nobody-" + std::to_string(i); }, plain);
  probe(fed.topo, ep);
  // ... and 20,000 plaintext frames on one connection, under a child's id,
  // then a ClientHello on that connection: its answer comes once the region
  // has read every frame before it (libzmq keeps a connection's order).
  {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::routing_id, "site-1");
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 60000);
    s.connect(ep);
    for (int i = 0; i < 20000; ++i) s.send(zmq::buffer(plain), zmq::send_flags::none);
    s.send(zmq::buffer(client_hello(fed.topo, "site-1")), zmq::send_flags::none);
    bool answered = false;
    for (zmq::message_t reply; !answered && s.recv(reply);) {
      const auto f = wire::parse_frame(static_cast<uint8_t*>(reply.data()), reply.size());
      answered = f.ok() && f.header.type == wire::MsgType::kHandshake;
    }
    ASSERT_TRUE(answered) << "no answer to a ClientHello after the flood";
  }
  ::kill(region, SIGTERM);
  ASSERT_EQ(wait_processes({region}, std::chrono::seconds(30))[0], 0)
      << read_text(fed.log("region-0"));

  const security::AuditVerifyResult v = security::verify_audit_file(audit.string());
  ASSERT_TRUE(v.ok) << v.problem;
  // Per kind: entries written, and occurrences counted in summaries.
  uint64_t plain_written = 0, plain_counted = 0, nobody_written = 0, nobody_counted = 0;
  std::ifstream in(audit);
  for (std::string line; std::getline(in, line);) {
    const auto e = nlohmann::json::parse(line);
    const std::string event = e["event"];
    const std::string fields = e["fields"].dump();
    if (event == "frame_rejected") ++plain_written;
    if (event == "handshake" && fields.find("nobody-") != std::string::npos) ++nobody_written;
    if (event == "suppressed") {
      const std::string kind = e["fields"]["kind"];
      const uint64_t n = e["fields"]["count"];
      if (kind.rfind("frame_rejected:", 0) == 0) plain_counted += n;
      if (kind.find("not a node of topology") != std::string::npos) nobody_counted += n;
    }
  }
  const uint64_t written = plain_written + nobody_written;
  const auto audit_bytes = fs::file_size(audit);
  const std::string log = read_text(fed.log("region-0"));
  const size_t log_lines = std::count(log.begin(), log.end(), '\n');
  std::printf("[ flood    ] 20,000 plaintext frames: %llu audited, %llu counted; 20,000 "
              "unknown peers: %llu audited, %llu counted; audit %llu bytes, log %zu lines\n",
              static_cast<unsigned long long>(plain_written),
              static_cast<unsigned long long>(plain_counted),
              static_cast<unsigned long long>(nobody_written),
              static_cast<unsigned long long>(nobody_counted),
              static_cast<unsigned long long>(audit_bytes), log_lines);
  EXPECT_LE(written, 200u);
  EXPECT_LT(audit_bytes, 256u * 1024u);
  EXPECT_LT(log_lines, 300u);
  // Every refusal on the one connection is written or counted.
  EXPECT_EQ(plain_written + plain_counted, 20000u);
  // And every unknown peer's.
  EXPECT_EQ(nobody_written + nobody_counted, 20000u);
}

// Acceptance: with the disk of its audit log full, a region keeps serving,
// the federation finishes, and the region raises the alarm.
TEST(Flood, AFullAuditDiskIsAnAlarmAndTheFederationFinishes) {
  TinyDisk disk(64 * 1024);
  if (!disk.mounted()) GTEST_SKIP() << "needs root to mount a small tmpfs";
  TempDir dir;
  TcpFederation fed(dir.path(), 3);
  const fs::path audit = disk.path() / "region-0.audit";
  disk.fill();
  std::vector<pid_t> pids = {fed.start("root", {"--out", (dir.path() / "root.bin").string()}),
                             fed.start("region-0", {"--audit-log", audit.string()}),
                             fed.start("site-0"), fed.start("site-1")};
  const std::vector<int> codes = wait_processes(pids, std::chrono::seconds(180));
  const char* names[] = {"root", "region-0", "site-0", "site-1"};
  for (size_t i = 0; i < codes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << names[i] << " log:\n" << read_text(fed.log(names[i]));
  }
  EXPECT_EQ(read_model(dir.path() / "root.bin").size(), 5000u);
  const std::string log = read_text(fed.log("region-0"));
  EXPECT_NE(log.find("ALARM audit_write_failed"), std::string::npos) << log;
  EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
  // What reached the file is whole: no torn entry to stop a restart.
  const security::AuditVerifyResult v = security::verify_audit_file(audit.string());
  EXPECT_TRUE(v.ok) << v.problem;
}

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
