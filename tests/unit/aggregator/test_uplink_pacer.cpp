// UplinkPacer: each site child is told how many chunks of the open round it
// may have sent, `window` past the fewest any child still owing delivered.
#include "aggregator/uplink_pacer.hpp"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace fedwan::aggregator {
namespace {

using Progress = UplinkPacer::Progress;

std::map<uint32_t, uint32_t> told(const std::vector<UplinkPacer::Grant>& grants) {
  std::map<uint32_t, uint32_t> out;
  for (const auto& g : grants) out[g.slot] = g.allowed;
  return out;
}

TEST(UplinkPacer, EverySiteIsFirstToldTheWindow) {
  UplinkPacer p(4);
  p.open(3, 100, 2);
  const auto g = told(p.update({{0, 0, true, true}, {1, 0, true, true}}));
  EXPECT_EQ(g, (std::map<uint32_t, uint32_t>{{0, 4}, {1, 4}}));
  EXPECT_EQ(p.round(), 3u);
  EXPECT_EQ(p.told(0), 4u);
}

TEST(UplinkPacer, TheLeaderRunsAtMostTheWindowPastTheSlowest) {
  UplinkPacer p(4);
  p.open(0, 100, 2);
  (void)p.update({{0, 0, true, true}, {1, 0, true, true}});
  // Site 0 delivered all it may; site 1 nothing yet: nobody moves.
  EXPECT_TRUE(p.update({{0, 4, true, true}, {1, 0, true, true}}).empty());
  // Site 1 delivered one: 5 is not window / 2 past 4, said once 6 is.
  EXPECT_TRUE(p.update({{0, 4, true, true}, {1, 1, true, true}}).empty());
  const auto g = told(p.update({{0, 4, true, true}, {1, 2, true, true}}));
  EXPECT_EQ(g, (std::map<uint32_t, uint32_t>{{0, 6}, {1, 6}}));
  // The laggard always has the window past what it delivered.
  for (uint32_t d = 2; d <= 50; ++d) {
    (void)p.update({{0, d + 4, true, true}, {1, d, true, true}});
    EXPECT_GE(p.told(1) + 2, d + 4) << d;
    EXPECT_LE(p.told(0), d + 4) << d;
  }
}

TEST(UplinkPacer, NobodyToWaitForMeansTheWholeRound) {
  UplinkPacer p(4);
  p.open(0, 40, 3);
  (void)p.update({{0, 0, true, true}, {1, 0, true, true}, {2, 0, true, true}});
  // Site 2 is lost (no longer owing, no longer paced); site 1 delivered all.
  const auto g = told(p.update({{0, 4, true, true}, {1, 40, false, true}, {2, 0, false, false}}));
  EXPECT_EQ(g, (std::map<uint32_t, uint32_t>{{0, 40}, {1, 40}}));
  EXPECT_TRUE(p.update({{0, 10, true, true}, {1, 40, false, true}}).empty());
}

TEST(UplinkPacer, ARegionHoldsItsSitesBackButIsNotTold) {
  UplinkPacer p(4);
  p.open(0, 40, 2);
  // Slot 1 is a region: owing, not paced.
  const auto g = told(p.update({{0, 0, true, true}, {1, 0, true, false}}));
  EXPECT_EQ(g, (std::map<uint32_t, uint32_t>{{0, 4}}));
  EXPECT_TRUE(p.update({{0, 4, true, true}, {1, 1, true, false}}).empty());
  EXPECT_EQ(told(p.update({{0, 4, true, true}, {1, 3, true, false}})),
            (std::map<uint32_t, uint32_t>{{0, 7}}));
}

TEST(UplinkPacer, NeverMoreThanTheRoundAndNeverBack) {
  UplinkPacer p(4);
  p.open(0, 5, 2);
  EXPECT_EQ(told(p.update({{0, 0, true, true}, {1, 0, true, true}})),
            (std::map<uint32_t, uint32_t>{{0, 4}, {1, 4}}));
  EXPECT_EQ(told(p.update({{0, 4, true, true}, {1, 1, true, true}})),
            (std::map<uint32_t, uint32_t>{{0, 5}, {1, 5}}));
  // A child back (owing again, delivered little) takes nothing away.
  EXPECT_TRUE(p.update({{0, 5, false, true}, {1, 1, true, true}}).empty());
  EXPECT_EQ(p.told(0), 5u);
}

TEST(UplinkPacer, LiftTellsTheWholeRoundToThoseHeldBack) {
  UplinkPacer p(4);
  p.open(0, 30, 3);
  (void)p.update({{0, 0, true, true}, {1, 0, true, true}, {2, 0, true, false}});
  EXPECT_EQ(told(p.lift()), (std::map<uint32_t, uint32_t>{{0, 30}, {1, 30}}));
  EXPECT_TRUE(p.lift().empty());
  EXPECT_TRUE(p.update({{0, 0, true, true}, {1, 0, true, true}}).empty());
}

TEST(UplinkPacer, NothingBeforeARoundOpensAndAWindowOfAtLeastTwo) {
  UplinkPacer p(0);
  EXPECT_EQ(p.window(), 2u);
  EXPECT_TRUE(p.update({{0, 0, true, true}}).empty());
  EXPECT_TRUE(p.lift().empty());
  p.open(1, 10, 1);
  // A slot past those the round was opened with is not told, but owing, it
  // holds the others.
  EXPECT_EQ(told(p.update({{0, 0, true, true}, {5, 0, true, true}})),
            (std::map<uint32_t, uint32_t>{{0, 2}}));
}

}  // namespace
}  // namespace fedwan::aggregator
