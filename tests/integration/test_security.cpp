// The secure channel against attackers: every refusal is explained, audited,
// and counts nothing. A root, a region and an honest site run as threads; a
// second site is driven frame by frame by the test and, between honest
// frames, plays each attack. The final model must equal a federation in
// which the attacks never happened.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "fedwan/error.hpp"
#include "harness/audit_replay.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/raw_site.hpp"
#include "harness/reference_federation.hpp"
#include "security/audit_log.hpp"
#include "security/certs.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 23;
constexpr size_t kParams = 3000;  // 3 chunks of 1024, 1024, 952

// A copy of the federation's PKI to mint credentials the real nodes did not
// get (the CA key is there, as an attacker who stole it would have it).
fs::path copy_pki(const fs::path& pki, const fs::path& to) {
  fs::copy(pki, to, fs::copy_options::recursive);
  return to;
}

// Expects the handshake through `site` to fail with `needle` in the reason.
void expect_handshake_refused(RawSite& site, const std::string& needle) {
  try {
    site.link().wait_established(std::chrono::seconds(10));
    ADD_FAILURE() << "handshake succeeded; expected a refusal mentioning: " << needle;
  } catch (const CryptoError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::vector<uint8_t> flip(std::vector<uint8_t> b, size_t at) {
  b.at(at) ^= 0x04;
  return b;
}

TEST(Security, AttacksAreRefusedAuditedAndCountNothing) {
  TempDir dir;
  FederationSpec fed;
  fed.rounds = 3;
  fed.inner_steps = 2;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;
  fed.round_timeout_s = 30;
  const Topology topo = make_tree(dir.path(), 1, 2, fed);  // root - region-0 - site-0, site-1
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const fs::path pki = credentials_dir_for(topo);
  const fs::path region_audit = dir.path() / "region-0.audit";
  const fs::path root_audit = dir.path() / "root.audit";

  AggregatorSummary root_summary, region_summary;
  std::vector<float> honest = init;
  NodeSpawner nodes;
  nodes.spawn("root", [&](NodeStopper& stopper) {
    AggregatorOptions o;
    o.topology = topo;
    o.node_id = "root";
    o.initial_model = init;
    o.join_timeout = std::chrono::seconds(60);
    o.security = security_for(topo, "root");
    o.security.audit_log = root_audit.string();
    Aggregator root(std::move(o));
    const auto bound = stopper.bind([&root] { root.stop(); });
    root_summary = root.run();
  });
  nodes.spawn("region-0", [&](NodeStopper& stopper) {
    AggregatorOptions o;
    o.topology = topo;
    o.node_id = "region-0";
    o.join_timeout = std::chrono::seconds(60);
    o.security = security_for(topo, "region-0");
    o.security.audit_log = region_audit.string();
    Aggregator region(std::move(o));
    const auto bound = stopper.bind([&region] { region.stop(); });
    region_summary = region.run();
  });
  nodes.spawn("site-0", [&](NodeStopper& stopper) {
    SiteOptions o;
    o.topology = topo;
    o.node_id = "site-0";
    o.join_timeout = std::chrono::seconds(60);
    o.round_timeout = std::chrono::seconds(60);
    o.security = security_for(topo, "site-0");
    SiteCore site(std::move(o), honest.data(), honest.size());
    const auto bound = stopper.bind([&site] { site.stop(); });
    SyncResult r = site.join();
    while (!r.finished) {
      synthetic::local_steps(honest.data(), kParams, topo.node("site-0").index, 2, kSeed);
      r = site.sync();
    }
  });

  const std::string region_ep = topo.node("region-0").endpoint;
  const std::string site1_bundle = (pki / "site-1").string();

  {
    SCOPED_TRACE("plaintext client against a secure node");
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::routing_id, "site-1");
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 10000);
    s.connect(region_ep);
    RawSite shape(topo, "site-1", transport::plaintext_security_factory(topo.job_id(), 0),
                  "inproc://unused");
    s.send(zmq::buffer(shape.hello_frame(init)), zmq::send_flags::none);
    zmq::message_t reply;
    ASSERT_TRUE(s.recv(reply).has_value());
    const auto f = wire::parse_frame(static_cast<uint8_t*>(reply.data()), reply.size());
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f.header.type, wire::MsgType::kReject);
    const std::string why(reinterpret_cast<const char*>(f.payload), f.payload_size);
    EXPECT_NE(why.find("refuses plaintext peers"), std::string::npos) << why;
    EXPECT_GE(count_audit(region_audit, "frame_rejected", "plaintext frame refused"), 1u);
  }
  {
    SCOPED_TRACE("certificate from an unknown CA");
    // A second federation's CA issued this certificate. The attacker trusts
    // both CAs, so only the region's check can stop it.
    const fs::path other = dir.path() / "other-pki";
    provision_credentials(topo, other.string());
    const fs::path bundle = dir.path() / "unknown-ca";
    fs::create_directories(bundle);
    fs::copy(other / "site-1" / "cert.pem", bundle / "cert.pem");
    fs::copy(other / "site-1" / "key.pem", bundle / "key.pem");
    std::ofstream(bundle / "ca.pem") << std::ifstream(pki / "ca" / "ca.pem").rdbuf()
                                     << std::ifstream(other / "ca" / "ca.pem").rdbuf();
    std::ofstream(bundle / "crl.pem") << std::ifstream(pki / "ca" / "crl.pem").rdbuf()
                                      << std::ifstream(other / "ca" / "crl.pem").rdbuf();
    RawSite attacker(topo, "site-1", test_client_security(topo, "site-1", bundle.string()));
    expect_handshake_refused(attacker, "issued by an unknown CA");
    EXPECT_EQ(count_audit(region_audit, "handshake", "issued by an unknown CA"), 1u);
  }
  {
    SCOPED_TRACE("expired certificate");
    const fs::path stolen = copy_pki(pki, dir.path() / "expired-pki");
    security::IssueOptions expired;
    expired.not_before_offset = std::chrono::hours(-48);
    expired.validity = std::chrono::hours(24);
    security::issue_node(stolen.string(), security::identity_for(topo, "site-1"), expired);
    RawSite attacker(topo, "site-1",
                     test_client_security(topo, "site-1", (stolen / "site-1").string()));
    expect_handshake_refused(attacker, "certificate has expired");
    EXPECT_EQ(count_audit(region_audit, "handshake", "certificate has expired"), 1u);
  }
  {
    SCOPED_TRACE("revoked certificate");
    const fs::path stolen = copy_pki(pki, dir.path() / "revoked-pki");
    security::issue_node(stolen.string(), security::identity_for(topo, "site-1"));
    security::revoke_node(stolen.string(), "site-1");
    // The operator distributes the new CRL; the region reads it at the next
    // handshake, without a restart.
    fs::copy_file(stolen / "ca" / "crl.pem", pki / "region-0" / "crl.pem",
                  fs::copy_options::overwrite_existing);
    RawSite attacker(topo, "site-1",
                     test_client_security(topo, "site-1", (stolen / "site-1").string()));
    expect_handshake_refused(attacker, "certificate revoked");
    EXPECT_EQ(count_audit(region_audit, "handshake", "certificate revoked"), 1u);
  }
  {
    SCOPED_TRACE("node id that does not match the certificate");
    RawSite attacker(topo, "site-1",
                     test_client_security(topo, "site-1", (pki / "site-0").string()));
    expect_handshake_refused(attacker, "node id mismatch");
    EXPECT_EQ(count_audit(region_audit, "handshake", "node id mismatch"), 1u);
  }
  {
    SCOPED_TRACE("certificate claiming an aggregator role for a site");
    const fs::path stolen = copy_pki(pki, dir.path() / "role-pki");
    security::NodeIdentity lie = security::identity_for(topo, "site-1");
    lie.role = Role::kRegion;
    lie.region = "site-1";
    security::issue_node(stolen.string(), lie);
    RawSite attacker(topo, "site-1",
                     test_client_security(topo, "site-1", (stolen / "site-1").string()));
    expect_handshake_refused(attacker, "gives role 'region'");
    EXPECT_EQ(count_audit(region_audit, "handshake", "gives role 'region'"), 1u);
  }

  // The genuine site-1 joins.
  std::vector<uint8_t> buf;
  auto rogue =
      std::make_unique<RawSite>(topo, "site-1", test_client_security(topo, "site-1", site1_bundle));
  rogue->hello(init);
  wire::ParsedFrame f = rogue->recv(&buf);
  ASSERT_TRUE(f.ok()) << f.detail;
  ASSERT_EQ(f.header.type, wire::MsgType::kWelcome);
  auto read_anchors = [&](RawSite& s) {
    for (int got = 0; got < 3;) {
      f = s.recv(&buf);
      ASSERT_TRUE(f.ok()) << f.detail;
      if (f.header.type == wire::MsgType::kAnchor) ++got;
    }
  };
  const auto chunk_n = [](uint32_t c) -> uint32_t { return c < 2 ? 1024 : 952; };

  // Round 0: tampered copies of chunk 0 first, then the genuine one, then
  // its replay.
  {
    SCOPED_TRACE("tampering and replay within a session");
    const std::vector<uint8_t> sealed = rogue->seal(rogue->delta(0, 0, 3, 1024, 1024, kParams));
    rogue->send_raw(flip(sealed, 20));                 // header (round field)
    rogue->send_raw(flip(sealed, 64 + 100));           // ciphertext
    rogue->send_raw(flip(sealed, sealed.size() - 1));  // tag
    rogue->send_raw(std::vector<uint8_t>(sealed.begin(), sealed.end() - 5));  // truncated
    rogue->send_raw(sealed);                                                  // genuine
    rogue->send_raw(sealed);                                                  // replayed
    // A site acting as an aggregator: an anchor frame from a child.
    wire::FrameHeader h = node::node_header(topo, rogue->node().index, wire::MsgType::kAnchor, 0);
    h.codec = static_cast<uint8_t>(CodecId::kFp32);
    h.chunk_count = 3;
    h.element_count = 1024;
    h.total_elements = kParams;
    std::vector<uint8_t> payload(4096, 0);
    rogue->send(node::make_frame(h, payload));
    for (uint32_t c = 1; c < 3; ++c) {
      rogue->send(rogue->delta(0, c, 3, chunk_n(c), chunk_n(c), kParams));
    }
    read_anchors(*rogue);
    EXPECT_GE(count_audit(region_audit, "frame_rejected", "bad tag"), 3u);
    EXPECT_EQ(count_audit(region_audit, "frame_rejected", "truncated"), 1u);
    EXPECT_EQ(count_audit(region_audit, "frame_rejected", "replay"), 1u);
    EXPECT_EQ(count_audit(region_audit, "refusal", "unexpected anchor from a child"), 1u);
  }
  {
    SCOPED_TRACE("a frame from a closed round, and a replay into a new session");
    rogue->send(rogue->delta(0, 1, 3, 1024, 1024, kParams));  // round 0 is closed
    const std::vector<uint8_t> old_session =
        rogue->seal(rogue->delta(1, 0, 3, 1024, 1024, kParams));
    rogue.reset();  // site-1 restarts: a new handshake, new keys
    rogue = std::make_unique<RawSite>(topo, "site-1",
                                      test_client_security(topo, "site-1", site1_bundle));
    rogue->link().wait_established(std::chrono::seconds(10));
    rogue->send_raw(old_session);
    for (uint32_t c = 0; c < 3; ++c) {
      rogue->send(rogue->delta(1, c, 3, chunk_n(c), chunk_n(c), kParams));
    }
    read_anchors(*rogue);
    // The same bytes a restart leaves on the way: dropped as a frame of
    // another session, told apart by its key epoch; no frame failed its tag.
    EXPECT_GE(count_audit(region_audit, "frame_rejected", "bad tag"), 3u);
    EXPECT_EQ(count_audit(region_audit, "frame_of_other_session", "another session"), 1u);
  }
  for (uint32_t c = 0; c < 3; ++c) {
    rogue->send(rogue->delta(2, c, 3, chunk_n(c), chunk_n(c), kParams));
  }
  read_anchors(*rogue);
  do {
    f = rogue->recv(&buf);
    ASSERT_TRUE(f.ok()) << f.detail;
  } while (f.header.type != wire::MsgType::kDone);
  rogue->send(
      node::make_frame(node::node_header(topo, rogue->node().index, wire::MsgType::kDone, 3), {}));
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");

  // Nothing an attacker sent was counted: the result equals a federation in
  // which site-1 sent its zero deltas once per round and nothing else.
  const ReferenceResult ref = run_reference(topo, init, [&](uint32_t site, uint64_t, auto& p) {
    if (site != rogue->node().index) synthetic::local_steps(p.data(), p.size(), site, 2, kSeed);
  });
  ASSERT_EQ(root_summary.global_model.size(), ref.global.size());
  EXPECT_EQ(0, std::memcmp(root_summary.global_model.data(), ref.global.data(),
                           ref.global.size() * sizeof(float)));
  EXPECT_EQ(count_audit(region_audit, "update", "\"stale\""), 1u);
  size_t accepted = 0;
  for (const AuditEntry& e : settled_updates(region_audit)) {
    accepted += e.fields.value("decision", "") == "accepted" ? 1 : 0;
  }
  EXPECT_EQ(accepted, 2u * 3u * 3u);
  // plaintext, 3 bad tags, truncated, replay, the anchor, the stale delta
  // (the old session's frame is not a rejection)
  EXPECT_EQ(region_summary.rejected_frames, 8u);
  EXPECT_EQ(root_summary.security_mode, "mtls/aes-256-gcm");
  EXPECT_EQ(region_summary.handshake_ms.size(), 3u);  // site-0, site-1 twice

  // Both logs are intact chains.
  for (const fs::path& p : {region_audit, root_audit}) {
    const security::AuditVerifyResult v = security::verify_audit_file(p.string());
    EXPECT_TRUE(v.ok) << p << ": line " << v.first_bad_line << ": " << v.problem;
  }
}

