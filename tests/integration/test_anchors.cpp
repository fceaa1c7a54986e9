// What a node's own key anchors: its audit log (signed heads, checked by
// `fedwan audit verify --ca` and `--expect-head`, and against the head its
// checkpoint recorded when it restarts) and its checkpoints (a file edited
// and re-hashed on its disk, or forged by the parent that keeps its
// replica, is not resumed from).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "harness/audit_replay.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/forge.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/process.hpp"
#include "harness/raw_site.hpp"
#include "node/node_frames.hpp"
#include "security/audit_log.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 37;
constexpr size_t kParams = 3000;

// Heartbeats fast enough that a node without a parent gives up soon.
FederationSpec small_federation(uint64_t rounds) {
  FederationSpec fed = small_fp32_federation(rounds);
  fed.heartbeat_s = 0.2;
  fed.heartbeat_timeout_s = 2;
  return fed;
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

void write_lines(const fs::path& p, const std::vector<std::string>& lines) {
  std::ofstream out(p, std::ios::trunc);
  for (const std::string& l : lines) out << l << "\n";
}

// A federation of threads in which every site checkpoints into dir/<site>
// and keeps an audit log dir/<site>.audit.
FederationRun run_with_checkpoints(const Topology& topo, const fs::path& dir,
                                   const std::vector<float>& init) {
  SiteSetup setup;
  setup.options = [&](SiteOptions& o, size_t, std::vector<float>&) {
    o.checkpoint_dir = (dir / o.node_id).string();
    o.security.audit_log = (dir / (o.node_id + ".audit")).string();
  };
  return run_threads(topo, init, kSeed, 8, setup);
}

// site-0 started again from its checkpoint directory with no parent
// running: where it resumed (its join times out waiting for a welcome).
struct Restarted {
  bool resumed = false;
  uint64_t round = 0;
  std::vector<float> params;
};
Restarted restart_without_parent(const Topology& topo, const fs::path& dir, size_t n) {
  Restarted out;
  out.params.assign(n, 0.0f);
  SiteOptions o = site_options(topo, "site-0", std::chrono::milliseconds(500));
  o.checkpoint_dir = (dir / "site-0").string();
  SiteCore site(std::move(o), out.params.data(), out.params.size());
  EXPECT_THROW(site.join(), TimeoutError);
  out.resumed = site.resumed();
  out.round = site.round();
  return out;
}

#ifdef FEDWAN_CLI_PATH

struct Cli {
  int code;
  std::string out;
};
Cli audit_verify(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> all = {"audit", "verify"};
  all.insert(all.end(), args.begin(), args.end());
  const pid_t pid = spawn_process(FEDWAN_CLI_PATH, all, log.string());
  const int code = wait_processes({pid}, std::chrono::seconds(30))[0];
  return {code, read_text(log)};
}

// The finding: an empty log verified as "ok: 0 entries", a truncated one
// verified, and nothing could check a recorded head or who wrote a log.
TEST(AuditAnchors, VerifyRefusesEmptyTruncatedAndRechainedLogs) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, small_federation(2));
  const FederationRun run =
      run_with_checkpoints(topo, dir.path(), synthetic::initial_model(kParams, kSeed));
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const fs::path log = dir.path() / "site-0.audit";
  const std::string ca = (fs::path(credentials_dir_for(topo)) / "ca" / "ca.pem").string();
  const fs::path out = dir.path() / "verify.log";

  Cli r = audit_verify({log.string(), "--ca", ca}, out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("every one verified against"), std::string::npos) << r.out;
  const std::vector<std::string> lines = lines_of(log);
  const std::string head = nlohmann::json::parse(lines.back())["hash"];
  r = audit_verify({log.string(), "--expect-head", head}, out);
  EXPECT_EQ(r.code, 0) << r.out;

  const fs::path empty = dir.path() / "empty.audit";
  std::ofstream(empty).close();
  r = audit_verify({empty.string()}, out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("empty"), std::string::npos) << r.out;

  const fs::path cut = dir.path() / "cut.audit";
  write_lines(cut, std::vector<std::string>(lines.begin(), lines.end() - 3));
  r = audit_verify({cut.string(), "--expect-head", head}, out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("does not contain the recorded head"), std::string::npos) << r.out;
  r = audit_verify({cut.string(), "--ca", ca}, out);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("does not end with its node's closing head"), std::string::npos) << r.out;

  // Re-chained: one update's digest replaced, every hash after it
  // recomputed. The chain is whole; the signed heads after the edit are not.
  std::vector<std::string> rechained;
  std::string prev(64, '0');
  bool edited = false;
  for (const std::string& l : lines) {
    nlohmann::json j = nlohmann::json::parse(l);
    if (!edited && j["event"] == "update_sent") {
      j["fields"]["sha256"] = std::string(64, 'e');
      edited = true;
    }
    const std::string prefix = "{\"seq\":" + j["seq"].dump() + ",\"time\":" + j["time"].dump() +
                               ",\"node\":" + j["node"].dump() + ",\"event\":" + j["event"].dump() +
                               ",\"fields\":" + j["fields"].dump() + ",\"prev\":\"" + prev + "\"";
    const Sha256Digest d = sha256(prefix.data(), prefix.size());
    prev = to_hex(d.data(), d.size());
    rechained.push_back(prefix + ",\"hash\":\"" + prev + "\"}");
  }
  ASSERT_TRUE(edited);
  const fs::path forged = dir.path() / "forged.audit";
  write_lines(forged, rechained);
  r = audit_verify({forged.string()}, out);
  EXPECT_EQ(r.code, 0) << r.out;  // the chain alone cannot tell
  r = audit_verify({forged.string(), "--ca", ca}, out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("signed head does not verify"), std::string::npos) << r.out;
}

