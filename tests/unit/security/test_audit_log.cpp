// The audit log writer (security/audit_log.hpp): appended entries form one
// hash chain that verifies, across reopens and concurrent appends; what it
// refuses; recovery of a torn entry; signed heads checked against the CA;
// and a full disk.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "audit_log_test_util.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "harness/test_pki.hpp"
#include "harness/tiny_disk.hpp"
#include "security/audit_log.hpp"
#include "security/node_key.hpp"

namespace fedwan::security {
namespace {

using nlohmann::json;

TEST(AuditLog, AppendedEntriesVerify) {
  TempLog tmp;
  const std::string text = write_log(tmp.path(), 5);
  const std::vector<std::string> lines = split_lines(text);
  ASSERT_EQ(lines.size(), 5u);
  for (size_t i = 0; i < lines.size(); ++i) {
    const json j = json::parse(lines[i]);
    EXPECT_EQ(j["seq"], i);
    EXPECT_EQ(j["node"], "eu");
    EXPECT_EQ(j["event"], "update");
    EXPECT_EQ(j["fields"]["round"], i);
    EXPECT_EQ(j["prev"], i == 0 ? kZeros : hash_of(lines[i - 1]));
    // The documented key order and the hash over the bytes before ,"hash".
    EXPECT_EQ(lines[i].rfind("{\"seq\":", 0), 0u);
    const size_t cut = lines[i].find(",\"hash\":\"");
    const std::string prefix = lines[i].substr(0, cut);
    const Sha256Digest d = sha256(prefix.data(), prefix.size());
    EXPECT_EQ(j["hash"], to_hex(d.data(), d.size()));
    const std::string time = j["time"];
    EXPECT_EQ(time.size(), 24u);
    EXPECT_EQ(time.back(), 'Z');
  }
  const AuditVerifyResult r = verify_audit_file(tmp.path());
  EXPECT_TRUE(r.ok) << r.problem;
  EXPECT_EQ(r.entries, 5u);
  EXPECT_EQ(r.first_bad_line, 0u);
  EXPECT_EQ(r.last_hash, hash_of(lines.back()));
  EXPECT_EQ(verify_audit_text(text).entries, 5u);
}

TEST(AuditLog, EmptyLogVerifiesWithZeroEntries) {
  TempLog tmp;
  {
    AuditLog log(tmp.path(), "eu");
    EXPECT_EQ(log.entries(), 0u);
  }
  const AuditVerifyResult r = verify_audit_file(tmp.path());
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.entries, 0u);
  EXPECT_EQ(r.last_hash, kZeros);
  EXPECT_TRUE(verify_audit_text("").ok);
}

TEST(AuditLog, FileIsPrivateToTheOwner) {
  TempLog tmp;
  write_log(tmp.path(), 1);
  const auto perms = std::filesystem::status(tmp.path()).permissions();
  EXPECT_EQ(perms & (std::filesystem::perms::group_all | std::filesystem::perms::others_all),
            std::filesystem::perms::none);
}

TEST(AuditLog, ReopenContinuesTheChain) {
  TempLog tmp;
  const std::string first = write_log(tmp.path(), 3);
  {
    AuditLog log(tmp.path(), "us");
    EXPECT_EQ(log.entries(), 3u);
    log.append("round_end", json{{"round", 7}});
    log.append("round_end", json::object());
    EXPECT_EQ(log.entries(), 5u);
  }
  const std::string text = read_file(tmp.path());
  EXPECT_EQ(text.substr(0, first.size()), first) << "reopening must not rewrite old entries";
  const std::vector<std::string> lines = split_lines(text);
  ASSERT_EQ(lines.size(), 5u);
  const json fourth = json::parse(lines[3]);
  EXPECT_EQ(fourth["seq"], 3);
  EXPECT_EQ(fourth["prev"], hash_of(lines[2]));
  EXPECT_EQ(fourth["node"], "us");
  const AuditVerifyResult r = verify_audit_file(tmp.path());
  EXPECT_TRUE(r.ok) << r.problem;
  EXPECT_EQ(r.entries, 5u);
}

TEST(AuditLog, SecondWriterOnTheSameFileIsRefused) {
  TempLog tmp;
  AuditLog log(tmp.path(), "eu");
  EXPECT_THROW(AuditLog(tmp.path(), "eu"), ConfigError);
  log.append("e", json::object());
  EXPECT_TRUE(verify_audit_file(tmp.path()).ok);
}

TEST(AuditLog, FieldsMustBeAnObject) {
  TempLog tmp;
  AuditLog log(tmp.path(), "eu");
  EXPECT_THROW(log.append("e", json::array({1, 2})), ConfigError);
  EXPECT_THROW(log.append("e", json(3)), ConfigError);
  EXPECT_EQ(log.entries(), 0u);
  EXPECT_EQ(read_file(tmp.path()), "");
}

TEST(AuditLog, OversizedOrTooDeepEntriesAreRefused) {
  TempLog tmp;
  AuditLog log(tmp.path(), "eu");
  EXPECT_THROW(log.append("e", json{{"blob", std::string(kAuditMaxLineBytes, 'x')}}), ConfigError);
  json deep = json::object();
  for (size_t i = 0; i < kAuditMaxNesting; ++i) deep = json{{"d", deep}};
  EXPECT_THROW(log.append("e", deep), ConfigError);
  log.append("e", json{{"ok", true}});
  const AuditVerifyResult r = verify_audit_file(tmp.path());
  EXPECT_TRUE(r.ok) << r.problem;
  EXPECT_EQ(r.entries, 1u);
}

TEST(AuditLog, UnusualValuesRoundTrip) {
  TempLog tmp;
  {
    AuditLog log(tmp.path(), "n\"ode\\\x01");
    log.append("ev\n\t", json{{"f", 0.1},
                              {"neg", -5},
                              {"big", UINT64_MAX},
                              {"nan", std::nan("")},
                              {"utf8", "\xc3\xa9\xf0\x9f\x94\x92"},
                              {"bad_utf8", "\xff\xfe"},
                              {"nested", json{{"b", json::array({1, nullptr, "x"})}, {"a", 1}}},
                              {"hash", ",\"hash\":\"x\""}});
    log.append("e", json::object());
  }
  const AuditVerifyResult r = verify_audit_file(tmp.path());
  EXPECT_TRUE(r.ok) << r.problem;
  EXPECT_EQ(r.entries, 2u);
}

TEST(AuditLog, ConcurrentAppendsFormOneChain) {
  TempLog tmp;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  {
    AuditLog log(tmp.path(), "eu");
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&log, t] {
        for (int i = 0; i < kPerThread; ++i) log.append("update", json{{"thread", t}, {"i", i}});
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(log.entries(), static_cast<uint64_t>(kThreads * kPerThread));
  }
  const AuditVerifyResult r = verify_audit_file(tmp.path());
  EXPECT_TRUE(r.ok) << "line " << r.first_bad_line << ": " << r.problem;
  EXPECT_EQ(r.entries, static_cast<uint64_t>(kThreads * kPerThread));
  // Each thread's own entries keep their order.
  std::vector<int> next(kThreads, 0);
  for (const std::string& line : split_lines(read_file(tmp.path()))) {
    const json f = json::parse(line)["fields"];
    EXPECT_EQ(f["i"], next[f["thread"].get<int>()]++);
  }
}

TEST(AuditLog, TamperedFileIsNotAppendedTo) {
  TempLog tmp;
  std::vector<std::string> lines = split_lines(write_log(tmp.path(), 5));
  const size_t at = lines[2].find("site-2");
  ASSERT_NE(at, std::string::npos);
  lines[2][at + 5] = '9';
  const std::string tampered = join_lines(lines);
  write_file(tmp.path(), tampered);
  try {
    AuditLog log(tmp.path(), "eu");
    FAIL() << "opened a tampered log for appending";
  } catch (const CryptoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("line 3"), std::string::npos) << what;
    EXPECT_NE(what.find("edited"), std::string::npos) << what;
    EXPECT_NE(what.find("refusing to append to a tampered log"), std::string::npos) << what;
    EXPECT_NE(what.find(tmp.path()), std::string::npos) << what;
  }
  EXPECT_EQ(read_file(tmp.path()), tampered);
}

