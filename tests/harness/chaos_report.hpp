// The chaos-test report: one row per scenario (what was broken, how, how
// much training was lost, how long until the federation made progress
// again), kept in a JSON file and rendered as a Markdown table next to it
// (same path, extension .md).
//
// Separate test processes (ctest -j) each add their rows: flush() takes an
// exclusive flock on "<json>.lock", reads the file, replaces the rows whose
// scenario it has, writes both files (each through a temporary file and a
// rename, so a reader never sees half a file) and unlocks. The path comes
// from FEDWAN_CHAOS_REPORT, else "chaos_report.json" in the current
// directory (ctest runs tests in the build directory).
//
// JSON: {"format":"fedwan-chaos-report","version":1,"rows":[{"scenario",
// "mechanism","rpo_rounds","rto_seconds","passed","notes"}...]}, rows sorted
// by scenario, null for a measure that was not taken.
//
// Thread safety: a ChaosReport belongs to one thread; several objects, in
// this process or others, may flush to one file at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fedwan::testing {

struct ChaosRow {
  std::string scenario;   // the key: a later row for the same scenario replaces it
  std::string mechanism;  // how the fault was made: "netns+veth", "fault-injecting proxy", ...
  std::optional<uint64_t> rpo_rounds;  // rounds of training lost; nullopt: not measured
  std::optional<double> rto_seconds;   // from the fault until progress again; nullopt: none
  bool passed = false;
  std::string notes;
};

class ChaosReport {
 public:
  static constexpr const char* kFormat = "fedwan-chaos-report";
  static constexpr int kVersion = 1;

  explicit ChaosReport(std::filesystem::path json_path = default_path())
      : path_(std::move(json_path)) {}
  // Flushes rows still pending, best effort (a destructor cannot report).
  ~ChaosReport();
  ChaosReport(const ChaosReport&) = delete;
  ChaosReport& operator=(const ChaosReport&) = delete;

  // $FEDWAN_CHAOS_REPORT, else ./chaos_report.json.
  static std::filesystem::path default_path();

  const std::filesystem::path& json_path() const { return path_; }
  std::filesystem::path markdown_path() const;

  // Queues a row (replacing a queued one for the same scenario) until flush().
  void add(ChaosRow row);
  // add() then flush().
  void record(ChaosRow row) {
    add(std::move(row));
    flush();
  }
  const std::vector<ChaosRow>& pending() const { return pending_; }

  // Merges the queued rows into the files, under the lock. A file that does
  // not parse is moved aside to "<json>.corrupt" and replaced. Throws
  // std::runtime_error on an I/O failure (the rows stay queued).
  void flush();

  // The rows in a report file; empty when it does not exist. Throws
  // std::runtime_error when it exists but is not a report of this version.
  static std::vector<ChaosRow> read(const std::filesystem::path& path);
  static nlohmann::json to_json(const std::vector<ChaosRow>& rows);
  static std::string markdown(const std::vector<ChaosRow>& rows);

 private:
  [[noreturn]] static void fail(const std::string& what);

  // A table cell: no line breaks, pipes escaped.
  static std::string cell(const std::string& s);
  static void write_atomically(const std::filesystem::path& path, const std::string& text);

  std::filesystem::path path_;
  std::vector<ChaosRow> pending_;
};

}  // namespace fedwan::testing