#endif  // FEDWAN_CLI_PATH

// A node restarted on an audit log cut back behind its last checkpoint used
// to carry on silently: the checkpoint records the log's head, so the node
// now raises an alarm and says so in the log.
TEST(AuditAnchors, ARestartOnATruncatedLogRaisesAnAlarm) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, small_federation(2));
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const FederationRun run = run_with_checkpoints(topo, dir.path(), init);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const fs::path log = dir.path() / "site-0.audit";
  // Cut the log back past the head the last checkpoint recorded: the entry
  // just before that checkpoint's own "checkpoint" entry.
  std::vector<std::string> lines = lines_of(log);
  size_t last_checkpoint = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (nlohmann::json::parse(lines[i])["event"] == "checkpoint") last_checkpoint = i;
  }
  ASSERT_GT(last_checkpoint, 2u);
  lines.resize(last_checkpoint - 1);
  write_lines(log, lines);

  std::vector<float> params = init;
  SiteOptions o = site_options(topo, "site-0", std::chrono::milliseconds(500));
  o.checkpoint_dir = (dir.path() / "site-0").string();
  o.security.audit_log = log.string();
  SiteCore site(std::move(o), params.data(), params.size());
  EXPECT_THROW(site.join(), TimeoutError);  // resumes, then finds no parent
  EXPECT_TRUE(site.resumed());
  EXPECT_TRUE(has_alarm(site.alarms(), "audit_truncated"));
  bool recorded = false;
  for (const std::string& l : lines_of(log)) {
    recorded = recorded || nlohmann::json::parse(l)["event"] == "audit_truncated";
  }
  EXPECT_TRUE(recorded);
}

// The finding: a checkpoint edited and re-hashed was resumed from. It is now
// refused (kept as *.corrupt) and the site resumes from the one before.
TEST(CheckpointAnchors, AnEditedAndRehashedCheckpointIsNotResumed) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, small_federation(3));
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const FederationRun run = run_with_checkpoints(topo, dir.path(), init);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const fs::path ckpt = dir.path() / "site-0" / "site-0.fwck";
  Checkpoint c = read_checkpoint(ckpt);
  ASSERT_EQ(c.round, 3u);
  for (CheckpointSection& s : c.sections) {
    if (s.name == "params" || s.name == "anchor") std::fill(s.bytes.begin(), s.bytes.end(), 0x41);
  }
  c.round = 2;  // and pretend it is a round behind, to be played again
  forge_signed_checkpoint(ckpt, c);
  ASSERT_EQ(read_checkpoint(ckpt).round, 2u);  // intact as far as digests go

  const Restarted site = restart_without_parent(topo, dir.path(), kParams);
  EXPECT_TRUE(site.resumed);
  EXPECT_EQ(site.round, 2u);  // from site-0.prev.fwck, the genuine round-2 checkpoint
  float forged_value;
  const uint32_t pattern = 0x41414141u;
  std::memcpy(&forged_value, &pattern, sizeof forged_value);
  EXPECT_NE(site.params[0], forged_value);
  EXPECT_TRUE(fs::exists(ckpt.string() + ".corrupt"));
}