TEST(AuditLog, TornLastEntryIsRecoveredWithAMarker) {
  TempLog tmp;
  const std::string text = write_log(tmp.path(), 3);
  const std::string torn = text.substr(0, text.size() - 20);
  write_file(tmp.path(), torn);
  const std::string whole = text.substr(0, text.rfind('\n', text.size() - 2) + 1);
  {
    AuditLog log(tmp.path(), "eu");
    log.append("after", json{{"k", 1}});
  }
  // The torn bytes are kept aside; the chain goes on from the last whole
  // entry, and says what happened.
  EXPECT_EQ(read_file(tmp.path() + ".torn-2"), torn.substr(whole.size()));
  const std::string now = read_file(tmp.path());
  EXPECT_EQ(now.substr(0, whole.size()), whole);
  const AuditVerifyResult r = verify_audit_text(now);
  ASSERT_TRUE(r.ok) << r.problem;
  EXPECT_EQ(r.entries, 4u);
  EXPECT_NE(now.find("\"event\":\"audit_recovered\""), std::string::npos);
  EXPECT_NE(now.find("\"torn_bytes\":" + std::to_string(torn.size() - whole.size())),
            std::string::npos);
  std::filesystem::remove(tmp.path() + ".torn-2");
}

// ---- signed heads, anchors, failures ------------------------------------------

