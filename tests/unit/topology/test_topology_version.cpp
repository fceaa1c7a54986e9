// Topology versions: the version, history, signature and removed keys and
// their place in the digest, the successor of a version, what a later
// version may change in a running federation (topology::version_change), and
// the admin's signature of a version (security/topology_signature.hpp).
#include <gtest/gtest.h>

#include <chrono>

#include <array>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "harness/temp_dir.hpp"
#include "harness/test_pki.hpp"
#include "security/certs.hpp"
#include "security/identity.hpp"
#include "security/node_key.hpp"
#include "security/topology_signature.hpp"
#include "topology/topology_version.hpp"
#include "topology_test_util.hpp"

#include "harness/error_message.hpp"

namespace fedwan {
namespace {

namespace fs = std::filesystem;
using fedwan::testing::TempDir;
using fedwan::testing::TestPki;
using Nodes = std::vector<std::string>;

// The nodes of TestPki's federation, so its admin bundle signs these versions.
const char* const kRoot = R"({id: root, role: root, endpoint: "ipc:///tmp/unit-sign-root"})";
const char* const kEu =
    R"({id: eu, role: region, parent: root, endpoint: "ipc:///tmp/unit-sign-eu"})";
const char* const kSiteA = "{id: site-a, role: site, parent: eu}";
const char* const kSiteB = "{id: site-b, role: site, parent: eu}";
const char* const kSiteBRemoved = "{id: site-b, role: site, parent: eu, removed: true}";
const char* const kSiteC = "{id: site-c, role: site, parent: eu}";

Nodes base() { return {kRoot, kEu, kSiteA, kSiteB}; }
Nodes plus(Nodes nodes, const std::string& node) {
  nodes.push_back(node);
  return nodes;
}

std::string yaml_of(const Nodes& nodes, const std::string& top = "",
                    const std::string& job = "unit-sign") {
  std::string y = "job: " + job + "\n" + top + "nodes:\n";
  for (const std::string& n : nodes) y += "  - " + n + "\n";
  return y;
}

Topology parse(const Nodes& nodes, const std::string& top = "") {
  return Topology::parse(yaml_of(nodes, top));
}

Topology next_of(const Topology& previous, const Nodes& nodes, const std::string& top = "") {
  return parse(nodes, top).as_successor_of(previous);
}

std::string version_keys(uint64_t version, const std::vector<std::string>& history) {
  std::string y = "version: " + std::to_string(version) + "\nhistory: [";
  for (size_t i = 0; i < history.size(); ++i) y += (i ? ", \"" : "\"") + history[i] + "\"";
  return y + "]\n";
}

using testing::config_error;

void expect_change_refused(const Topology& current, const Topology& next,
                           const std::string& needle) {
  const std::string msg = config_error([&] { (void)topology::version_change(current, next); });
  ASSERT_FALSE(msg.empty()) << "version " << next.version() << " was accepted";
  EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

void expect_problem(const std::optional<std::string>& why, const std::string& needle) {
  ASSERT_TRUE(why.has_value()) << "the signature was accepted";
  EXPECT_NE(why->find(needle), std::string::npos) << *why;
}

// What an aggregator with the bundle of `pki_dir`/<node> says of `t`.
std::optional<std::string> problem(const Topology& t, const fs::path& pki_dir,
                                   const std::string& node = "admin") {
  const security::SignatureVerifier v((pki_dir / node / "ca.pem").string(),
                                      (pki_dir / node / "crl.pem").string());
  return security::topology_signature_problem(t, v);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---- the file ------------------------------------------------------------------

TEST(TopologyVersion, WithoutVersionKeysItIsVersionOne) {
  const Topology t = parse(base());
  EXPECT_EQ(t.version(), 1u);
  EXPECT_TRUE(t.history().empty());
  EXPECT_FALSE(t.signature().has_value());
  EXPECT_EQ(t.lineage_digest(), t.digest());
  EXPECT_TRUE(t.knows_digest(t.digest()));
  // Federations provisioned before versions existed keep their digest.
  EXPECT_EQ(parse(base(), "version: 1\n").digest(), t.digest());
  EXPECT_EQ(parse(base(), "version: 1\nhistory: []\n").digest(), t.digest());
  EXPECT_EQ(t.to_yaml().find("version:"), std::string::npos);
}

TEST(TopologyVersion, ALaterVersionListsTheDigestsBeforeIt) {
  const Topology v1 = parse(base());
  const Topology v2 = parse(base(), version_keys(2, {v1.digest_hex()}));
  EXPECT_EQ(v2.version(), 2u);
  ASSERT_EQ(v2.history().size(), 1u);
  EXPECT_EQ(v2.history()[0], v1.digest());
  EXPECT_NE(v2.digest(), v1.digest());  // the version and history are in the digest
  EXPECT_EQ(v2.lineage_digest(), v1.digest());
  // Written by hand or made by as_successor_of: the same version.
  EXPECT_EQ(v2.digest(), v1.as_successor_of(v1).digest());
  std::string upper = v1.digest_hex();
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(parse(base(), version_keys(2, {upper})).digest(), v2.digest());
  const std::string other(64, 'a');
  EXPECT_NE(parse(base(), version_keys(2, {other})).digest(), v2.digest());
}

TEST(TopologyVersion, VersionAndHistoryMustAgree) {
  const std::string d(64, 'a');
  for (const std::string& top :
       {version_keys(2, {}), std::string("version: 2\n"), version_keys(2, {d, d}),
        version_keys(1, {d}), version_keys(3, {d})}) {
    expect_error(yaml_of(base(), top), {"'history'", "earlier digests"});
  }
  expect_error(yaml_of(base(), "version: 0\n"), {"'version' must be 1.."});
  expect_error(yaml_of(base(), version_keys(2, {d.substr(1)})),
               {"history[0] must be a topology digest (64 hex digits)"});
  expect_error(yaml_of(base(), version_keys(2, {std::string(63, 'a') + "g"})),
               {"history[0] must be a topology digest"});
  expect_error(yaml_of(base(), "version: 2\nhistory: \"" + d + "\"\n"),
               {"'history' must be a list of strings"});
}

TEST(TopologyVersion, SignatureKeyIsCheckedButNotDigested) {
  const Topology plain = parse(base());
  const Topology sig = parse(base(), "signature: {cert: \"QUJD\", value: \"REVG\"}\n");
  ASSERT_TRUE(sig.signature().has_value());
  EXPECT_EQ(sig.signature()->cert, "QUJD");
  EXPECT_EQ(sig.signature()->value, "REVG");
  EXPECT_EQ(sig.digest(), plain.digest());

  expect_error(yaml_of(base(), "signature: {cert: \"QUJD\", value: \"REVG\", by: admin}\n"),
               {"signature", "unknown key 'by'"});
  expect_error(yaml_of(base(), "signature: {cert: \"QUJD\"}\n"), {"missing 'value'"});
  expect_error(yaml_of(base(), "signature: {cert: \"\", value: \"REVG\"}\n"),
               {"'cert' must be 1..8192 characters of base64"});
  expect_error(yaml_of(base(), "signature: QUJD\n"), {"expected a mapping"});
}

TEST(TopologyVersion, RemovedAppliesToSitesAndChangesTheDigest) {
  const Topology t = parse({kRoot, kEu, kSiteA, kSiteBRemoved});
  EXPECT_TRUE(t.node("site-b").removed);
  EXPECT_FALSE(t.node("site-a").removed);
  EXPECT_EQ(t.node("site-b").index, 3u);  // it keeps its place: its index is its wire id
  EXPECT_NE(t.digest(), parse(base()).digest());

  expect_error(yaml_of({kRoot,
                        R"({id: eu, role: region, parent: root, endpoint: "ipc:///tmp/e", )"
                        "removed: true}",
                        kSiteA}),
               {"node 'eu'", "removed applies to sites only"});
  expect_error(
      yaml_of({R"({id: root, role: root, endpoint: "ipc:///tmp/r", removed: true})", kEu, kSiteA}),
      {"node 'root'", "removed applies to sites only"});
  expect_error(yaml_of({kRoot, kEu, "{id: site-a, role: site, parent: eu, removed: yes}"}),
               {"'removed' must be true or false"});
  // The federation's first round needs one child there at the start.
  expect_error(yaml_of({kRoot, kEu, "{id: site-a, role: site, parent: eu, removed: true}",
                        "{id: site-b, role: site, parent: eu, late_join: true}"}),
               {"node 'eu'", "every child is late_join or removed"});
  // A removed site no longer counts towards its region's k_min.
  expect_error(yaml_of({kRoot,
                        R"({id: eu, role: region, parent: root, endpoint: "ipc:///tmp/e", )"
                        "k_min: 2}",
                        kSiteA, kSiteBRemoved}),
               {"region 'eu'", "requires k_min 2"});
}

TEST(TopologyVersion, RemovedSitesAreUnderNothingAndWeighNothing) {
  const Topology t = parse({kRoot, kEu, "{id: site-a, role: site, parent: eu, weight: 2}",
                            "{id: site-b, role: site, parent: eu, weight: 3, removed: true}",
                            "{id: site-c, role: site, parent: eu, weight: 5}"});
  EXPECT_EQ(t.sites_under(0), (std::vector<uint32_t>{2, 4}));
  EXPECT_EQ(t.sites_under(1), (std::vector<uint32_t>{2, 4}));
  EXPECT_TRUE(t.sites_under(3).empty());
  EXPECT_EQ(t.weight_under(0), 7.0);
  EXPECT_EQ(t.weight_under(1), 7.0);
  EXPECT_EQ(t.weight_under(3), 0.0);
}

TEST(TopologyVersion, SuccessorCountsUpAndKeepsTheLineage) {
  const Topology v1 = parse(base());
  const Topology v2 = next_of(v1, plus(base(), kSiteC));
  EXPECT_EQ(v2.version(), 2u);
  EXPECT_EQ(v2.history(), (std::vector<std::array<uint8_t, 32>>{v1.digest()}));
  const Topology v3 = next_of(v2, plus({kRoot, kEu, kSiteA, kSiteBRemoved}, kSiteC));
  EXPECT_EQ(v3.version(), 3u);
  EXPECT_EQ(v3.history(), (std::vector<std::array<uint8_t, 32>>{v1.digest(), v2.digest()}));
  for (const Topology* t : {&v1, &v2, &v3}) EXPECT_EQ(t->lineage_digest(), v1.digest());
  for (const Topology* t : {&v1, &v2, &v3}) EXPECT_TRUE(v3.knows_digest(t->digest()));
  EXPECT_FALSE(v1.knows_digest(v2.digest()));  // an earlier version knows no later one
  std::array<uint8_t, 32> stranger{};
  stranger.fill(0x5a);
  EXPECT_FALSE(v3.knows_digest(stranger));

  const Topology labelled = v2.with_signature({"QUJD", "REVG"});
  EXPECT_EQ(labelled.digest(), v2.digest());
  EXPECT_FALSE(labelled.as_successor_of(v1).signature().has_value());

  const std::string msg = config_error(
      [&] { (void)Topology::parse(yaml_of(base(), "", "other-job")).as_successor_of(v1); });
  EXPECT_NE(msg.find("for job 'other-job'"), std::string::npos) << msg;
}

TEST(TopologyVersion, SignedVersionSurvivesTheYamlRoundTrip) {
  const TestPki& pki = TestPki::get();
  const Topology v1 = parse(base());
  const Topology v2 = next_of(v1, plus(base(), kSiteC));
  const Topology v3 = security::sign_topology(
      next_of(v2, plus({kRoot, kEu, kSiteA, kSiteBRemoved}, kSiteC)), *pki.key("admin"));
  const Topology back = Topology::parse(v3.to_yaml());
  EXPECT_EQ(back.digest(), v3.digest());
  EXPECT_EQ(back.version(), 3u);
  EXPECT_EQ(back.history(), v3.history());
  ASSERT_TRUE(back.signature().has_value());
  EXPECT_EQ(back.signature()->cert, v3.signature()->cert);
  EXPECT_EQ(back.signature()->value, v3.signature()->value);
  EXPECT_TRUE(back.node("site-b").removed);
  EXPECT_EQ(security::topology_signature_problem(back, *pki.verifier()), std::nullopt);
}

// ---- what a later version may change ------------------------------------------

TEST(TopologyVersionChange, AddsAndRemovesSites) {
  const Topology v1 = parse(base());
  const Topology add = next_of(v1, plus(base(), kSiteC));
  topology::VersionChange c = topology::version_change(v1, add);
  EXPECT_EQ(c.added, (std::vector<uint32_t>{4}));
  EXPECT_TRUE(c.removed.empty());

  c = topology::version_change(v1, next_of(v1, {kRoot, kEu, kSiteA, kSiteBRemoved}));
  EXPECT_TRUE(c.added.empty());
  EXPECT_EQ(c.removed, (std::vector<uint32_t>{3}));

  const Topology both = next_of(v1, plus({kRoot, kEu, kSiteA, kSiteBRemoved}, kSiteC));
  c = topology::version_change(v1, both);
  EXPECT_EQ(c.added, (std::vector<uint32_t>{4}));
  EXPECT_EQ(c.removed, (std::vector<uint32_t>{3}));

  // A site removed earlier stays removed and is not removed again.
  const Topology v3 = next_of(both, plus(plus({kRoot, kEu, kSiteA, kSiteBRemoved}, kSiteC),
                                         "{id: site-d, role: site, parent: eu}"));
  c = topology::version_change(both, v3);
  EXPECT_EQ(c.added, (std::vector<uint32_t>{5}));
  EXPECT_TRUE(c.removed.empty());

  // A node that missed version 2 goes straight to version 3, whose history
  // still continues its own.
  const Topology v2 = next_of(v1, plus(base(), kSiteC));
  c = topology::version_change(v1, next_of(v2, plus({kRoot, kEu, kSiteA, kSiteBRemoved}, kSiteC)));
  EXPECT_EQ(c.added, (std::vector<uint32_t>{4}));
  EXPECT_EQ(c.removed, (std::vector<uint32_t>{3}));
}

TEST(TopologyVersionChange, RefusesAnotherFederationOrAnotherHistory) {
  const Topology v1 = parse(base());
  const Topology v2 = next_of(v1, plus(base(), kSiteC));
  expect_change_refused(v1,
                        Topology::parse(yaml_of(plus(base(), kSiteC),
                                                version_keys(2, {v1.digest_hex()}), "other-job")),
                        "this federation runs 'unit-sign'");
  expect_change_refused(v1, v1, "is not later than the running version 1");
  expect_change_refused(v2, v1, "is not later than the running version 2");
  expect_change_refused(v2, next_of(v1, {kRoot, kEu, kSiteA, kSiteBRemoved}),
                        "is not later than the running version 2");
  // A successor of another version 1 (site-a weighs 2 there).
  const Topology other_v1 =
      parse({kRoot, kEu, "{id: site-a, role: site, parent: eu, weight: 2}", kSiteB});
  expect_change_refused(v1, next_of(other_v1, plus(base(), kSiteC)),
                        "was not made from the running version 1");
  // Made from version 1 while version 2 runs: it skips what version 2 did.
  const Topology sibling = next_of(v1, {kRoot, kEu, kSiteA, kSiteBRemoved});
  expect_change_refused(v2, next_of(sibling, plus({kRoot, kEu, kSiteA, kSiteBRemoved}, kSiteC)),
                        "was not made from the running version 2");
}

TEST(TopologyVersionChange, RefusesChangedSettingsAndNodes) {
  const Topology v1 = parse(base());
  const Nodes with_c = plus(base(), kSiteC);
  expect_change_refused(v1, next_of(v1, with_c, "federation: {quorum: 0.5}\n"),
                        "changes the federation settings or the policy");
  expect_change_refused(v1, next_of(v1, with_c, "policy: {k_min: 2}\n"),
                        "changes the federation settings or the policy");
  expect_change_refused(
      v1,
      next_of(v1, plus({kRoot, kEu, "{id: site-a, role: site, parent: eu, weight: 2}", kSiteB},
                       kSiteC)),
      "changes node 'site-a'");
  expect_change_refused(
      v1,
      next_of(v1, plus({kRoot, R"({id: eu, role: region, parent: root, endpoint: "ipc:///tmp/x"})",
                        kSiteA, kSiteB},
                       kSiteC)),
      "changes node 'eu'");
  expect_change_refused(v1, next_of(v1, {kRoot, kEu, kSiteA}), "has fewer nodes than version 1");
  expect_change_refused(v1, next_of(v1, {kRoot, kEu, kSiteB, kSiteA, kSiteC}),
                        "has 'site-b' where version 1 has 'site-a'");
  expect_change_refused(v1, next_of(v1, base()), "neither adds nor removes a site");
}

TEST(TopologyVersionChange, RefusesWhatCannotJoinOrReturn) {
  const Topology v1 = parse(base());
  const Topology v2 = next_of(v1, {kRoot, kEu, kSiteA, kSiteBRemoved});
  expect_change_refused(v2, next_of(v2, plus(base(), kSiteC)), "brings back 'site-b'");
  expect_change_refused(v1,
                        next_of(v1, plus(plus(base(), R"({id: us, role: region, parent: root, )"
                                                      R"(endpoint: "ipc:///tmp/unit-sign-us"})"),
                                         "{id: site-c, role: site, parent: us}")),
                        "adds region 'us'");
  expect_change_refused(
      v1, next_of(v1, plus(base(), "{id: site-c, role: site, parent: eu, removed: true}")),
      "adds 'site-c' already removed");
}

// ---- the admin's signature -----------------------------------------------------

TEST(TopologyAdminSignature, ProvisioningWritesAnAdminBundle) {
  const TestPki& pki = TestPki::get();
  for (const char* f : {"cert.pem", "key.pem", "ca.pem", "crl.pem"}) {
    EXPECT_TRUE(fs::exists(pki.dir() / "admin" / f)) << f;
  }
  const auto admin = pki.key("admin");
  EXPECT_TRUE(admin->identity().admin);
  EXPECT_EQ(admin->identity().node_id, "admin");
  EXPECT_EQ(admin->identity().job, "unit-sign");
  EXPECT_FALSE(pki.key("site-a")->identity().admin);

  // The admin certificate signs; it never passes for a node's.
  const std::string pem = read_text(pki.dir() / "admin" / "cert.pem");
  EXPECT_THROW((void)security::identity_from_pem(pem), CryptoError);
  const security::CertificateSummary s = security::summary_from_pem(pem);
  EXPECT_TRUE(s.identity.admin);
  EXPECT_EQ(s.identity.node_id, "admin");
  EXPECT_EQ(s.identity.job, "unit-sign");
}

TEST(TopologyAdminSignature, NodeIdAdminIsReserved) {
  TempDir dir;
  const Topology t = parse({kRoot, kEu, kSiteA, "{id: admin, role: site, parent: eu}"});
  const std::string msg =
      config_error([&] { security::provision_federation(t, dir.path().string()); });
  EXPECT_NE(msg.find("collides with the admin bundle"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "ca"));  // refused before anything was written
}

TEST(TopologyAdminSignature, AdminSignatureVerifiesOnEveryBundle) {
  const TestPki& pki = TestPki::get();
  const Topology v2 = next_of(parse(base()), plus(base(), kSiteC));
  const Topology s = security::sign_topology(v2, *pki.key("admin"));
  ASSERT_TRUE(s.signature().has_value());
  EXPECT_EQ(s.digest(), v2.digest());
  for (const char* bundle : {"admin", "root", "eu", "site-a"}) {
    EXPECT_EQ(problem(s, pki.dir(), bundle), std::nullopt) << bundle;
  }
}

TEST(TopologyAdminSignature, OnlyTheAdminOfThisJobSigns) {
  const TestPki& pki = TestPki::get();
  const Topology v2 = next_of(parse(base()), plus(base(), kSiteC));
  std::string msg = config_error([&] { (void)security::sign_topology(v2, *pki.key("site-a")); });
  EXPECT_NE(msg.find("belongs to node 'site-a'"), std::string::npos) << msg;
  msg = config_error([&] {
    (void)security::sign_topology(Topology::parse(yaml_of(base(), "", "other-job")),
                                  *pki.key("admin"));
  });
  EXPECT_NE(msg.find("the admin bundle is for job 'unit-sign'"), std::string::npos) << msg;

  expect_problem(problem(v2, pki.dir()), "version 2 is not signed");

  // Made by hand with a site's key, which sign_topology would not take.
  const auto site = pki.key("site-a");
  const auto& d = v2.digest();
  const Topology by_site = v2.with_signature(
      {security::base64_encode(site->cert_der()),
       security::base64_encode(site->sign("fedwan-topology-v1", d.data(), d.size()))});
  expect_problem(problem(by_site, pki.dir()),
                 "signed by node 'site-a', not by the federation's admin");

  // The admin's key over the digest, but for another kind of record.
  const auto admin = pki.key("admin");
  const Topology other_domain = v2.with_signature(
      {security::base64_encode(admin->cert_der()),
       security::base64_encode(admin->sign("fedwan-checkpoint-v2", d.data(), d.size()))});
  expect_problem(problem(other_domain, pki.dir()), "does not match");
}

TEST(TopologyAdminSignature, ASignatureCoversExactlyItsVersion) {
  const TestPki& pki = TestPki::get();
  const Topology v1 = parse(base());
  const Topology v2 = security::sign_topology(next_of(v1, plus(base(), kSiteC)), *pki.key("admin"));
  const TopologySignature sig = *v2.signature();

  const Topology edited =
      next_of(v1, plus(base(), "{id: site-c, role: site, parent: eu, weight: 9}"))
          .with_signature(sig);
  expect_problem(problem(edited, pki.dir()), "the signature of version 2 does not hold");
  expect_problem(problem(parse(plus(base(), kSiteC)).with_signature(sig), pki.dir()),
                 "the signature of version 1 does not hold");
  const Topology v3 = next_of(v2, plus({kRoot, kEu, kSiteA, kSiteBRemoved}, kSiteC));
  expect_problem(problem(v3.with_signature(sig), pki.dir()), "does not hold");

  expect_problem(problem(v2.with_signature({"not base64!", sig.value}), pki.dir()), "not base64");
  expect_problem(problem(v2.with_signature({sig.cert, "QUJ"}), pki.dir()), "not base64");
  expect_problem(problem(v2.with_signature({"QUJD", sig.value}), pki.dir()),
                 "not one DER certificate");
}

TEST(TopologyAdminSignature, AdminOfAnotherFederationDoesNotVerify) {
  const TestPki& pki = TestPki::get();
  TempDir other;
  security::provision_federation(parse(base()), other.path().string());  // same job, another CA
  const Topology v2 = next_of(parse(base()), plus(base(), kSiteC));
  const Topology foreign =
      security::sign_topology(v2, *security::NodeKey::from_bundle((other / "admin").string()));
  EXPECT_EQ(problem(foreign, other.path()), std::nullopt);
  expect_problem(problem(foreign, pki.dir()), "does not verify against the federation CA");
}

TEST(TopologyAdminSignature, RevokedAdminNoLongerSigns) {
  TempDir dir;
  const std::string pki = dir.path().string();
  security::provision_federation(parse(base()), pki);
  const Topology v2 = next_of(parse(base()), plus(base(), kSiteC));
  const Topology s = security::sign_topology(v2, *security::NodeKey::from_bundle(pki + "/admin"));
  EXPECT_EQ(problem(s, dir.path()), std::nullopt);

  security::revoke_node(pki, security::kAdminName);
  for (const char* bundle : {"admin", "root", "site-a"}) {
    expect_problem(problem(s, dir.path(), bundle), "revoked");
  }
  // The CRL a verifier was built with is what it checks against.
  const security::SignatureVerifier without_crl((dir / "root/ca.pem").string());
  EXPECT_EQ(security::topology_signature_problem(s, without_crl), std::nullopt);

  security::issue_admin(pki);
  const Topology again =
      security::sign_topology(v2, *security::NodeKey::from_bundle(pki + "/admin"));
  EXPECT_EQ(problem(again, dir.path()), std::nullopt);
  expect_problem(problem(s, dir.path()), "revoked");
}

TEST(TopologyAdminSignature, ExpiredAdminNoLongerSigns) {
  TempDir dir;
  const std::string pki = dir.path().string();
  security::provision_federation(parse(base()), pki);
  // Valid from two hours ago for one hour: expired now.
  security::IssueOptions expired;
  expired.not_before_offset = std::chrono::hours(-2);
  expired.validity = std::chrono::hours(1);
  security::issue_admin(pki, expired);
  const Topology v2 = next_of(parse(base()), plus(base(), kSiteC));
  const Topology s = security::sign_topology(v2, *security::NodeKey::from_bundle(pki + "/admin"));
  expect_problem(problem(s, dir.path()), "expired");
}

}  // namespace
}  // namespace fedwan
