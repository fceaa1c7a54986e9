#include "aggregator/child_claims.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace fedwan::aggregator {
namespace {

TEST(ChildClaims, ASiteWeighsWhatTheTopologySays) {
  for (double claimed : {137.0, 1e300, 1e6, 1e-3, 0.0, -5.0, std::nan(""),
                         std::numeric_limits<double>::infinity()}) {
    const DeltaWeight w = judge_delta_weight(/*child_is_site=*/true, 137.0, claimed);
    EXPECT_EQ(w.weight, 137.0) << claimed;
    EXPECT_FALSE(w.refusal) << claimed;
    EXPECT_EQ(w.claim_differs, claimed != 137.0) << claimed;
  }
}

TEST(ChildClaims, ARegionWeighsAtMostItsSites) {
  // Part of its subtree (a round closed at quorum) or all of it.
  for (double claimed : {237.0, 100.0, 137.0, 237.0 * (1 + 1e-12)}) {
    const DeltaWeight w = judge_delta_weight(/*child_is_site=*/false, 237.0, claimed);
    EXPECT_FALSE(w.refusal) << claimed;
    EXPECT_EQ(w.weight, claimed);
  }
  for (double claimed :
       {238.0, 1e300, 0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    const DeltaWeight w = judge_delta_weight(/*child_is_site=*/false, 237.0, claimed);
    ASSERT_TRUE(w.refusal) << claimed;
    EXPECT_NE(w.refusal->find("weight of the sites under the sender (237)"), std::string::npos)
        << *w.refusal;
  }
}

TEST(ChildClaims, TelemetryMustBePlausible) {
  EXPECT_FALSE(telemetry_refusal(0, 0, 0));
  EXPECT_FALSE(telemetry_refusal(6400, 12800, 100));
  EXPECT_FALSE(telemetry_refusal(kMaxTelemetryBytes, kMaxTelemetryBytes, 1));
  EXPECT_TRUE(telemetry_refusal(6399, 0, 100));  // a frame is at least a header
  EXPECT_TRUE(telemetry_refusal(kMaxTelemetryBytes + 1, 0, 0));
  EXPECT_TRUE(telemetry_refusal(0, UINT64_MAX, 0));
}

}  // namespace
}  // namespace fedwan::aggregator
