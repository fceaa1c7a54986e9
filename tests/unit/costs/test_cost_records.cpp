// `fedwan costs`' rules (costs/cost_ledger.hpp, cost_bill.hpp): records,
// rates, the bill and its split into windows, on strings, with records taken
// on their word (test_cost_checks.cpp has signatures and cross-checks);
// tests/integration/test_costs_cli.py runs the command itself.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/utc_time.hpp"
#include "costs/cost_bill.hpp"
#include "costs/cost_ledger.hpp"
#include "fedwan/error.hpp"
#include "harness/error_message.hpp"

namespace fedwan::costs {
namespace {

using nlohmann::json;

const char* const kSiteLine =
    R"({"v":1,"node":"site-0","role":"site","round":3,"start":"2026-11-25T07:00:00.123Z",)"
    R"("end":"2026-11-25T07:00:12.600Z","train_seconds":12.25,"devices":2,"device":"gpu",)"
    R"("contributed":true,"links":{"region-0":{"sent":123456,"received":456789}},"extra":[1]})";

using testing::config_error;

json record(const std::string& node, const std::string& role, uint64_t round) {
  return {{"v", 1},
          {"node", node},
          {"role", role},
          {"round", round},
          {"start", "2026-11-25T07:00:00Z"},
          {"end", "2026-11-25T07:00:10Z"}};
}

CostLedger ledger_of(const std::string& jsonl) {
  CostTrust trust;
  trust.on_their_word = true;
  CostLedger l(trust);
  std::istringstream in(jsonl);
  l.read(in, "costs.jsonl");
  return l;
}

std::vector<CostRecord> records_of(const CostLedger& l) {
  std::vector<CostRecord> out;
  for (const auto& entry : l.records()) out.push_back(entry.second);
  return out;
}

CostBill bill_of(const std::string& jsonl, const CostRates& rates, int64_t window) {
  return bill_costs(records_of(ledger_of(jsonl)), rates, window);
}

TEST(CostRecords, ParsesASiteRecordAndIgnoresUnknownFields) {
  const CostRecord r = parse_cost_record(kSiteLine, "a/costs.jsonl:1");
  EXPECT_EQ(r.node, "site-0");
  EXPECT_EQ(r.role, "site");
  EXPECT_EQ(r.round, 3u);
  EXPECT_EQ(r.end_time.seconds, 1795590012);
  EXPECT_EQ(r.end_time.nanos, 600000000u);
  EXPECT_EQ(r.train_seconds, 12.25);
  EXPECT_EQ(r.devices, 2u);
  EXPECT_EQ(r.device, "gpu");
  EXPECT_TRUE(r.contributed);
  EXPECT_EQ(r.device_us, 24500000u);  // 12.25 s on 2 devices
  ASSERT_EQ(r.links.count("region-0"), 1u);
  EXPECT_EQ(r.links.at("region-0").sent, 123456u);
  EXPECT_EQ(r.links.at("region-0").received, 456789u);
  EXPECT_EQ(r.origin, "a/costs.jsonl:1");
}

TEST(CostRecords, AnAggregatorsMissingFieldsAreZero) {
  json j = record("region-0", "region", 0);
  j["links"] = {{"root", {{"sent", 10}, {"received", 20}}}};
  const CostRecord r = parse_cost_record(j.dump(), "x:1");
  EXPECT_EQ(r.train_seconds, 0);
  EXPECT_EQ(r.devices, 0u);
  EXPECT_EQ(r.device, "");
  EXPECT_FALSE(r.contributed);
  EXPECT_EQ(r.device_us, 0u);
}

TEST(CostRecords, RefusesOtherSchemaVersions) {
  json j = record("site-0", "site", 0);
  j["v"] = 3;
  const std::string e = config_error([&] { parse_cost_record(j.dump(), "r/costs.jsonl:9"); });
  EXPECT_EQ(e.rfind("r/costs.jsonl:9: schema version 3 is not supported", 0), 0u) << e;
  EXPECT_NE(e.find("reads cost records of versions 1 to 2"), std::string::npos) << e;
  j["v"] = 2;  // version 2 names its job
  EXPECT_NE(config_error([&] { parse_cost_record(j.dump(), "x:1"); }).find("no \"job\""),
            std::string::npos);
  j["job"] = "demo";
  EXPECT_EQ(parse_cost_record(j.dump(), "x:1").job, "demo");
  j.erase("v");
  EXPECT_NE(config_error([&] { parse_cost_record(j.dump(), "x:1"); }).find("no \"v\""),
            std::string::npos);
}

TEST(CostRecords, BadLinesSayWhereAndWhatIsWrong) {
  const auto with = [](const char* key, const json& value) {
    json j = record("site-0", "site", 1);
    if (value.is_null()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return j.dump();
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"v\":1,\"node\":", "not valid JSON"},
      {"[1,2]", "not a JSON object"},
      {std::string(40, '[') + std::string(40, ']'), "nested deeper"},
      {with("node", nullptr), "no \"node\""},
      {with("node", ""), "\"node\" must be a non-empty string"},
      {with("role", "edge"), "\"role\" must be site, region or root, got \"edge\""},
      {with("round", -1), "\"round\" must be a non-negative integer, got -1"},
      {with("round", 1.5), "\"round\" must be a non-negative integer, got 1.5"},
      {with("end", "2026-11-25 07:00:10"), "\"end\" \"2026-11-25 07:00:10\" is not a UTC time"},
      {with("end", "2026-11-25T07:00:10+01:00"), "is not a UTC time"},
      {with("start", "2026-02-30T07:00:00Z"), "\"start\" \"2026-02-30T07:00:00Z\" is not a valid"},
      {with("end", "2026-11-25T06:59:59Z"), "\"end\" 2026-11-25T06:59:59Z is before \"start\""},
      {with("train_seconds", -1), "\"train_seconds\" must be a non-negative number"},
      {with("train_seconds", "12"), "\"train_seconds\" must be a non-negative number"},
      {with("devices", 1.5), "\"devices\" must be a non-negative integer"},
      {with("device", "tpu"), "\"device\" must be cpu or gpu, got \"tpu\""},
      {with("contributed", 1), "\"contributed\" must be true or false"},
      {with("links", json::array()), "\"links\" must be an object"},
      {with("links", {{"root", {{"sent", 1}}}}), "\"links.root\" must be {\"sent\""},
      {with("links", {{"root", {{"sent", -5}, {"received", 0}}}}),
       "\"links.root.sent\" must be a non-negative integer, got -5"},
  };
  for (const auto& [line, what] : cases) {
    const std::string e = config_error([&] { parse_cost_record(line, "d/costs.jsonl:7"); });
    EXPECT_EQ(e.rfind("d/costs.jsonl:7: ", 0), 0u) << line << " -> " << e;
    EXPECT_NE(e.find(what), std::string::npos) << line << " -> " << e;
  }
  json no_kind = record("site-0", "site", 1);
  no_kind["train_seconds"] = 3;
  no_kind["devices"] = 1;
  EXPECT_NE(config_error([&] {
              parse_cost_record(no_kind.dump(), "x:1");
            }).find("no \"device\": cpu or gpu is needed"),
            std::string::npos);
  no_kind["devices"] = 0;  // no device time: nothing to price
  EXPECT_EQ(parse_cost_record(no_kind.dump(), "x:1").device_us, 0u);
}

TEST(CostRecords, ReadsUtcTimes) {
  UtcTime t;
  std::string why;
  ASSERT_TRUE(parse_utc("2024-02-29T23:59:59.5Z", &t, &why)) << why;
  EXPECT_EQ(t.seconds, 1709251199);
  EXPECT_EQ(t.nanos, 500000000u);
  ASSERT_TRUE(parse_utc("1969-12-31T23:00:00Z", &t, &why));
  EXPECT_EQ(t.seconds, -3600);
  EXPECT_FALSE(parse_utc("2026-02-29T00:00:00Z", &t, &why));  // not a leap year
  EXPECT_FALSE(parse_utc("2026-11-25T24:00:00Z", &t, &why));
  EXPECT_FALSE(parse_utc("2026-11-25T07:00:00.Z", &t, &why));
  EXPECT_FALSE(parse_utc("2026-11-25T07:00:00.1234567891Z", &t, &why));
  EXPECT_FALSE(parse_utc("2026-11-25T07:00:00z", &t, &why));
  EXPECT_EQ(utc_text(1795590000), "2026-11-25T07:00:00Z");
  EXPECT_EQ(utc_text(-3600), "1969-12-31T23:00:00Z");
  EXPECT_EQ(utc_text(1709251199), "2024-02-29T23:59:59Z");
}

TEST(CostLedger, AnIdenticalDuplicateIsCountedOnce) {
  const std::string line = std::string(kSiteLine) + "\n";
  const CostLedger l = ledger_of(line + line);
  EXPECT_EQ(l.records().size(), 1u);
  EXPECT_EQ(l.lines_read(), 2u);
  EXPECT_EQ(l.duplicates(), 1u);
  const CostBill b = bill_costs(records_of(l), CostRates{}, 0);
  EXPECT_EQ(b.totals.rounds, 1u);
  EXPECT_EQ(b.totals.sent, 123456u);
  EXPECT_EQ(b.totals.device_us_total, 24500000u);
}

TEST(CostLedger, OfTwoDifferentRecordsOfARoundTheLargerIsBilledAndBothReported) {
  json a = json::parse(kSiteLine);
  json b = a;
  b["links"]["region-0"]["sent"] = 123457;
  CostLedger l = ledger_of(a.dump() + "\n\n" + b.dump() + "\n");
  ASSERT_EQ(l.conflicts().size(), 1u);
  EXPECT_EQ(l.conflicts()[0].billed_origin, "costs.jsonl:3");  // more bytes sent
  EXPECT_EQ(l.conflicts()[0].other_origin, "costs.jsonl:1");
  EXPECT_EQ(l.conflicts()[0].difference, "links.region-0.sent (123456 vs 123457)");
  EXPECT_EQ(l.records().at({"site-0", 3}).links.at("region-0").sent, 123457u);
  // Device time first: the record claiming more of it, in either order.
  b = a;
  b["train_seconds"] = 12.5;
  b["links"]["region-0"]["sent"] = 1;
  for (const std::string& text : {a.dump() + "\n" + b.dump(), b.dump() + "\n" + a.dump()}) {
    l = ledger_of(text);
    ASSERT_EQ(l.conflicts().size(), 1u);
    EXPECT_EQ(l.records().at({"site-0", 3}).train_seconds, 12.5);
    EXPECT_NE(l.conflicts()[0].difference.find("train_seconds"), std::string::npos);
  }
}

TEST(CostLedger, ANodeKeepsOneRole) {
  const CostLedger l =
      ledger_of(record("n", "site", 0).dump() + "\n" + record("n", "region", 1).dump() + "\n");
  EXPECT_EQ(l.records().size(), 1u);
  ASSERT_EQ(l.refusals().size(), 1u);
  EXPECT_EQ(l.refusals()[0].origin, "costs.jsonl:2");
  EXPECT_EQ(l.refusals()[0].reason,
            "node n is a region here but a site at costs.jsonl:1: one node has one role");
}

TEST(CostLedger, ABadLineIsRefusedAndTheRestStillCounts) {
  const std::string good = record("site-0", "site", 0).dump();
  CostLedger l = ledger_of(good + "\r\n\r\n  \n" + record("site-0", "site", 1).dump());
  EXPECT_EQ(l.records().size(), 2u);
  EXPECT_TRUE(l.refusals().empty());
  l = ledger_of(good + "\n\n{oops\n" + record("site-0", "site", 1).dump() + "\n");
  EXPECT_EQ(l.records().size(), 2u);
  ASSERT_EQ(l.refusals().size(), 1u);
  EXPECT_EQ(l.refusals()[0].origin, "costs.jsonl:3");
  EXPECT_EQ(l.refusals()[0].reason.rfind("not valid JSON", 0), 0u) << l.refusals()[0].reason;
  const std::string long_line(kCostMaxLineBytes + 10, ' ');
  l = ledger_of(good + "\n" + long_line + "\n" + record("site-0", "site", 1).dump());
  EXPECT_EQ(l.records().size(), 2u);
  ASSERT_EQ(l.refusals().size(), 1u);
  EXPECT_EQ(l.refusals()[0].origin, "costs.jsonl:2");
  EXPECT_EQ(l.refusals()[0].reason, "line longer than 1 MiB: not a cost record");
}

const char* const kRates = R"(currency: EUR
device_hour:
  default: {cpu: 0.04, gpu: 2.10}
  site-1: {gpu: 1.60}
egress_gb:
  default: 0.08
  site-0: 0.05
  "region-0->root": 0.02
  region-0: 0.07
)";

TEST(CostRates, ALinkOverANodeOverTheDefault) {
  const CostRates r = parse_cost_rates(kRates, "rates.yaml");
  EXPECT_EQ(r.currency, "EUR");
  EXPECT_EQ(r.egress_rate("region-0", "root"), 0.02);    // the link over its node
  EXPECT_EQ(r.egress_rate("region-0", "site-0"), 0.07);  // the node over the default
  EXPECT_EQ(r.egress_rate("site-0", "region-0"), 0.05);  // the node
  EXPECT_EQ(r.egress_rate("root", "region-0"), 0.08);    // the default
  EXPECT_EQ(r.device_hour_rate("site-1", "gpu"), 1.60);  // the node
  EXPECT_EQ(r.device_hour_rate("site-1", "cpu"), 0.04);  // the default, kind by kind
  EXPECT_EQ(r.device_hour_rate("site-0", "gpu"), 2.10);
}

TEST(CostRates, WhatIsLeftOutCostsNothing) {
  const CostRates empty = parse_cost_rates("", "rates.yaml");
  EXPECT_EQ(empty.currency, "units");
  EXPECT_EQ(empty.egress_rate("a", "b"), 0);
  EXPECT_EQ(empty.device_hour_rate("a", "gpu"), 0);
  const CostRates some = parse_cost_rates("device_hour:\n  site-1: {gpu: 3}\negress_gb:\n", "r");
  EXPECT_EQ(some.device_hour_rate("site-2", "gpu"), 0);
  EXPECT_EQ(some.device_hour_rate("site-1", "cpu"), 0);
  EXPECT_EQ(some.egress_rate("site-1", "root"), 0);
}

TEST(CostRates, BadRatesSayWhereAndWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"egress_gb:\n  default: -0.1\n", "rates.yaml:2:12: egress_gb.default: a rate must be a "
                                        "non-negative number, got '-0.1'"},
      {"egress_gb:\n  default: cheap\n", "rates.yaml:2:12: egress_gb.default: a rate must be a "
                                         "non-negative number, got 'cheap'"},
      {"egress_gb:\n  default: .nan\n", "got '.nan'"},
      {"egress_gb:\n  default: [1]\n", "got ''"},
      {"currency: EUR\nprices: {}\n",
       "rates.yaml:2:1: unknown top-level key 'prices'; known keys are currency, device_hour, "
       "egress_gb"},
      {"device_hour:\n  default: {tpu: 1}\n",
       "rates.yaml:2:13: device_hour.default: unknown device kind 'tpu'; known kinds are cpu, gpu"},
      {"device_hour:\n  default: 2.1\n", "device_hour.default: expected a mapping"},
      {"egress_gb:\n  site-0: 1\n  site-0: 2\n", "rates.yaml:3:3: egress_gb: key 'site-0' given "
                                                 "twice"},
      {"egress_gb:\n  \"->root\": 1\n", "is neither a node nor a link"},
      {"- 1\n", "rates: expected a mapping"},
      {"egress_gb: {default: 1\n", "rates.yaml:2:1: not valid YAML"},
  };
  for (const auto& [text, what] : cases) {
    const std::string e = config_error([&] { parse_cost_rates(text, "rates.yaml"); });
    EXPECT_NE(e.find(what), std::string::npos) << text << " -> " << e;
    EXPECT_EQ(e.rfind("rates.yaml:", 0), 0u) << e;
  }
}

