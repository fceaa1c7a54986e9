// Structured logs: each line names the node and its round (a LogScope on the
// node's thread, else the process's node), as text or as one JSON object per
// line whose fields survive control characters and invalid UTF-8.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Logs at warn (always on) with the format given; returns what stderr got.
template <typename F>
std::string captured(const std::string& format, F&& body) {
  set_log_format(format);
  ::testing::internal::CaptureStderr();
  body();
  log().flush();
  const std::string out = ::testing::internal::GetCapturedStderr();
  set_log_format("text");
  return out;
}

TEST(LogContext, TextLinesNameTheNodeAndItsRound) {
  uint64_t round = 3;
  const std::string out = captured("text", [&] {
    LogScope scope("site-a", &round);
    log().warn("first");
    round = 4;
    log().warn("second");
  });
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_NE(lines[0].find(" warning [site-a round 3] first"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("[site-a round 4] second"), std::string::npos) << lines[1];
}

TEST(LogContext, ScopesNestAndEachThreadHasItsOwn) {
  uint64_t outer_round = 1, inner_round = 7;
  const std::string out = captured("text", [&] {
    LogScope outer("region-0", &outer_round);
    {
      LogScope inner("site-b", &inner_round);
      log().warn("inner");
    }
    log().warn("outer");
    std::thread([] { log().warn("elsewhere"); }).join();
  });
  EXPECT_NE(out.find("[site-b round 7] inner"), std::string::npos) << out;
  EXPECT_NE(out.find("[region-0 round 1] outer"), std::string::npos) << out;
  EXPECT_EQ(out.find("] elsewhere"), std::string::npos) << "another thread has no scope: " << out;
}

TEST(LogContext, TheProcessNodeLabelsLinesOutsideAScope) {
  set_log_node("root");
  const std::string out = captured("text", [] { log().warn("no scope"); });
  set_log_node("");
  EXPECT_NE(out.find("[root] no scope"), std::string::npos) << out;
}

TEST(LogContext, JsonLinesAreObjectsWithTheFieldsAndNothingAPeerCanBreak) {
  uint64_t round = 12;
  const std::string out = captured("json", [&] {
    LogScope scope("agg\n-x", &round);
    log().warn("refused 'a\nfake line' \x1b[31m and \xff\xfe bytes");
  });
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 1u) << "a newline in a field must not split the line: " << out;
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["node"], "agg\n-x");
  EXPECT_EQ(j["round"], 12);
  EXPECT_NE(j["msg"].get<std::string>().find("a\nfake line"), std::string::npos);
  EXPECT_EQ(j["time"].get<std::string>().size(), std::string("2026-11-25T04:53:52.123").size());
}

TEST(LogContext, JsonWithoutAScopeHasNullNodeAndRound) {
  const std::string out = captured("json", [] { log().warn("plain"); });
  const nlohmann::json j = nlohmann::json::parse(lines_of(out).at(0));
  EXPECT_TRUE(j["node"].is_null());
  EXPECT_TRUE(j["round"].is_null());
  EXPECT_EQ(j["msg"], "plain");
}

TEST(LogContext, AnUnknownFormatIsRefused) { EXPECT_THROW(set_log_format("xml"), ConfigError); }

}  // namespace
}  // namespace fedwan
