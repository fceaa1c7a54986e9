// The chaos-test report: rows merged by scenario across objects and
// processes, rendered as JSON and Markdown.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "harness/chaos_report.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;

class ChaosReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "fedwan-chaos-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ / "sub" / "report.json";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static std::string text(const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  static ChaosRow row(const std::string& scenario, bool passed = true) {
    ChaosRow r;
    r.scenario = scenario;
    r.mechanism = "fault-injecting proxy";
    r.rpo_rounds = 0;
    r.rto_seconds = 1.25;
    r.passed = passed;
    return r;
  }

  fs::path dir_;
  fs::path path_;
};

TEST_F(ChaosReportTest, WritesJsonAndAMarkdownTableNextToIt) {
  ChaosRow unmeasured;
  unmeasured.scenario = "region-partition";
  unmeasured.mechanism = "netns+veth";
  unmeasured.notes = "quorum 0.5 | deadline 3 s\nsecond line";
  ChaosReport report(path_);
  report.record(row("root-crash"));
  report.record(unmeasured);
  EXPECT_TRUE(report.pending().empty());

  const std::vector<ChaosRow> rows = ChaosReport::read(path_);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].scenario, "region-partition");  // sorted by scenario
  EXPECT_FALSE(rows[0].rpo_rounds.has_value());
  EXPECT_FALSE(rows[0].rto_seconds.has_value());
  EXPECT_EQ(rows[0].notes, unmeasured.notes);
  EXPECT_EQ(rows[1].scenario, "root-crash");
  EXPECT_EQ(rows[1].rpo_rounds, 0u);
  EXPECT_EQ(rows[1].rto_seconds, 1.25);
  EXPECT_TRUE(rows[1].passed);

  EXPECT_EQ(report.markdown_path(), dir_ / "sub" / "report.md");
  const std::string md = text(report.markdown_path());
  EXPECT_NE(md.find("| root-crash | fault-injecting proxy | 0 | 1.25 | pass |  |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| region-partition | netns+veth | n/a | n/a | **FAIL** | quorum 0.5 \\| "
                    "deadline 3 s second line |"),
            std::string::npos)
      << md;
  const std::string json = text(path_);
  EXPECT_NE(json.find("\"format\": \"fedwan-chaos-report\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"rpo_rounds\": null"), std::string::npos) << json;
}

TEST_F(ChaosReportTest, LaterRowsReplaceEarlierOnesForTheSameScenario) {
  {
    ChaosReport a(path_);
    a.add(row("site-loss"));
    a.add(row("dup-and-reorder"));
  }  // the destructor flushes
  ChaosReport b(path_);
  ChaosRow again = row("site-loss", false);
  again.notes = "rerun";
  b.record(again);
  const std::vector<ChaosRow> rows = ChaosReport::read(path_);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].scenario, "dup-and-reorder");
  EXPECT_EQ(rows[1].scenario, "site-loss");
  EXPECT_FALSE(rows[1].passed);
  EXPECT_EQ(rows[1].notes, "rerun");
}

TEST_F(ChaosReportTest, ParallelProcessesEachAddTheirRows) {
  constexpr int kProcesses = 4;
  constexpr int kRows = 8;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        for (int i = 0; i < kRows; ++i) {
          ChaosReport r(path_);
          r.record(row("p" + std::to_string(p) + "-row" + std::to_string(i)));
        }
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(ChaosReport::read(path_).size(), size_t{kProcesses} * kRows);
}

TEST_F(ChaosReportTest, AFileThatDoesNotParseIsMovedAside) {
  fs::create_directories(path_.parent_path());
  std::ofstream(path_) << "{not json";
  EXPECT_THROW(ChaosReport::read(path_), std::runtime_error);
  ChaosReport(path_).record(row("after-corruption"));
  ASSERT_EQ(ChaosReport::read(path_).size(), 1u);
  EXPECT_EQ(text(path_.string() + ".corrupt"), "{not json");
}

TEST_F(ChaosReportTest, PathComesFromTheEnvironment) {
  const char* old = std::getenv("FEDWAN_CHAOS_REPORT");
  const std::string saved = old ? old : "";
  ::setenv("FEDWAN_CHAOS_REPORT", path_.c_str(), 1);
  EXPECT_EQ(ChaosReport::default_path(), path_);
  EXPECT_EQ(ChaosReport().json_path(), path_);
  ::unsetenv("FEDWAN_CHAOS_REPORT");
  EXPECT_EQ(ChaosReport::default_path(), fs::path("chaos_report.json"));
  if (old) ::setenv("FEDWAN_CHAOS_REPORT", saved.c_str(), 1);
}

}  // namespace
}  // namespace fedwan::testing