TEST(CostRates, NamesKeysThatMatchNoNode) {
  json site = record("site-0", "site", 0);
  site["links"] = {{"region-0", {{"sent", 1}, {"received", 1}}}};
  const std::vector<CostRecord> l = records_of(ledger_of(site.dump()));
  const CostRates r =
      parse_cost_rates("device_hour:\n  site0: {gpu: 1}\negress_gb:\n  default: 1\n  site-0: 1\n"
                       "  site-0->region-0: 1\n  site-0->root: 1\n",
                       "r");
  EXPECT_EQ(r.unmatched(l),
            (std::vector<std::string>{"device_hour.site0", "egress_gb.site-0->root"}));
}

TEST(CostBill, PricesDeviceTimeAtTheSiteAndEgressAtTheSender) {
  json site = record("site-1", "site", 0);
  site["train_seconds"] = 1800;
  site["devices"] = 2;
  site["device"] = "gpu";
  site["links"] = {{"region-0", {{"sent", 500000000}, {"received", 2000000000}}}};
  json region = record("region-0", "region", 0);
  region["links"] = {{"site-1", {{"sent", 2000000000}, {"received", 500000000}}},
                     {"root", {{"sent", 1000000000}, {"received", 1000000000}}}};
  const CostBill b = bill_of(site.dump() + "\n" + region.dump(), parse_cost_rates(kRates, "r"), 0);
  ASSERT_EQ(b.nodes.size(), 2u);
  const CostLine& r = b.nodes[0];  // by name: region-0, site-1
  const CostLine& s = b.nodes[1];
  EXPECT_EQ(s.device_hours(), 1.0);
  EXPECT_DOUBLE_EQ(s.device_cost, 1.60);  // site-1's own GPU price
  EXPECT_DOUBLE_EQ(s.egress_cost, 0.5 * 0.08);
  EXPECT_EQ(r.device_cost, 0);
  EXPECT_DOUBLE_EQ(r.links.at("site-1").cost, 2 * 0.07);
  EXPECT_DOUBLE_EQ(r.links.at("root").cost, 1 * 0.02);
  EXPECT_DOUBLE_EQ(r.egress_cost, 0.14 + 0.02);
  EXPECT_EQ(b.totals.sent, 3500000000u);
  EXPECT_EQ(b.totals.received, 3500000000u);
  EXPECT_DOUBLE_EQ(b.totals.total_cost, 1.60 + 0.04 + 0.16);
  EXPECT_TRUE(b.windows.empty());
}

