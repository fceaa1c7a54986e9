// Audit log verification (security/audit_log.hpp): every edit, deletion,
// insertion, reordering or truncation of a written log, and malformed or
// hostile lines, are reported at the first line where they show.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "audit_log_test_util.hpp"
#include "fedwan/error.hpp"
#include "security/audit_log.hpp"

namespace fedwan::security {
namespace {

using nlohmann::json;

std::string prefix_with(const std::string& seq,
                        const std::string& time = "\"2026-11-22T10:00:00.123Z\"",
                        const std::string& fields = "{}",
                        const std::string& prev = "\"" + kZeros + "\"") {
  return "{\"seq\":" + seq + ",\"time\":" + time +
         ",\"node\":\"eu\",\"event\":\"e\",\"fields\":" + fields + ",\"prev\":" + prev;
}

TEST(AuditVerify, UnreadableFileIsAConfigError) {
  EXPECT_THROW(verify_audit_file("/nonexistent/fedwan/audit.jsonl"), ConfigError);
  EXPECT_THROW(verify_audit_file(std::filesystem::temp_directory_path().string()), ConfigError);
}

// Writes a 5-entry log, applies `edit` to its lines and verifies the text.
template <typename Edit>
AuditVerifyResult verify_edited(Edit edit) {
  TempLog tmp;
  std::vector<std::string> lines = split_lines(write_log(tmp.path(), 5));
  edit(lines);
  return verify_audit_text(join_lines(lines));
}

TEST(AuditVerify, EditedFieldIsReportedAtItsLine) {
  const AuditVerifyResult r = verify_edited([](std::vector<std::string>& l) {
    const size_t at = l[2].find("\"round\":2");
    ASSERT_NE(at, std::string::npos);
    l[2][at + 8] = '3';
  });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad_line, 3u);
  EXPECT_EQ(r.entries, 2u);
  EXPECT_NE(r.problem.find("entry was edited (hash mismatch)"), std::string::npos) << r.problem;
}

TEST(AuditVerify, EditedHashIsReported) {
  const AuditVerifyResult r = verify_edited([](std::vector<std::string>& l) {
    char& c = l[1][l[1].size() - 3];
    c = c == '0' ? '1' : '0';
  });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad_line, 2u);
  EXPECT_NE(r.problem.find("edited"), std::string::npos) << r.problem;
}

TEST(AuditVerify, DeletedLineIsReportedAtTheNextLine) {
  const AuditVerifyResult r =
      verify_edited([](std::vector<std::string>& l) { l.erase(l.begin() + 2); });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad_line, 3u);
  EXPECT_EQ(r.entries, 2u);
  EXPECT_NE(r.problem.find("inserted or removed before this line"), std::string::npos) << r.problem;
  EXPECT_NE(r.problem.find("expected seq 2"), std::string::npos) << r.problem;
}

TEST(AuditVerify, InsertedCopyIsReported) {
  const AuditVerifyResult r =
      verify_edited([](std::vector<std::string>& l) { l.insert(l.begin() + 3, l[1]); });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad_line, 4u);
  EXPECT_EQ(r.entries, 3u);
  EXPECT_NE(r.problem.find("inserted or removed"), std::string::npos) << r.problem;
}

TEST(AuditVerify, DuplicatedLineIsReported) {
  const AuditVerifyResult r =
      verify_edited([](std::vector<std::string>& l) { l.insert(l.begin() + 2, l[1]); });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad_line, 3u);
  EXPECT_NE(r.problem.find("inserted or removed"), std::string::npos) << r.problem;
}

TEST(AuditVerify, ReorderedLinesAreReported) {
  const AuditVerifyResult r =
      verify_edited([](std::vector<std::string>& l) { std::swap(l[1], l[2]); });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad_line, 2u);
  EXPECT_EQ(r.entries, 1u);
  EXPECT_NE(r.problem.find("inserted or removed"), std::string::npos) << r.problem;
}

TEST(AuditVerify, RemovedFirstLineIsReported) {
  const AuditVerifyResult r =
      verify_edited([](std::vector<std::string>& l) { l.erase(l.begin()); });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad_line, 1u);
  EXPECT_EQ(r.entries, 0u);
  EXPECT_NE(r.problem.find("first entry is not the start of the chain"), std::string::npos)
      << r.problem;
  EXPECT_NE(r.problem.find("removed from the beginning"), std::string::npos) << r.problem;
}

