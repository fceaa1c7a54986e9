// Participation windows: parsing, open/closed at a time, waits, and the
// topology keys that carry them (late_join, windows, metrics).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "harness/error_message.hpp"
#include "topology/participation_window.hpp"

namespace fedwan {
namespace {

constexpr int64_t kDay = 86400;
constexpr int64_t kMidnight = 1'700'006'400;  // a UTC midnight (2023-11-15T00:00:00Z)
static_assert(kMidnight % kDay == 0);

int64_t at(int h, int m, int s = 0) { return kMidnight + h * 3600 + m * 60 + s; }

TEST(ParticipationWindow, ParsesClockRanges) {
  std::string why;
  auto w = topology::parse_daily_window("22:00-06:30", &why);
  ASSERT_TRUE(w) << why;
  EXPECT_EQ(w->start_s, 22u * 3600);
  EXPECT_EQ(w->end_s, 6u * 3600 + 1800);
  w = topology::parse_daily_window("08:00:05-24:00", &why);
  ASSERT_TRUE(w) << why;
  EXPECT_EQ(w->start_s, 8u * 3600 + 5);
  EXPECT_EQ(w->end_s, 86400u);
  for (const char* bad : {"", "8:00-9:00", "08:00", "08:00-08:00", "25:00-26:00", "08:60-09:00",
                          "24:00-08:00", "08:00-09:00:61", "08:00 - 09:00", "ab:cd-ef:gh"}) {
    why.clear();
    EXPECT_FALSE(topology::parse_daily_window(bad, &why)) << bad;
    EXPECT_NE(why.find("window"), std::string::npos) << bad;
  }
}

TEST(ParticipationWindow, OpenAndClosedTimes) {
  const topology::ParticipationWindows always;
  EXPECT_TRUE(always.always());
  EXPECT_TRUE(always.open_at(at(3, 0)));
  const topology::ParticipationWindows night({"22:00-06:00"});
  EXPECT_TRUE(night.open_at(at(23, 0)));
  EXPECT_TRUE(night.open_at(at(0, 0)));
  EXPECT_TRUE(night.open_at(at(5, 59, 59)));
  EXPECT_FALSE(night.open_at(at(6, 0)));
  EXPECT_FALSE(night.open_at(at(12, 0)));
  EXPECT_TRUE(night.open_at(at(22, 0)));
  EXPECT_TRUE(night.open_at(at(22, 0) - kDay * 400));  // any day, before 1970 too
  const topology::ParticipationWindows two({"01:00-02:00", "13:00-14:00"});
  EXPECT_FALSE(two.open_at(at(0, 59, 59)));
  EXPECT_TRUE(two.open_at(at(1, 30)));
  EXPECT_TRUE(two.open_at(at(13, 0)));
  EXPECT_FALSE(two.open_at(at(14, 0)));
  const topology::ParticipationWindows all_day({"00:00-24:00"});
  EXPECT_TRUE(all_day.open_at(at(0, 0)));
  EXPECT_TRUE(all_day.open_at(at(23, 59, 59)));
}

TEST(ParticipationWindow, WaitsUntilOpenAndUntilClosed) {
  const topology::ParticipationWindows two({"01:00-02:00", "13:00-14:00"});
  EXPECT_EQ(two.seconds_until_open(at(1, 30)), 0);
  EXPECT_EQ(two.seconds_until_open(at(2, 0)), 11 * 3600);
  EXPECT_EQ(two.seconds_until_open(at(14, 0)), 11 * 3600);  // tomorrow's 01:00
  EXPECT_EQ(two.seconds_until_closed(at(1, 30)), 1800);
  EXPECT_EQ(two.seconds_until_closed(at(3, 0)), 0);
  // Touching windows close at the end of the last one.
  const topology::ParticipationWindows touching({"01:00-02:00", "02:00-03:00"});
  EXPECT_EQ(touching.seconds_until_closed(at(1, 0)), 2 * 3600);
  const topology::ParticipationWindows all_day({"00:00-24:00"});
  EXPECT_EQ(all_day.seconds_until_closed(at(5, 0)), kDay);
  const topology::ParticipationWindows wrap({"23:00-01:00"});
  EXPECT_EQ(wrap.seconds_until_closed(at(23, 30)), 5400);
  EXPECT_EQ(wrap.seconds_until_open(at(1, 0)), 22 * 3600);
}

TEST(ParticipationWindow, ConstructorNamesTheBadWindow) {
  try {
    topology::ParticipationWindows w({"01:00-02:00", "nonsense"});
    FAIL() << "accepted a malformed window";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nonsense"), std::string::npos) << e.what();
  }
}

const char* kBase = R"(job: j
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000"}
)";

std::string with(const std::string& sites) { return std::string(kBase) + sites; }

std::string load_error(const std::string& yaml) {
  return testing::config_error([&] { (void)Topology::parse(yaml); });
}

TEST(TopologyMembershipKeys, ReadWrittenAndInTheDigest) {
  const Topology plain = Topology::parse(with("  - {id: a, role: site, parent: root}\n"
                                              "  - {id: b, role: site, parent: root}\n"));
  const Topology t = Topology::parse(
      with("  - {id: a, role: site, parent: root}\n"
           "  - {id: b, role: site, parent: root, late_join: true, windows: [\"22:00-06:00\", "
           "\"12:00-13:00\"], metrics: \"127.0.0.1:9401\"}\n"));
  const NodeSpec& b = t.node("b");
  EXPECT_TRUE(b.late_join);
  EXPECT_EQ(b.windows, (std::vector<std::string>{"22:00-06:00", "12:00-13:00"}));
  EXPECT_EQ(b.metrics, "127.0.0.1:9401");
  EXPECT_NE(t.digest_hex(), plain.digest_hex());
  // Written back, the same topology (and digest).
  const Topology again = Topology::parse(t.to_yaml());
  EXPECT_EQ(again.digest_hex(), t.digest_hex());
  EXPECT_TRUE(again.node("b").late_join);
}

TEST(TopologyMembershipKeys, RefusedWhereTheyDoNotApply) {
  EXPECT_NE(load_error(with("  - {id: a, role: site, parent: root, windows: [\"8-9\"]}\n"))
                .find("window '8-9'"),
            std::string::npos);
  EXPECT_NE(load_error(with("  - {id: a, role: site, parent: root, late_join: yes-please}\n"))
                .find("true or false"),
            std::string::npos);
  EXPECT_NE(load_error(with("  - {id: a, role: site, parent: root, late_join: true}\n"))
                .find("at least one must be there at the start"),
            std::string::npos);
  EXPECT_NE(load_error(with("  - {id: a, role: site, parent: root, metrics: \"nohost\"}\n"))
                .find("not host:port"),
            std::string::npos);
  EXPECT_NE(load_error(with("  - {id: a, role: site, parent: root, metrics: \"h:99999\"}\n"))
                .find("not host:port"),
            std::string::npos);
  EXPECT_NE(load_error("job: j\nnodes:\n  - {id: root, role: root, endpoint: "
                       "\"tcp://127.0.0.1:7000\", late_join: true}\n  - {id: a, role: site, "
                       "parent: root}\n")
                .find("applies to sites only"),
            std::string::npos);
  EXPECT_EQ(load_error(with("  - {id: a, role: site, parent: root, metrics: \"[::1]:0\"}\n")), "");
}

}  // namespace
}  // namespace fedwan