// 3 sites x 20 rounds under one region and a root, random but seeded, over
// two hours; what each node wrote, summed here independently.
struct Federation {
  std::string jsonl;
  std::map<std::string, uint64_t> rounds, contributed, device_us, sent, received;
  std::map<std::string, uint64_t> sent_in_hour[2];
  std::map<std::string, uint64_t> device_us_in_hour[2];
};

Federation random_federation(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  Federation f;
  const int64_t t0 = 1795590000 + 30;  // 07:00:30 UTC; round k ends 6k + 5 minutes later
  for (uint64_t round = 0; round < 20; ++round) {
    const int64_t end = t0 + static_cast<int64_t>(round) * 360 + 300;
    const int hour = end >= 1795590000 + 3600 ? 1 : 0;
    const auto add = [&](json j) {
      const std::string node = j["node"];
      j["start"] = utc_text(end - 300);
      j["end"] = utc_text(end);
      f.jsonl += j.dump() + "\n";
      ++f.rounds[node];
      for (const auto& link : j["links"].items()) {
        f.sent[node] += link.value()["sent"].get<uint64_t>();
        f.received[node] += link.value()["received"].get<uint64_t>();
        f.sent_in_hour[hour][node] += link.value()["sent"].get<uint64_t>();
      }
    };
    uint64_t up = 0, down = 0;
    for (int s = 0; s < 3; ++s) {
      const std::string node = "site-" + std::to_string(s);
      json j = record(node, "site", round);
      const uint64_t ms = pick(1000, 600000);
      const uint64_t devices = pick(1, 8);
      j["train_seconds"] = static_cast<double>(ms) / 1000;
      j["devices"] = devices;
      j["device"] = s == 2 ? "cpu" : "gpu";
      const bool contributed = pick(0, 9) != 0;
      j["contributed"] = contributed;
      const uint64_t sent = pick(0, uint64_t{1} << 40), received = pick(0, uint64_t{1} << 40);
      up += sent;
      down += received;
      j["links"] = {{"region-0", {{"sent", sent}, {"received", received}}}};
      f.contributed[node] += contributed;
      f.device_us[node] += ms * 1000 * devices;
      f.device_us_in_hour[hour][node] += ms * 1000 * devices;
      add(j);
    }
    json region = record("region-0", "region", round);
    const uint64_t root_up = pick(0, 1u << 30), root_down = pick(0, 1u << 30);
    region["links"] = {{"site-0", {{"sent", down / 3}, {"received", up / 3}}},
                       {"site-1", {{"sent", down / 3}, {"received", up / 3}}},
                       {"site-2", {{"sent", down - 2 * (down / 3)}, {"received", up - up / 3}}},
                       {"root", {{"sent", root_up}, {"received", root_down}}}};
    add(region);
    json root = record("root", "root", round);
    root["links"] = {{"region-0", {{"sent", root_down}, {"received", root_up}}}};
    add(root);
  }
  return f;
}

