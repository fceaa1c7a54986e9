// Shared by the audit log tests: temporary log files, whole-file and
// line-wise reads and writes, and logs and lines written for the verifier.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sha256.hpp"
#include "security/audit_log.hpp"

namespace fedwan::security {

inline const std::string kZeros(64, '0');

// A fresh path under the temp directory, removed when the test ends.
class TempLog {
 public:
  TempLog() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() /
             ("fedwan_audit_" + std::string(info->name()) + "_" + std::to_string(::getpid()) + "_" +
              std::to_string(counter++) + ".jsonl"))
                .string();
    std::filesystem::remove(path_);
  }
  ~TempLog() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// Writes `n` entries with fields {"round": i, "peer": "site-i"} and returns the text.
inline std::string write_log(const std::string& path, int n, const std::string& node = "eu") {
  AuditLog log(path, node);
  for (int i = 0; i < n; ++i) {
    log.append("update", nlohmann::json{{"round", i}, {"peer", "site-" + std::to_string(i)}});
  }
  log.sync();
  return read_file(path);
}

// A line with a correct hash over an arbitrary prefix, so a test can reach the
// checks behind the hash check.
inline std::string hashed_line(const std::string& prefix) {
  const Sha256Digest d = sha256(prefix.data(), prefix.size());
  return prefix + ",\"hash\":\"" + to_hex(d.data(), d.size()) + "\"}";
}

inline std::string hash_of(const std::string& line) { return nlohmann::json::parse(line)["hash"]; }

}  // namespace fedwan::security