// A site whose checkpoint is over 64 MiB writes a whole one at its first
// round boundary and then, its budget spent (checkpoint_budget), its replica
// image at each boundary: a fraction of the bytes. Restarted, it resumes from
// the image, the newer of the two, and waits for its parent's model.
TEST(CheckpointAnchors, ALargeSiteWritesImagesBetweenWholeCheckpoints) {
  TempDir dir;
  constexpr size_t kLarge = 6'000'000;  // a 72 MB checkpoint
  const Topology topo = make_tree(dir.path(), 0, 1, small_federation(4));
  const std::vector<float> init = synthetic::initial_model(kLarge, kSeed);
  SiteSetup setup;
  setup.options = [&](SiteOptions& o, size_t, std::vector<float>&) {
    o.checkpoint_dir = (dir.path() / o.node_id).string();
    o.security.audit_log = (dir.path() / (o.node_id + ".audit")).string();
    o.checkpoint_budget = 1e-9;
  };
  const FederationRun run = run_threads(topo, init, kSeed, 8, setup);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  std::vector<bool> images;  // each checkpoint entry: an image rather than whole
  for (const AuditEntry& e : read_audit(dir.path() / "site-0.audit")) {
    if (e.event == "checkpoint") images.push_back(e.fields.value("image", false));
  }
  ASSERT_GE(images.size(), 3u);
  EXPECT_FALSE(images[0]);
  for (size_t i = 1; i < images.size(); ++i) EXPECT_TRUE(images[i]) << i;
  const fs::path whole_path = dir.path() / "site-0" / "site-0.fwck";
  const fs::path image_path = dir.path() / "site-0" / "site-0.replica.fwck";
  const uint64_t image_round = read_checkpoint(image_path).round;
  EXPECT_LT(read_checkpoint(whole_path).round, image_round);
  EXPECT_LT(fs::file_size(image_path), fs::file_size(whole_path) / 4);

  const Restarted site = restart_without_parent(topo, dir.path(), kLarge);
  EXPECT_TRUE(site.resumed);
  EXPECT_EQ(site.round, image_round);
}

// A site's model of more than a MiB resumes from its whole checkpoint
// with the arrays read from the file straight into place (they are left
// there when it is read): its parameters are the checkpoint's, bit for bit.
TEST(CheckpointAnchors, ASiteResumesAModelReadStraightFromItsFile) {
  TempDir dir;
  constexpr size_t kMiBModel = 400'000;  // 1.6 MB arrays: left on disk when read
  static_assert(kMiBModel * sizeof(float) >= checkpoint::kRestoreOnDiskFrom);
  const Topology topo = make_tree(dir.path(), 0, 1, small_federation(3));
  const FederationRun run =
      run_with_checkpoints(topo, dir.path(), synthetic::initial_model(kMiBModel, kSeed));
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const fs::path whole_path = dir.path() / "site-0" / "site-0.fwck";
  const Checkpoint whole = read_checkpoint(whole_path);
  const std::vector<float> saved = checkpoint::floats_of(
      whole, whole.find("params") != nullptr ? "params" : "anchor", kMiBModel);

  const Restarted site = restart_without_parent(topo, dir.path(), kMiBModel);
  EXPECT_TRUE(site.resumed);
  EXPECT_EQ(site.round, whole.round);
  ASSERT_EQ(site.params.size(), saved.size());
  EXPECT_EQ(std::memcmp(site.params.data(), saved.data(), saved.size() * sizeof(float)), 0);
}

// Replica bytes are reported round by round where they cross a link: a
// site's SyncResult::replica_bytes (what it sent of its replica since its
// last sync), an aggregator's RoundReport::replica_bytes (what it received
// from each child since its last report). The bench harness adds them to
// the links' bytes in the ideal bound.
TEST(CheckpointAnchors, ReplicaBytesAreReportedWhereTheyCrossALink) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 1, 2, small_federation(4));
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  SiteSetup setup;
  setup.options = [&](SiteOptions& o, size_t, std::vector<float>&) {
    o.checkpoint_dir = (dir.path() / o.node_id).string();
  };
  setup.aggregator = [&](AggregatorOptions& o) {
    o.checkpoint_dir = (dir.path() / o.node_id).string();
  };
  const FederationRun run = run_threads(topo, init, kSeed, 8, setup);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  uint64_t sites = 0;
  for (const uint64_t b : run.site_replica_bytes) {
    EXPECT_GT(b, 0u);
    sites += b;
  }
  // The region received them: their payloads, without the frame headers.
  ASSERT_EQ(run.regions.size(), 1u);
  EXPECT_GT(run.regions[0].replica_bytes, 0u);
  EXPECT_LE(run.regions[0].replica_bytes, sites);
  // The root's reports name the region's replica, and no more than came.
  uint64_t reported = 0;
  for (const RoundReport& r : run.root.reports) {
    for (const auto& [child, b] : r.replica_bytes) {
      EXPECT_EQ(child, "region-0");
      reported += b;
    }
  }
  EXPECT_GT(reported, 0u);
  EXPECT_LE(reported, run.root.replica_bytes);
}