using fedwan::testing::TestPki;

AuditOptions signing(const std::string& node) {
  AuditOptions o;
  o.key = TestPki::get().key(node);
  return o;
}

std::vector<std::string> read_lines(const std::string& path) {
  return split_lines(read_file(path));
}

// Rebuilds `lines` as one chain from seq 0, in the writer's form, after
// `edit` changed the parsed entries: what someone who can write the file
// but holds no key can do.
std::string rechain(const std::vector<std::string>& lines,
                    const std::function<void(size_t, json&)>& edit) {
  std::vector<std::string> out;
  std::string prev = kZeros;
  for (size_t i = 0; i < lines.size(); ++i) {
    json j = json::parse(lines[i]);
    edit(i, j);
    const std::string prefix = "{\"seq\":" + std::to_string(i) + ",\"time\":" + j["time"].dump() +
                               ",\"node\":" + j["node"].dump() + ",\"event\":" + j["event"].dump() +
                               ",\"fields\":" + j["fields"].dump() + ",\"prev\":\"" + prev + "\"";
    out.push_back(hashed_line(prefix));
    prev = hash_of(out.back());
  }
  return join_lines(out);
}

TEST(SignedAudit, HeadsAreSignedAtOpenAndCloseAndVerifyAgainstTheCa) {
  TempLog tmp;
  {
    AuditLog log(tmp.path(), "eu", signing("eu"));
    log.append("update", json{{"round", 0}});
  }
  {
    AuditLog log(tmp.path(), "eu", signing("eu"));
    log.append("update", json{{"round", 1}});
  }
  const std::vector<std::string> lines = read_lines(tmp.path());
  ASSERT_EQ(lines.size(), 6u);  // opened, update, closed, resumed, update, closed
  EXPECT_EQ(json::parse(lines[0])["event"], "audit_opened");
  EXPECT_EQ(json::parse(lines[2])["event"], "audit_closed");
  const json resumed = json::parse(lines[3]);
  EXPECT_EQ(resumed["event"], "audit_resumed");
  EXPECT_EQ(resumed["fields"]["from_seq"], 2);
  EXPECT_EQ(resumed["fields"]["from_hash"], json::parse(lines[2])["hash"]);
  // Each process's first signed head carries its certificate.
  EXPECT_TRUE(json::parse(lines[0])["fields"].contains("cert"));
  EXPECT_TRUE(json::parse(lines[3])["fields"].contains("cert"));
  EXPECT_FALSE(json::parse(lines[2])["fields"].contains("cert"));

  const auto ca = TestPki::get().verifier();
  AuditVerifyOptions o;
  o.ca = ca.get();
  const AuditVerifyResult r = verify_audit_file(tmp.path(), o);
  ASSERT_TRUE(r.ok) << r.problem;
  EXPECT_EQ(r.signed_heads, 4u);
  EXPECT_EQ(r.verified_heads, 4u);
  EXPECT_TRUE(r.closed);
  EXPECT_EQ(r.signer, "eu");
}

TEST(SignedAudit, HeadsComeAtIntervalsWhileEntriesKeepComing) {
  TempLog tmp;
  AuditOptions o = signing("eu");
  o.head_interval = std::chrono::seconds(0);
  {
    AuditLog log(tmp.path(), "eu", o);
    for (int i = 0; i < 3; ++i) log.append("update", json{{"round", i}});
  }
  size_t heads = 0;
  for (const std::string& l : read_lines(tmp.path()))
    heads += json::parse(l)["event"] == "audit_head";
  EXPECT_EQ(heads, 3u);
}