TEST(CostBill, TotalsEqualThePerRoundSums) {
  for (uint64_t seed : {1, 2, 3}) {
    const Federation f = random_federation(seed);
    const CostRates rates = parse_cost_rates(kRates, "r");
    const CostBill b = bill_of(f.jsonl, rates, 0);
    EXPECT_EQ(b.records, 100u);
    ASSERT_EQ(b.nodes.size(), 5u);
    uint64_t rounds = 0, sent = 0, received = 0, device_us = 0, contributed = 0;
    double money = 0;
    for (const CostLine& l : b.nodes) {
      SCOPED_TRACE(l.node);
      EXPECT_EQ(l.rounds, f.rounds.at(l.node));
      EXPECT_EQ(l.contributed, f.contributed.count(l.node) ? f.contributed.at(l.node) : 0);
      EXPECT_EQ(l.device_us_total, f.device_us.count(l.node) ? f.device_us.at(l.node) : 0);
      EXPECT_EQ(l.sent, f.sent.at(l.node));
      EXPECT_EQ(l.received, f.received.at(l.node));
      // The price, from the independent sums and the rates by hand.
      const double device = l.node == "site-2"   ? 0.04
                            : l.node == "site-1" ? 1.60
                            : l.node == "site-0" ? 2.10
                                                 : 0;
      double expected = static_cast<double>(l.device_us_total) / 3.6e9 * device;
      for (const auto& [peer, use] : l.links) {
        const double rate = l.node == "site-0"                       ? 0.05
                            : l.node == "region-0" && peer == "root" ? 0.02
                            : l.node == "region-0"                   ? 0.07
                                                                     : 0.08;
        expected += static_cast<double>(use.bytes.sent) / 1e9 * rate;
      }
      EXPECT_NEAR(l.total_cost, expected, 1e-12 * expected);
      rounds += l.rounds;
      sent += l.sent;
      received += l.received;
      device_us += l.device_us_total;
      contributed += l.contributed;
      money += l.total_cost;
    }
    EXPECT_EQ(b.totals.rounds, rounds);
    EXPECT_EQ(b.totals.sent, sent);
    EXPECT_EQ(b.totals.received, received);
    EXPECT_EQ(b.totals.device_us_total, device_us);
    EXPECT_EQ(b.totals.contributed, contributed);
    EXPECT_EQ(b.totals.total_cost, money);  // the same additions, in node order
    EXPECT_EQ(b.totals.devices.at("gpu").us + b.totals.devices.at("cpu").us, device_us);
  }
}

