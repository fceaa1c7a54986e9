// `fedwan costs` trusts no single node (costs/cost_ledger.hpp, cost_checks.hpp):
// records signed by their own node's key (written by CostRecorder),
// forgeries refused while the rest bills, training time bounded by the
// round's wall time and the topology's devices, link bytes billed at the
// parent's count.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costs/cost_bill.hpp"
#include "costs/cost_checks.hpp"
#include "costs/cost_ledger.hpp"
#include "costs/cost_recorder.hpp"
#include "fedwan/error.hpp"
#include "harness/temp_dir.hpp"
#include "harness/test_pki.hpp"
#include "security/node_key.hpp"

namespace fedwan::costs {
namespace {

using nlohmann::json;
using testing::TestPki;

// What a node writes, with the key given (a forger's, for the tests that
// forge): as CostRecorder signs.
std::string signed_line(json j, const security::NodeKey& key) {
  const std::string text = cost_record_signed_text(j);
  j["sig"] = security::base64_encode(key.sign(kCostRecordDomain, text));
  j["cert"] = security::base64_encode(key.cert_der());
  return j.dump();
}

json record(const std::string& node, const std::string& role, uint64_t round,
            const std::string& start = "2026-11-25T07:00:00Z",
            const std::string& end = "2026-11-25T07:00:10Z") {
  return {{"v", 2},         {"job", "unit-sign"}, {"node", node}, {"role", role},
          {"round", round}, {"start", start},     {"end", end},   {"links", json::object()}};
}

json site_record(const std::string& node, uint64_t round, double seconds, uint64_t devices,
                 uint64_t sent, uint64_t received) {
  json j = record(node, "site", round);
  j["train_seconds"] = seconds;
  j["devices"] = devices;
  j["device"] = "gpu";
  j["contributed"] = true;
  j["links"] = {{"eu", {{"sent", sent}, {"received", received}}}};
  return j;
}

CostLedger read(const std::string& jsonl, CostTrust trust) {
  CostLedger l(trust);
  std::istringstream in(jsonl);
  l.read(in, "costs.jsonl");
  return l;
}

CostTrust against_ca() {
  static const auto verifier = TestPki::get().verifier();
  CostTrust t;
  t.ca = verifier.get();
  t.job = "unit-sign";
  return t;
}

CostTrust on_their_word() {
  CostTrust t;
  t.on_their_word = true;
  return t;
}

TEST(CostRecorder, WritesSignedRecordsOnlyItsOwnerCanRead) {
  const testing::TempDir dir;
  const std::string path = (dir / "site-a" / "costs.jsonl").string();
  CostRecorder rec(path, "unit-sign", "site-a", "site", TestPki::get().key("site-a"));
  rec.set_devices(2, "gpu");
  rec.trained(0.25);
  rec.sent("eu", 1000);
  rec.received("eu", 2000);
  rec.round_ended(0, true);
  rec.sent("eu", 10);
  rec.round_ended(1, true);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const CostLedger l = read(text.str(), against_ca());
  EXPECT_TRUE(l.refusals().empty()) << l.refusals()[0].reason;
  EXPECT_EQ(l.verified(), 2u);
  ASSERT_EQ(l.records().size(), 2u);
  const CostRecord& r0 = l.records().at({"site-a", 0});
  EXPECT_EQ(r0.job, "unit-sign");
  EXPECT_EQ(r0.device_us, 500000u);
  EXPECT_EQ(r0.links.at("eu").sent, 1000u);
  EXPECT_EQ(l.records().at({"site-a", 1}).links.at("eu").sent, 10u);
}

TEST(CostLedger, ARecordIsBilledOnlyToTheNodeWhoseKeySignedIt) {
  const auto site_a = TestPki::get().key("site-a");
  const auto site_b = TestPki::get().key("site-b");
  const std::string a0 = signed_line(site_record("site-a", 0, 5, 1, 100, 200), *site_a);
  const std::string b0 = signed_line(site_record("site-b", 0, 5, 1, 300, 400), *site_b);
  // site-a's file: its own record, site-b's genuine one copied in, and
  // forgeries naming site-b.
  json edited = json::parse(b0);
  edited["train_seconds"] = 36000;  // site-b's signature no longer covers it
  json stripped = site_record("site-b", 1, 36000, 8, 1, 1);
  json schema1 = stripped;
  schema1["v"] = 1;
  schema1.erase("job");
  json other_job = site_record("site-a", 2, 1, 1, 1, 1);
  other_job["job"] = "another";
  const std::string file =
      a0 + "\n" + b0 + "\n" +
      signed_line(site_record("site-b", 1, 36000, 8, uint64_t{1} << 40, 0), *site_a) + "\n" +
      edited.dump() + "\n" + stripped.dump() + "\n" + schema1.dump() + "\n" +
      signed_line(other_job, *site_a) + "\n" + b0 + "\n";
  const CostLedger l = read(file, against_ca());
  ASSERT_EQ(l.records().size(), 2u);
  EXPECT_EQ(l.records().at({"site-a", 0}).links.at("eu").sent, 100u);
  EXPECT_EQ(l.records().at({"site-b", 0}).links.at("eu").sent, 300u);  // genuine: billed to b
  EXPECT_EQ(l.duplicates(), 1u);                                       // b0 twice
  const std::vector<CostRefusal>& refused = l.refusals();
  ASSERT_EQ(refused.size(), 5u);
  EXPECT_EQ(refused[0].origin, "costs.jsonl:3");
  EXPECT_EQ(refused[0].node, "site-b");
  EXPECT_NE(refused[0].reason.find("not signed by site-b"), std::string::npos) << refused[0].reason;
  EXPECT_NE(refused[1].reason.find("not signed by site-b"), std::string::npos) << refused[1].reason;
  EXPECT_NE(refused[2].reason.find("unsigned"), std::string::npos) << refused[2].reason;
  EXPECT_NE(refused[3].reason.find("schema 1"), std::string::npos) << refused[3].reason;
  EXPECT_NE(refused[4].reason.find("job 'another'"), std::string::npos) << refused[4].reason;
  // Without the bill's job, the signer's certificate still binds the job.
  CostTrust any_job = against_ca();
  any_job.job.clear();
  const CostLedger l2 = read(signed_line(other_job, *site_a), any_job);
  ASSERT_EQ(l2.refusals().size(), 1u);
  EXPECT_NE(l2.refusals()[0].reason.find("not signed by site-a"), std::string::npos);
}

TEST(CostLedger, NeedsACaOrToBeToldToTakeRecordsOnTheirWord) {
  EXPECT_THROW(CostLedger{CostTrust{}}, ConfigError);
  const CostLedger l = read(site_record("site-b", 1, 1, 1, 1, 1).dump(), on_their_word());
  EXPECT_EQ(l.records().size(), 1u);
  EXPECT_EQ(l.verified(), 0u);
}

// region eu's record of round `round`, with its children's bytes.
json region_record(uint64_t round, const std::string& start, const std::string& end,
                   const json& links) {
  json j = record("eu", "region", round, start, end);
  j["links"] = links;
  return j;
}

TEST(CostChecks, TrainingTimeIsBoundedByTheParentsRoundAndTheTopologysDevices) {
  // The round lasted 0.133 s at eu (from the end of its round 0).
  const std::string lines =
      region_record(0, "2026-11-25T07:00:00Z", "2026-11-25T07:00:10Z", json::object()).dump() +
      "\n" +
      region_record(1, "2026-11-25T07:00:10Z", "2026-11-25T07:00:10.133Z", json::object()).dump() +
      "\n" + site_record("site-a", 1, 1e9, 1000, 0, 0).dump() + "\n" +
      site_record("site-b", 1, 0.1, 1, 0, 0).dump() + "\n" +
      site_record("site-a", 0, 9.5, 1, 0, 0).dump() + "\n";
  const CostLedger l = read(lines, on_their_word());
  const CheckedCosts c = check_costs(l, &TestPki::get().topology());
  ASSERT_EQ(c.refused.size(), 1u);
  EXPECT_EQ(c.refused[0].node, "site-a");
  EXPECT_EQ(*c.refused[0].round, 1u);
  EXPECT_NE(c.refused[0].reason.find("which lasted 0.133 s (eu's record"), std::string::npos)
      << c.refused[0].reason;
  EXPECT_EQ(c.wall_from_parent, 2u);  // site-b round 1, site-a round 0
  uint64_t device_us = 0;
  for (const CostRecord& r : c.billed) device_us += r.device_us;
  EXPECT_EQ(device_us, 9600000u);

  // Devices: the topology allows site-a 2.
  const Topology topo = Topology::parse(R"(job: unit-sign
nodes:
  - {id: root, role: root, endpoint: "ipc:///tmp/unit-sign-root"}
  - {id: eu, role: region, parent: root, endpoint: "ipc:///tmp/unit-sign-eu"}
  - {id: site-a, role: site, parent: eu, devices: 2}
  - {id: site-b, role: site, parent: eu}
)");
  const CostLedger l2 = read(site_record("site-a", 0, 1, 8, 0, 0).dump() + "\n" +
                                 site_record("site-a", 1, 1, 2, 0, 0).dump() + "\n" +
                                 site_record("site-b", 0, 1, 8, 0, 0).dump() + "\n" +
                                 site_record("site-z", 0, 1, 1, 0, 0).dump(),
                             on_their_word());
  const CheckedCosts c2 = check_costs(l2, &topo);
  ASSERT_EQ(c2.refused.size(), 2u);
  EXPECT_EQ(c2.refused[0].reason, "claims 8 devices; the topology allows site-a 2");
  EXPECT_EQ(c2.refused[1].node, "site-z");
  EXPECT_NE(c2.refused[1].reason.find("not a node of the topology"), std::string::npos);
  EXPECT_EQ(c2.devices_from_topology, 1u);  // site-a round 1; site-b's 8 are declared
  EXPECT_EQ(c2.device_records, 2u);

  // An aggregator trains on nothing.
  json agg = region_record(0, "2026-11-25T07:00:00Z", "2026-11-25T07:00:10Z", json::object());
  agg["train_seconds"] = 5;
  agg["devices"] = 1;
  agg["device"] = "gpu";
  const CheckedCosts c3 = check_costs(read(agg.dump(), on_their_word()), nullptr);
  ASSERT_EQ(c3.refused.size(), 1u);
  EXPECT_NE(c3.refused[0].reason.find("a region trains on no device"), std::string::npos);
}

TEST(CostChecks, LinkBytesAreBilledAtTheParentsCountAndMismatchesReported) {
  // site-a rewrote its records to zero; site-b's file is lost; eu counted both.
  json links0 = {{"site-a", {{"sent", 7000}, {"received", 3003966}}},
                 {"site-b", {{"sent", 7000}, {"received", 2000000}}}};
  json links1 = {{"site-a", {{"sent", 100}, {"received", 500}}},
                 {"site-b", {{"sent", 100}, {"received", 400}}}};
  const std::string lines =
      region_record(0, "2026-11-25T07:00:00Z", "2026-11-25T07:00:10Z", links0).dump() + "\n" +
      region_record(1, "2026-11-25T07:00:10Z", "2026-11-25T07:00:20Z", links1).dump() + "\n" +
      site_record("site-a", 0, 1, 1, 0, 0).dump() + "\n" +
      site_record("site-a", 1, 1, 1, 0, 0).dump() + "\n";
  const CostLedger l = read(lines, on_their_word());
  for (const Topology* topo : {&TestPki::get().topology(), static_cast<const Topology*>(nullptr)}) {
    const CheckedCosts c = check_costs(l, topo);
    const CostBill b = bill_costs(c.billed, CostRates{}, 0);
    std::map<std::string, const CostLine*> by_node;
    for (const CostLine& line : b.nodes) by_node[line.node] = &line;
    ASSERT_TRUE(by_node.count("site-a"));
    EXPECT_EQ(by_node["site-a"]->sent, 3003966u + 500u);
    EXPECT_EQ(by_node["site-a"]->received, 7100u);
    EXPECT_EQ(by_node["site-a"]->device_us_total, 2000000u);  // its own, declared
    const LinkReconciliation* a = nullptr;
    for (const LinkReconciliation& r : c.links) {
      if (r.child == "site-a") a = &r;
    }
    ASSERT_NE(a, nullptr);
    EXPECT_TRUE(a->mismatch);
    EXPECT_EQ(a->child_sent, 0u);
    EXPECT_EQ(a->parent_received, 3004466u);
    EXPECT_EQ(a->rounds_both, 2u);
    if (topo) {
      // Known from the topology: site-b, with no record at all, is billed its bytes too.
      ASSERT_TRUE(by_node.count("site-b"));
      EXPECT_EQ(by_node["site-b"]->sent, 2000400u);
      EXPECT_EQ(by_node["site-b"]->rounds, 2u);
      EXPECT_EQ(by_node["site-b"]->device_us_total, 0u);
    } else {
      EXPECT_FALSE(by_node.count("site-b"));  // nothing says it is eu's child
    }
    EXPECT_EQ(by_node["eu"]->sent, 14200u);  // eu's own count
  }
  // Within the tolerance: no mismatch.
  const std::string close =
      region_record(0, "2026-11-25T07:00:00Z", "2026-11-25T07:00:10Z", links0).dump() + "\n" +
      site_record("site-a", 0, 1, 1, 3003966 + 1000, 7000).dump() + "\n";
  const CheckedCosts c = check_costs(read(close, on_their_word()), &TestPki::get().topology());
  ASSERT_EQ(c.links.size(), 2u);  // site-a's, and site-b's from eu's count alone
  EXPECT_EQ(c.links[0].child, "site-a");
  EXPECT_FALSE(c.links[0].mismatch);
  EXPECT_EQ(c.links[1].rounds_parent_only, 1u);
  EXPECT_FALSE(c.links[1].mismatch);
}

}  // namespace
}  // namespace fedwan::costs
