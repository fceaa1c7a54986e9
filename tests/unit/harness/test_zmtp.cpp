// The ZMTP 3.x builders and readers of the test harness (harness/zmtp.hpp):
// what the builders make, the readers read back, field by field, so streams
// built by tests are the streams the fault-injecting proxy parses.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/zmtp.hpp"

namespace fedwan::testing::zmtp {
namespace {

std::string body_of(const Bytes& f, const FrameHeader& h) {
  return std::string(f.begin() + static_cast<std::ptrdiff_t>(h.header_bytes), f.end());
}

TEST(Zmtp, AGreetingIsPlausibleEveryByteAndNamesItsMechanism) {
  const Bytes g = greeting("PLAIN");
  ASSERT_EQ(g.size(), kGreetingBytes);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(greeting_byte_plausible(i, g[i])) << i;
  EXPECT_EQ(std::string(g.begin() + 12, g.begin() + 17), "PLAIN");
  EXPECT_EQ(g[17], 0);  // the name is padded with zeros to 20 bytes
  EXPECT_EQ(g[32], 0);  // as-server = false
  EXPECT_EQ(greeting().at(12), 'N');
  // What tells a greeting from other bytes: the signature and major version.
  EXPECT_FALSE(greeting_byte_plausible(0, 0x00));
  EXPECT_FALSE(greeting_byte_plausible(9, 0x00));
  EXPECT_FALSE(greeting_byte_plausible(10, 2));
}

TEST(Zmtp, EveryFrameReadsBackAsBuilt) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{70000}}) {
    for (bool more : {false, true}) {
      for (bool force_long : {false, true}) {
        SCOPED_TRACE(std::to_string(size) + (more ? " more" : "") + (force_long ? " long" : ""));
        const std::string body(size, 'q');
        const Bytes f = frame(body, more, /*command=*/false, force_long);
        FrameHeader h;
        ASSERT_EQ(parse_frame_header(f.data(), f.size(), &h), HeaderParse::kOk);
        const bool long_size = force_long || size > 255;
        EXPECT_EQ(h.header_bytes, long_size ? 9u : 2u);
        EXPECT_EQ(h.body_bytes, size);
        EXPECT_EQ(h.more(), more);
        EXPECT_FALSE(h.command());
        EXPECT_EQ(bool(h.flags & kFlagLong), long_size);
        ASSERT_EQ(f.size(), h.header_bytes + size);
        EXPECT_EQ(body_of(f, h), body);
      }
    }
  }
}

TEST(Zmtp, ACommandFrameCarriesItsNameThenItsData) {
  const Bytes c = command("PING", "ttl-ctx");
  FrameHeader h;
  ASSERT_EQ(parse_frame_header(c.data(), c.size(), &h), HeaderParse::kOk);
  EXPECT_TRUE(h.command());
  EXPECT_FALSE(h.more());
  EXPECT_EQ(body_of(c, h), std::string("\x04PINGttl-ctx"));
}

TEST(Zmtp, AHeaderCutShortNeedsMoreAndReservedFlagsAreInvalid) {
  const Bytes short_frame = frame("x");
  const Bytes long_frame = frame("x", false, false, /*force_long=*/true);
  FrameHeader h;
  EXPECT_EQ(parse_frame_header(short_frame.data(), 0, &h), HeaderParse::kNeedMore);
  EXPECT_EQ(parse_frame_header(short_frame.data(), 1, &h), HeaderParse::kNeedMore);
  for (size_t n = 1; n < 9; ++n) {
    EXPECT_EQ(parse_frame_header(long_frame.data(), n, &h), HeaderParse::kNeedMore) << n;
  }
  Bytes reserved = short_frame;
  reserved[0] |= 0x10;
  EXPECT_EQ(parse_frame_header(reserved.data(), reserved.size(), &h), HeaderParse::kInvalid);
}

TEST(Zmtp, TheIdentityOfAReadyCommandReadsBackLongOrShort) {
  for (const std::string& id : std::vector<std::string>{"eu", std::string(300, 'r')}) {
    const Bytes r = ready({{"Socket-Type", "DEALER"}, {"Identity", id}, {"X-Other", "1"}});
    FrameHeader h;
    ASSERT_EQ(parse_frame_header(r.data(), r.size(), &h), HeaderParse::kOk);
    EXPECT_TRUE(h.command());
    EXPECT_EQ(h.body_bytes + h.header_bytes, r.size());
    EXPECT_EQ(ready_identity(r), std::optional<std::string>(id)) << id.size();
  }
}

TEST(Zmtp, CatJoinsPartsThatParseBackOneByOne) {
  const std::vector<Bytes> parts = {greeting(), ready({{"Identity", "us"}}), frame("a", true),
                                    frame(std::string(300, 'b'))};
  const Bytes stream = cat({parts[0], parts[1], parts[2], parts[3]});
  size_t pos = kGreetingBytes;
  ASSERT_EQ(Bytes(stream.begin(), stream.begin() + kGreetingBytes), parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    FrameHeader h;
    ASSERT_EQ(parse_frame_header(stream.data() + pos, stream.size() - pos, &h), HeaderParse::kOk);
    const size_t n = h.header_bytes + h.body_bytes;
    EXPECT_EQ(Bytes(stream.begin() + pos, stream.begin() + pos + n), parts[i]) << i;
    pos += n;
  }
  EXPECT_EQ(pos, stream.size());
}

}  // namespace
}  // namespace fedwan::testing::zmtp