// A parent that keeps a child's replica could hand it a forged one. The
// child checks its own signature: the forgery is refused (audited, alarmed)
// and the child starts from the federation's model instead.
TEST(CheckpointAnchors, AReplicaForgedByTheParentIsRefused) {
  TempDir dir;
  FederationSpec fed = small_federation(2);
  const Topology topo = make_tree(dir.path(), 0, 1, fed);  // root - site-0
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const FederationRun run = run_with_checkpoints(topo, dir.path(), init);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  // The site's genuine checkpoint, forged by "the parent": new parameters,
  // every digest recomputed, the site's signature block kept.
  const fs::path genuine = dir.path() / "site-0" / "site-0.fwck";
  Checkpoint c = read_checkpoint(genuine);
  for (CheckpointSection& s : c.sections) {
    if (s.name == "params" || s.name == "anchor") std::fill(s.bytes.begin(), s.bytes.end(), 0x42);
  }
  const fs::path forged = dir.path() / "forged.fwck";
  fs::copy_file(genuine, forged);
  forge_signed_checkpoint(forged, c);
  const std::vector<uint8_t> bytes = read_bytes(forged);
  fs::remove_all(dir.path() / "site-0");  // the site lost its disk

  // The parent: answers the site's request for its replica with the forgery.
  auto transport = transport::make_transport(topo.root().endpoint);
  transport::ChildrenLink parent(
      *transport, topo.root().endpoint, transport::LinkOptions{},
      test_server_security(topo, "root", security_for(topo, "root").credentials_dir));
  std::atomic<bool> stop{false};
  const auto serve = [&] {
    transport::Incoming in;
    while (!stop.load()) {
      if (!parent.recv(&in, std::chrono::milliseconds(20))) continue;
      const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size);
      if (!f.ok() || f.header.type != wire::MsgType::kHello ||
          !(f.header.flags & wire::kFlagNeedReplica)) {
        continue;
      }
      // In pieces of the federation's chunk size, the largest a child takes.
      const size_t piece = topo.federation().chunk_bytes;
      const uint32_t count = static_cast<uint32_t>((bytes.size() + piece - 1) / piece);
      for (uint32_t i = 0; i < count; ++i) {
        const size_t off = size_t{i} * piece;
        const std::vector<uint8_t> part(bytes.begin() + off,
                                        bytes.begin() + std::min(bytes.size(), off + piece));
        wire::FrameHeader h =
            node::node_header(topo, topo.root().index, wire::MsgType::kCheckpoint, c.round);
        h.chunk_index = i;
        h.chunk_count = count;
        h.element_count = static_cast<uint32_t>(part.size());
        h.total_elements = bytes.size();
        (void)parent.send(in.peer, node::make_frame(h, part), std::chrono::seconds(5));
      }
    }
  };
  NodeSpawner nodes;
  nodes.spawn("root", serve, [&] { stop.store(true); });
  std::vector<float> params(kParams, 0.0f);
  SiteOptions o = site_options(topo, "site-0", std::chrono::seconds(3));
  o.checkpoint_dir = (dir.path() / "site-0").string();
  o.security.audit_log = (dir.path() / "site-0.restart.audit").string();
  SiteCore site(std::move(o), params.data(), params.size());
  EXPECT_THROW(site.join(), TimeoutError);  // no welcome from this parent
  nodes.stop();
  nodes.join();
  EXPECT_FALSE(site.resumed());
  EXPECT_FALSE(fs::exists(dir.path() / "site-0" / "site-0.fwck"));
  EXPECT_TRUE(has_alarm(site.alarms(), "replica_refused"));
  bool audited = false;
  for (const std::string& l : lines_of(dir.path() / "site-0.restart.audit")) {
    const auto e = nlohmann::json::parse(l);
    audited =
        audited || (e["event"] == "replica_refused" &&
                    e["fields"].dump().find("signature does not verify") != std::string::npos);
  }
  EXPECT_TRUE(audited);
}

}  // namespace
}  // namespace fedwan::testing