TEST(Security, ResidencyIsEnforcedAtLoadAndAtRunTime) {
  TempDir dir;
  const std::string yaml = R"(job: residency
federation: {rounds: 1, inner_steps: 1, codec: fp32, chunk_bytes: 4096, round_timeout_s: 20}
policy: {k_min: 2}
nodes:
  - {id: root, role: root, endpoint: "ipc://)" +
                           (dir.path() / "root").string() + R"("}
  - {id: eu, role: region, parent: root, jurisdiction: EU, endpoint: "ipc://)" +
                           (dir.path() / "eu").string() + R"("}
  - {id: us, role: region, parent: root, jurisdiction: US, endpoint: "ipc://)" +
                           (dir.path() / "us").string() + R"("}
  - {id: eu-a, role: site, parent: eu, allowed_jurisdictions: [EU]}
  - {id: eu-b, role: site, parent: eu}
  - {id: us-a, role: site, parent: us}
  - {id: us-b, role: site, parent: us}
)";
  const Topology topo = Topology::parse(yaml);
  {
    SCOPED_TRACE("at config load");
    std::string bad = yaml;
    bad.replace(bad.find("allowed_jurisdictions: [EU]"), 27, "allowed_jurisdictions: [US]");
    try {
      (void)Topology::parse(bad);
      ADD_FAILURE() << "a site whose parent is outside its allowed jurisdictions was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("may send its delta only to [US]"), std::string::npos)
          << e.what();
    }
  }
  const fs::path pki = credentials_dir_for(topo);
  const fs::path us_audit = dir.path() / "us.audit";
  const fs::path site_audit = dir.path() / "eu-a.audit";
  AggregatorOptions o;
  o.topology = topo;
  o.node_id = "us";
  o.join_timeout = std::chrono::seconds(30);
  o.security = security_for(topo, "us");
  o.security.audit_log = us_audit.string();
  Aggregator us(std::move(o));
  NodeSpawner nodes;
  nodes.spawn_node("us", us);  // stopped below
  {
    SCOPED_TRACE("a site whose policy forbids the aggregator it reached");
    // eu-a's copy of the topology points its parent at an aggregator in the
    // US (a misconfiguration or a redirected name) that would take it: one
    // holding the US region's credentials, without its checks. The site
    // refuses it once TLS proved who it is, before sending anything.
    const std::string rogue_ep = "ipc://" + (dir.path() / "rogue-us").string();
    auto rogue_transport = transport::make_transport(rogue_ep);
    transport::ChildrenLink rogue(*rogue_transport, rogue_ep, transport::LinkOptions{},
                                  test_server_security(topo, "us", (pki / "us").string()));
    std::atomic<bool> stop{false};
    NodeSpawner rogue_parent;
    rogue_parent.spawn(
        "rogue-us",
        [&] {
          transport::Incoming in;
          while (!stop.load()) (void)rogue.recv(&in, std::chrono::milliseconds(20));
        },
        [&] { stop.store(true); });
    std::string redirected = yaml;
    const std::string eu_ep = "ipc://" + (dir.path() / "eu").string();
    redirected.replace(redirected.find(eu_ep), eu_ep.size(), rogue_ep);
    SiteOptions so;
    so.topology = Topology::parse(redirected);
    so.node_id = "eu-a";
    so.join_timeout = std::chrono::seconds(10);
    so.security = security_for(topo, "eu-a");
    so.security.audit_log = site_audit.string();
    std::vector<float> params(1000, 0.5f);
    SiteCore site(std::move(so), params.data(), params.size());
    try {
      site.join();
      ADD_FAILURE() << "eu-a joined an aggregator in the US";
    } catch (const CryptoError& e) {
      EXPECT_NE(std::string(e.what()).find("may send its delta only to [EU]"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(count_audit(site_audit, "handshake", "may send its delta only to [EU]"), 1u);
    rogue_parent.stop();
    rogue_parent.join();
  }
  {
    SCOPED_TRACE("a site of region eu reporting to region us");
    RawSite stray(topo, "eu-b",
                  test_client_security(topo, "eu-b", (pki / "eu-b").string(),
                                       /*check_parent=*/false),
                  "ipc://" + (dir.path() / "us").string());
    // A real eu-b refuses 'us' itself (as above); this one does not, so the
    // aggregator's own check is exercised.
    expect_handshake_refused(stray, "reports to 'eu', not to 'us'");
    EXPECT_EQ(count_audit(us_audit, "handshake", "site 'eu-b' reports to 'eu', not to 'us'"), 1u);
  }
  nodes.stop();
  nodes.join();
  EXPECT_EQ(count_audit(us_audit, "update", ""), 0u);
}

TEST(Security, SecureSiteRefusesPlaintextAggregator) {
  TempDir dir;
  FederationSpec fed;
  fed.rounds = 1;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;
  const Topology topo = make_tree(dir.path(), 1, 1, fed);
  AggregatorOptions o;
  o.topology = topo;
  o.node_id = "region-0";
  o.join_timeout = std::chrono::seconds(30);
  o.security.insecure_plaintext = true;
  Aggregator region(std::move(o));
  NodeSpawner nodes;
  nodes.spawn_node("region-0", region);
  RawSite site(topo, "site-0",
               test_client_security(topo, "site-0", security_for(topo, "site-0").credentials_dir));
  expect_handshake_refused(site, "--insecure-plaintext");
  nodes.stop();
  nodes.join();
}

TEST(Security, NodeWithoutCredentialsRefusesToStart) {
  TempDir dir;
  FederationSpec fed;
  const Topology topo = make_tree(dir.path(), 0, 1, fed);
  SiteOptions o;
  o.topology = topo;
  o.node_id = "site-0";
  std::vector<float> params(10);
  try {
    SiteCore site(std::move(o), params.data(), params.size());
    ADD_FAILURE() << "a site without credentials started";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has no credentials"), std::string::npos) << e.what();
  }
  SiteOptions wrong;
  wrong.topology = topo;
  wrong.node_id = "site-0";
  wrong.security = security_for(topo, "root");  // another node's bundle
  try {
    SiteCore site(std::move(wrong), params.data(), params.size());
    ADD_FAILURE() << "a site started with the root's credentials";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use this node's own bundle"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fedwan::testing