TEST(AuditVerify, RemovedTrailingLinesStillVerify) {
  // Documented limit: truncation at an entry boundary leaves a valid chain;
  // only the last hash, anchored elsewhere, shows it.
  TempLog tmp;
  std::vector<std::string> lines = split_lines(write_log(tmp.path(), 5));
  const std::string full_last = verify_audit_text(join_lines(lines)).last_hash;
  lines.pop_back();
  const AuditVerifyResult r = verify_audit_text(join_lines(lines));
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.entries, 4u);
  EXPECT_NE(r.last_hash, full_last);
}

TEST(AuditVerify, TruncatedLastLineIsIncomplete) {
  TempLog tmp;
  const std::string text = write_log(tmp.path(), 3);
  for (size_t cut :
       {size_t{1}, size_t{2}, size_t{40}, text.size() - split_lines(text)[0].size() - 2}) {
    const AuditVerifyResult r = verify_audit_text(text.substr(0, text.size() - cut));
    EXPECT_FALSE(r.ok) << "cut " << cut;
    EXPECT_TRUE(r.incomplete_last_line) << "cut " << cut;
    EXPECT_NE(r.problem.find("last entry is incomplete"), std::string::npos) << r.problem;
    EXPECT_NE(r.problem.find("likely a crash during write"), std::string::npos) << r.problem;
  }
  const AuditVerifyResult r = verify_audit_text(text.substr(0, text.size() - 1));
  EXPECT_EQ(r.first_bad_line, 3u);
  EXPECT_EQ(r.entries, 2u);
  write_file(tmp.path(), text.substr(0, text.size() - 1));
  const AuditVerifyResult f = verify_audit_file(tmp.path());
  EXPECT_TRUE(f.incomplete_last_line);
  EXPECT_EQ(f.first_bad_line, 3u);
}

TEST(AuditVerify, GarbageIsMalformed) {
  TempLog tmp;
  const std::string good = write_log(tmp.path(), 2);
  const std::vector<std::string> bad = {
      "hello",        "",     "\r", "[1,2,3]",   "42",
      "\"string\"",   "null", "{}", "{\"seq\":", std::string("{\"seq\":0\0}", 10),
      "\xff\xfe\xfd",
  };
  for (const std::string& b : bad) {
    for (const std::string& text : {b + "\n", good + b + "\n"}) {
      const AuditVerifyResult r = verify_audit_text(text);
      EXPECT_FALSE(r.ok) << json(b).dump(-1, ' ', false, json::error_handler_t::replace);
      EXPECT_EQ(r.first_bad_line, text == b + "\n" ? 1u : 3u);
      EXPECT_NE(r.problem.find("malformed entry"), std::string::npos) << r.problem;
    }
  }
  // CRLF line endings change the bytes after the hash.
  std::string crlf;
  for (const std::string& l : split_lines(good)) crlf += l + "\r\n";
  EXPECT_FALSE(verify_audit_text(crlf).ok);
}

TEST(AuditVerify, WrongTypesAreMalformedEvenWithAValidHash) {
  const std::string q = "\"";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {hashed_line(prefix_with("\"0\"")), "\"seq\""},
      {hashed_line(prefix_with("-1")), "\"seq\""},
      {hashed_line(prefix_with("0.0")), "\"seq\""},
      {hashed_line(prefix_with("18446744073709551616")), "\"seq\""},  // 2^64: a float
      {hashed_line(prefix_with("1e300")), "\"seq\""},
      {hashed_line(prefix_with("0", "0")), "\"time\""},
      {hashed_line(prefix_with("0", "\"yesterday\"")), "\"time\""},
      {hashed_line(prefix_with("0", "\"2026-11-22 10:00:00.123Z\"")), "\"time\""},
      {hashed_line(prefix_with("0", "\"2026-11-22T10:00:00.123Z\"", "[]")), "\"fields\""},
      {hashed_line(prefix_with("0", "\"2026-11-22T10:00:00.123Z\"", "{}", "null")), "\"prev\""},
      {hashed_line(
           prefix_with("0", "\"2026-11-22T10:00:00.123Z\"", "{}", q + std::string(63, '0') + q)),
       "\"prev\""},
      {hashed_line(
           prefix_with("0", "\"2026-11-22T10:00:00.123Z\"", "{}", q + std::string(64, 'A') + q)),
       "\"prev\""},
      {hashed_line(prefix_with("0") + ",\"extra\":1"), "unexpected key"},
      {"{\"seq\":0,\"time\":\"2026-11-22T10:00:00.123Z\",\"node\":\"eu\",\"event\":\"e\","
       "\"fields\":{},\"prev\":\"" +
           kZeros + "\",\"hash\":7}",
       "\"hash\""},
  };
  for (const auto& [line, what] : cases) {
    const AuditVerifyResult r = verify_audit_text(line + "\n");
    EXPECT_FALSE(r.ok) << line;
    EXPECT_EQ(r.first_bad_line, 1u);
    EXPECT_NE(r.problem.find("malformed entry"), std::string::npos) << line << ": " << r.problem;
    EXPECT_NE(r.problem.find(what), std::string::npos) << line << ": " << r.problem;
  }
  // A well-formed hand-made entry passes, so the cases above fail for their own reason.
  EXPECT_TRUE(verify_audit_text(hashed_line(prefix_with("0")) + "\n").ok);
}