TEST(CostBill, WindowsPartitionTheTotalsExactly) {
  const Federation f = random_federation(7);
  const CostBill b = bill_of(f.jsonl, parse_cost_rates(kRates, "r"), 3600);
  ASSERT_EQ(b.windows.size(), 2u);
  EXPECT_EQ(utc_text(b.windows[0].start), "2026-11-25T07:00:00Z");
  EXPECT_EQ(utc_text(b.windows[1].end), "2026-11-25T09:00:00Z");
  uint64_t rounds = 0, sent = 0, device_us = 0, contributed = 0;
  double money = 0;
  for (int h = 0; h < 2; ++h) {
    const CostWindowBill& w = b.windows[h];
    for (const CostLine& l : w.nodes) {
      EXPECT_EQ(l.sent, f.sent_in_hour[h].at(l.node)) << l.node;
      const auto us = f.device_us_in_hour[h].find(l.node);
      EXPECT_EQ(l.device_us_total, us == f.device_us_in_hour[h].end() ? 0 : us->second);
    }
    rounds += w.totals.rounds;
    sent += w.totals.sent;
    device_us += w.totals.device_us_total;
    contributed += w.totals.contributed;
    money += w.totals.total_cost;
  }
  EXPECT_EQ(rounds, b.totals.rounds);
  EXPECT_EQ(sent, b.totals.sent);
  EXPECT_EQ(device_us, b.totals.device_us_total);
  EXPECT_EQ(contributed, b.totals.contributed);
  // Money is priced per window from its integer sums: equal up to rounding.
  EXPECT_NEAR(money, b.totals.total_cost, 1e-12 * b.totals.total_cost);
}

TEST(CostBill, ARecordBelongsToTheWindowHoldingItsEnd) {
  json a = record("site-0", "site", 0), c = record("site-0", "site", 1);
  a["start"] = "2026-11-25T05:59:00Z";
  a["end"] = "2026-11-25T05:59:59.999Z";
  c["start"] = "2026-11-25T05:59:00Z";
  c["end"] = "2026-11-25T06:00:00Z";
  const CostBill b = bill_of(a.dump() + "\n" + c.dump(), CostRates{}, 6 * 3600);
  ASSERT_EQ(b.windows.size(), 2u);
  EXPECT_EQ(utc_text(b.windows[0].start), "2026-11-25T00:00:00Z");
  EXPECT_EQ(utc_text(b.windows[1].start), "2026-11-25T06:00:00Z");
  EXPECT_EQ(b.windows[0].totals.rounds, 1u);
  EXPECT_EQ(b.windows[1].totals.rounds, 1u);
  EXPECT_EQ(cost_window_seconds("1d"), 86400);
  EXPECT_NE(config_error([] { cost_window_seconds("2h"); }), "");
}

}  // namespace
}  // namespace fedwan::costs
