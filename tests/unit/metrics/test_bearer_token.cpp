// read_bearer_token_file and bearer_token_matches (metrics/bearer_token.hpp).
#include "metrics/bearer_token.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "fedwan/error.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::metrics {
namespace {

std::string write(const testing::TempDir& dir, const std::string& text, mode_t mode) {
  const std::string path = (dir.path() / "token").string();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(BearerToken, ReadsTheTokenWithoutItsNewline) {
  testing::TempDir dir;
  EXPECT_EQ(read_bearer_token_file(write(dir, "0123456789abcdef0123\n", 0400)),
            "0123456789abcdef0123");
  EXPECT_EQ(read_bearer_token_file(write(dir, "  0123456789abcdef0123 \r\n", 0440)),
            "0123456789abcdef0123");
}

TEST(BearerToken, RefusesFilesThatProtectNothing) {
  testing::TempDir dir;
  const auto refused = [&](const std::string& text, mode_t mode, const std::string& says) {
    try {
      read_bearer_token_file(write(dir, text, mode));
      ADD_FAILURE() << "accepted '" << text << "' mode " << std::oct << mode;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("0123456789abcdef0123\n", 0644, "others may read");
  refused("0123456789abcdef0123\n", 0602, "others may read");
  refused("", 0400, "is empty");
  refused(" \n\n", 0400, "is empty");
  refused("short\n", 0400, "at least 16");
  refused("0123456789 abcdef0123\n", 0400, "whitespace");
  refused("0123456789\x1b"
          "abcdef0123\n",
          0400, "printable ASCII");
  EXPECT_THROW(read_bearer_token_file((dir.path() / "absent").string()), ConfigError);
  EXPECT_THROW(read_bearer_token_file(dir.path().string()), ConfigError);
}

TEST(BearerToken, MatchesOnlyTheBearerSchemeWithTheToken) {
  const std::string token = "0123456789abcdef0123";
  EXPECT_TRUE(bearer_token_matches("Bearer 0123456789abcdef0123", token));
  EXPECT_TRUE(bearer_token_matches("bearer 0123456789abcdef0123", token));
  EXPECT_TRUE(bearer_token_matches("BEARER  0123456789abcdef0123 ", token));
  EXPECT_FALSE(bearer_token_matches("Bearer 0123456789abcdef012", token));
  EXPECT_FALSE(bearer_token_matches("Bearer 0123456789abcdef01234", token));
  EXPECT_FALSE(bearer_token_matches("Bearer", token));
  EXPECT_FALSE(bearer_token_matches("Basic 0123456789abcdef0123", token));
  EXPECT_FALSE(bearer_token_matches("0123456789abcdef0123", token));
  EXPECT_FALSE(bearer_token_matches("Bearer ", ""));
}

}  // namespace
}  // namespace fedwan::metrics