TEST(AuditVerify, HugeSeqAtTheStartIsNotTheStartOfTheChain) {
  const AuditVerifyResult r =
      verify_audit_text(hashed_line(prefix_with("18446744073709551615")) + "\n");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("first entry is not the start"), std::string::npos) << r.problem;
}

TEST(AuditVerify, NonCanonicalButCorrectlyHashedLineIsMalformed) {
  // Same values as a good entry, with a space: the hash was recomputed, but the
  // line is not what the writer produces.
  const std::string spaced = hashed_line(
      "{\"seq\": 0,\"time\":\"2026-11-22T10:00:00.123Z\",\"node\":\"eu\",\"event\":\"e\","
      "\"fields\":{},\"prev\":\"" +
      kZeros + "\"");
  const AuditVerifyResult r = verify_audit_text(spaced + "\n");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("not in the form the writer produces"), std::string::npos) << r.problem;
}

TEST(AuditVerify, DeepNestingAndLongLinesAreRejectedWithoutCrashing) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  AuditVerifyResult r = verify_audit_text(deep + "\n");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("nested"), std::string::npos) << r.problem;
  r = verify_audit_text(
      prefix_with("0", "\"2026-11-22T10:00:00.123Z\"", "{\"a\":" + std::string(100000, '{')) +
      "\n");
  EXPECT_FALSE(r.ok);
  r = verify_audit_text(std::string(kAuditMaxLineBytes + 1, ' ') + "\n");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("longer than"), std::string::npos) << r.problem;
  TempLog tmp;
  write_file(tmp.path(), std::string(3 * kAuditMaxLineBytes, 'x'));
  r = verify_audit_file(tmp.path());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problem.find("longer than"), std::string::npos) << r.problem;
}

TEST(AuditVerify, OnlyTheFirstProblemIsReported) {
  const AuditVerifyResult r = verify_edited([](std::vector<std::string>& l) {
    l[3] = "garbage";
    l.erase(l.begin() + 1);
  });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_bad_line, 2u);
  EXPECT_EQ(r.entries, 1u);
  EXPECT_NE(r.problem.find("inserted or removed"), std::string::npos) << r.problem;
}

TEST(AuditVerify, EverySingleByteChangeIsDetected) {
  TempLog tmp;
  const std::string text = write_log(tmp.path(), 3);
  ASSERT_TRUE(verify_audit_text(text).ok);
  for (size_t i = 0; i < text.size(); ++i) {
    for (char c : {'0', '1', 'a', ' ', '"', '\n', '}', '\0'}) {
      if (text[i] == c) continue;
      std::string t = text;
      t[i] = c;
      EXPECT_FALSE(verify_audit_text(t).ok) << "byte " << i << " set to " << int(c);
    }
    std::string without = text;
    without.erase(i, 1);
    EXPECT_FALSE(verify_audit_text(without).ok) << "byte " << i << " removed";
  }
}

TEST(AuditVerify, FileAndTextAgree) {
  TempLog tmp;
  std::vector<std::string> lines = split_lines(write_log(tmp.path(), 400));
  lines[300] = lines[299];
  const std::string text = join_lines(lines);
  write_file(tmp.path(), text);
  const AuditVerifyResult a = verify_audit_text(text);
  const AuditVerifyResult b = verify_audit_file(tmp.path());
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.first_bad_line, 301u);
  EXPECT_EQ(b.first_bad_line, a.first_bad_line);
  EXPECT_EQ(b.entries, a.entries);
  EXPECT_EQ(b.problem, a.problem);
  EXPECT_EQ(b.last_hash, a.last_hash);
}

}  // namespace
}  // namespace fedwan::security