// The finding: a log rewritten and re-hashed verified, and so did one cut
// short. The CA catches the first, a recorded head the second.
TEST(SignedAudit, ARechainedOrTruncatedLogIsRefused) {
  TempLog tmp;
  {
    AuditLog log(tmp.path(), "eu", signing("eu"));
    for (int i = 0; i < 5; ++i) log.append("update", json{{"round", i}});
  }
  const std::vector<std::string> lines = read_lines(tmp.path());  // opened, 5 updates, closed
  ASSERT_EQ(lines.size(), 7u);
  const auto ca = TestPki::get().verifier();
  AuditVerifyOptions with_ca;
  with_ca.ca = ca.get();
  ASSERT_TRUE(verify_audit_file(tmp.path(), with_ca).ok);

  // Re-chained: an update edited, every hash after it recomputed. The chain
  // alone cannot tell; the closing head's signature can.
  const std::string rechained = rechain(lines, [](size_t i, json& j) {
    if (i == 2) j["fields"]["round"] = 999;
  });
  EXPECT_TRUE(verify_audit_text(rechained).ok);
  AuditVerifyResult r = verify_audit_text(rechained, with_ca);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("signed head does not verify"), std::string::npos) << r.problem;
  EXPECT_EQ(r.first_bad_line, 7u);
  // Dropping the signed heads as well leaves nothing the CA can check.
  std::vector<std::string> unsigned_lines(lines.begin() + 1, lines.end() - 1);
  r = verify_audit_text(rechain(unsigned_lines, [](size_t, json&) {}), with_ca);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("no signed head"), std::string::npos) << r.problem;

  // Truncated: the last entries removed. The chain verifies and the log
  // says it is not closed; the recorded head settles it.
  const std::string recorded = hash_of(lines.back());
  const std::vector<std::string> cut(lines.begin(), lines.end() - 2);
  r = verify_audit_text(join_lines(cut), with_ca);
  EXPECT_TRUE(r.ok);
  EXPECT_FALSE(r.closed);
  AuditVerifyOptions expect;
  expect.expect_head = recorded;
  r = verify_audit_text(join_lines(cut), expect);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("does not contain the recorded head"), std::string::npos) << r.problem;
  EXPECT_TRUE(verify_audit_file(tmp.path(), expect).ok);
}

TEST(SignedAudit, AnEmptyOrUnsignedLogCannotPassACaCheck) {
  const auto ca = TestPki::get().verifier();
  AuditVerifyOptions o;
  o.ca = ca.get();
  AuditVerifyResult r = verify_audit_text("", o);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("empty"), std::string::npos);
  TempLog tmp;
  write_log(tmp.path(), 3);
  r = verify_audit_file(tmp.path(), o);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("no signed head"), std::string::npos) << r.problem;
}

TEST(SignedAudit, ContainsFindsARecordedHead) {
  TempLog tmp;
  AuditLog log(tmp.path(), "eu", signing("eu"));
  log.append("update", json{{"round", 1}});
  const auto head = log.head();
  ASSERT_TRUE(head.has_value());
  EXPECT_TRUE(log.contains(head->seq, head->hash));
  EXPECT_FALSE(log.contains(head->seq, std::string(64, 'a')));
  EXPECT_FALSE(log.contains(head->seq + 5, head->hash));
}

// A full disk is an alarm, not a crash: entries wait in memory, the file
// never ends in a torn entry, and once there is room again everything that
// waited is written, followed by an audit_outage entry.
TEST(AuditFailures, AFullDiskHoldsEntriesAndRecordsTheOutage) {
  fedwan::testing::TinyDisk disk(32 * 1024);
  if (!disk.mounted()) GTEST_SKIP() << "needs root to mount a tmpfs";
  const std::string path = (disk.path() / "eu.jsonl").string();
  AuditOptions o;
  o.max_waiting_entries = 50;
  o.retry_every = std::chrono::milliseconds(0);
  AuditLog log(path, "eu", o);
  log.append("update", json{{"round", 0}});
  disk.fill();
  for (int i = 1; i <= 80; ++i)
    log.append("update", json{{"round", i}, {"pad", std::string(200, 'x')}});
  // The file's last page may still take a few entries before ENOSPC.
  const uint64_t written = log.entries() - 1;
  AuditHealth h = log.health();
  EXPECT_FALSE(h.writable);
  EXPECT_GE(h.failed_writes, 1u);
  EXPECT_EQ(h.waiting, 50u);
  EXPECT_GE(h.lost, 1u);
  EXPECT_EQ(written + h.waiting + h.lost, 80u);  // every entry accounted for
  EXPECT_NE(h.last_error.find("No space left"), std::string::npos) << h.last_error;
  EXPECT_FALSE(log.sync());
  EXPECT_TRUE(verify_audit_file(path).ok);  // never a torn entry
  const uint64_t lost_before = h.lost;
  disk.free();
  log.retry();
  h = log.health();
  EXPECT_TRUE(h.writable) << h.last_error;
  EXPECT_EQ(h.waiting, 0u);
  EXPECT_TRUE(log.sync());
  const AuditVerifyResult r = verify_audit_file(path);
  ASSERT_TRUE(r.ok) << r.problem;
  EXPECT_EQ(r.entries, 1u + written + 50u + 1u);
  const uint64_t lost = h.lost;
  const std::vector<std::string> lines = read_lines(path);
  const json outage = json::parse(lines.back());
  EXPECT_EQ(outage["event"], "audit_outage");
  EXPECT_EQ(outage["fields"]["lost"]["update"], lost_before);
  EXPECT_EQ(lost, lost_before);
}

}  // namespace
}  // namespace fedwan::security
