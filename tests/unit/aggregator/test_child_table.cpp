// An aggregator's child table (aggregator/child_table.hpp), without
// sockets or clocks: the members' weight and sites over sites and regions,
// the live regions, the members that have not confirmed the final model,
// the names of the away states, and when a site may pause (outside its
// participation windows, or within the clocks' slack of a window's end).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "aggregator/child.hpp"
#include "aggregator/child_table.hpp"
#include "topology/participation_window.hpp"

namespace fedwan::aggregator {
namespace {

constexpr int64_t kMidnight = 1'700'006'400;  // a UTC midnight (2023-11-15T00:00:00Z)

int64_t at(int h, int m, int s = 0) { return kMidnight + h * 3600 + m * 60 + s; }

Child site(const std::string& id, double weight, bool member) {
  Child c;
  c.id = id;
  c.is_site = true;
  c.weight = weight;
  c.member = member;
  c.away = member ? Away::kNo : Away::kNotYet;
  return c;
}

Child region(const std::string& id, double weight, double member_weight, uint32_t member_sites,
             bool member) {
  Child c = site(id, weight, member);
  c.is_site = false;
  c.member_weight = member_weight;
  c.member_sites = member_sites;
  return c;
}

TEST(ChildTable, VectorLikeAccess) {
  ChildTable t;
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.size(), 0u);
  t.push_back(site("a", 1, true));
  t.push_back(site("b", 2, false));
  EXPECT_FALSE(t.empty());
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].id, "a");
  EXPECT_EQ(t.back().id, "b");
  t[1].id = "b2";
  const ChildTable& ct = t;
  EXPECT_EQ(ct[1].id, "b2");
  std::string ids;
  for (const Child& c : ct) ids += c.id;
  EXPECT_EQ(ids, "ab2");
}

TEST(ChildTable, MemberWeightAndSitesOverSitesAndRegions) {
  ChildTable t;
  EXPECT_EQ(t.member_weight(), 0.0);
  EXPECT_EQ(t.member_sites(), 0u);
  t.push_back(site("a", 1.5, true));
  t.push_back(site("b", 4, false));              // not a member: counts nothing
  t.push_back(region("r1", 10, 6.25, 3, true));  // counts what it reported
  t.push_back(region("r2", 20, 20, 7, false));   // not a member: counts nothing
  t.push_back(region("r3", 8, 0, 0, true));      // every site under it away
  EXPECT_DOUBLE_EQ(t.member_weight(), 1.5 + 6.25);
  EXPECT_EQ(t.member_sites(), 1u + 3u);
  t[1].member = true;
  EXPECT_DOUBLE_EQ(t.member_weight(), 1.5 + 4 + 6.25);
  EXPECT_EQ(t.member_sites(), 5u);
  t[2].member = false;
  EXPECT_DOUBLE_EQ(t.member_weight(), 5.5);
  EXPECT_EQ(t.member_sites(), 2u);
}

TEST(ChildTable, LiveRegions) {
  ChildTable t;
  EXPECT_EQ(t.live_regions(), 0u);
  t.push_back(site("a", 1, true));  // a site: never counted
  t.push_back(region("r1", 1, 1, 1, true));
  t.push_back(region("r2", 1, 1, 1, false));  // live, not a member: counted
  t.push_back(region("r3", 1, 1, 1, true));
  EXPECT_EQ(t.live_regions(), 3u);
  t[3].live = false;
  t[0].live = false;
  EXPECT_EQ(t.live_regions(), 2u);
}

TEST(ChildTable, UnconfirmedMembersInSlotOrder) {
  ChildTable t;
  EXPECT_EQ(t.unconfirmed_members(), "");
  t.push_back(site("a", 1, true));
  EXPECT_EQ(t.unconfirmed_members(), "a");
  t.push_back(site("b", 1, true));
  t.push_back(site("gone", 1, false));  // left or paused: holds no final model
  t.push_back(region("r", 1, 1, 1, true));
  EXPECT_EQ(t.unconfirmed_members(), "a, b, r");
  t[1].confirmed_end = true;
  EXPECT_EQ(t.unconfirmed_members(), "a, r");
  t[0].confirmed_end = true;
  t[3].confirmed_end = true;
  EXPECT_EQ(t.unconfirmed_members(), "");
}

TEST(ChildTable, AwayNames) {
  EXPECT_STREQ(ChildTable::away_name(Away::kNo), "member");
  EXPECT_STREQ(ChildTable::away_name(Away::kLeft), "left");
  EXPECT_STREQ(ChildTable::away_name(Away::kPaused), "paused");
  EXPECT_STREQ(ChildTable::away_name(Away::kNotYet), "not_joined");
}

TEST(ChildTable, PauseRefusedWithoutWindows) {
  const Child c = site("s1", 1, true);
  const topology::ParticipationWindows always;
  const std::optional<std::string> why = ChildTable::pause_refusal(c, always, at(12, 0));
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "'s1' declares no participation windows (it takes part at all times)");
}

TEST(ChildTable, PauseRefusedInsideAWindow) {
  static_assert(ChildTable::kPauseClockSlack.count() == 300);
  const Child c = site("s1", 1, true);
  const topology::ParticipationWindows day({"08:00-18:00"});
  std::optional<std::string> why = ChildTable::pause_refusal(c, day, at(17, 0));
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "'s1' is inside its participation window for 3600 s more");
  // One second more than the slack left: still refused.
  why = ChildTable::pause_refusal(c, day, at(18, 0) - 301);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "'s1' is inside its participation window for 301 s more");
}

TEST(ChildTable, PauseTakenOutsideAWindow) {
  const Child c = site("s1", 1, true);
  const topology::ParticipationWindows day({"08:00-18:00"});
  EXPECT_EQ(ChildTable::pause_refusal(c, day, at(7, 59, 59)), std::nullopt);
  EXPECT_EQ(ChildTable::pause_refusal(c, day, at(18, 0)), std::nullopt);
  EXPECT_EQ(ChildTable::pause_refusal(c, day, at(23, 0)), std::nullopt);
}

TEST(ChildTable, PauseTakenWithinTheSlackOfAWindowsEnd) {
  const Child c = site("s1", 1, true);
  const topology::ParticipationWindows day({"08:00-18:00"});
  EXPECT_EQ(ChildTable::pause_refusal(c, day, at(18, 0) - 300), std::nullopt);
  EXPECT_EQ(ChildTable::pause_refusal(c, day, at(17, 59, 59)), std::nullopt);
}

}  // namespace
}  // namespace fedwan::aggregator
