// The Gloo site communicator with its ranks as threads of one process:
// collectives give every rank the same, exact result; a rank that never
// joins or dies mid-way makes the others fail with a clear error within the
// timeout instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/site_comm.hpp"
#include "harness/site_ranks.hpp"

namespace fedwan::testing {
namespace {

using std::chrono::milliseconds;

SiteCommOptions options(const TempDir& dir, int rank, int size, milliseconds timeout) {
  return rank_options(dir, rank, size, timeout);
}

TEST(GlooComm, AllreduceBroadcastAndBarrierAgreeOnEveryRank) {
  TempDir dir;
  constexpr int kRanks = 3;
  constexpr size_t kN = 100003;  // not a multiple of anything Gloo segments by
  std::vector<std::vector<float>> sums(kRanks), means(kRanks), bcast(kRanks);
  const auto errors = run_ranks(kRanks, [&](int r) {
    auto comm = make_gloo_comm(options(dir, r, kRanks, milliseconds(20000)));
    EXPECT_EQ(comm->rank(), r);
    EXPECT_EQ(comm->size(), kRanks);
    EXPECT_STREQ(comm->engine(), "gloo");
    sums[r].resize(kN);
    for (size_t i = 0; i < kN; ++i) sums[r][i] = static_cast<float>(r + 1) * (i % 7);
    comm->allreduce_sum(sums[r].data(), kN);
    means[r].assign(kN, static_cast<float>(3 * r));
    comm->allreduce_mean(means[r].data(), kN);
    bcast[r].assign(kN, static_cast<float>(r));
    if (r == 1) bcast[r][5] = 42.0f;
    comm->broadcast(bcast[r].data(), kN, 1);
    comm->barrier();
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_FALSE(errors[r]) << message(errors[r]);
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < kN; i += 997) {
      ASSERT_EQ(sums[r][i], 6.0f * (i % 7)) << "rank " << r << " element " << i;  // 1+2+3
      ASSERT_EQ(means[r][i], 3.0f) << "rank " << r;                               // (0+3+6)/3
      ASSERT_EQ(bcast[r][i], i == 5 ? 42.0f : 1.0f) << "rank " << r;
    }
    EXPECT_EQ(bcast[r][5], 42.0f);
  }
}

TEST(GlooComm, BroadcastBytesKeepsEveryBitPattern) {
  TempDir dir;
  std::vector<std::vector<uint8_t>> got(2);
  const auto errors = run_ranks(2, [&](int r) {
    auto comm = make_gloo_comm(options(dir, r, 2, milliseconds(20000)));
    // 4099 bytes (not a multiple of 4), every value, NaN patterns included.
    if (r == 0) {
      got[r].resize(4099);
      for (size_t i = 0; i < got[r].size(); ++i) got[r][i] = static_cast<uint8_t>(i * 131 + 7);
      for (size_t i = 0; i + 4 <= 64; i += 4) got[r][i + 3] = 0xff;  // 0xff.. top bytes: NaNs
    } else {
      got[r] = {1, 2, 3};  // replaced
    }
    comm->broadcast_bytes(got[r], 0, milliseconds(20000));
    std::vector<uint8_t> empty;
    comm->broadcast_bytes(empty, 0, milliseconds(20000));
    EXPECT_TRUE(empty.empty());
  });
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(errors[r]) << message(errors[r]);
  EXPECT_EQ(got[0].size(), 4099u);
  EXPECT_EQ(got[0], got[1]);
}

TEST(GlooComm, OneRankNeedsNoPeers) {
  TempDir dir;
  auto comm = make_gloo_comm(options(dir, 0, 1, milliseconds(1000)));
  std::vector<float> v = {1, 2, 3};
  comm->allreduce_mean(v.data(), v.size());
  comm->broadcast(v.data(), v.size(), 0);
  comm->barrier();
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
}

TEST(GlooComm, ARankThatNeverJoinsIsAClearErrorNotAHang) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)make_gloo_comm(options(dir, 0, 2, milliseconds(1500)));
    FAIL() << "joined a site whose second rank never came";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("joining the site"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

TEST(GlooComm, ARankThatDiesMidWayFailsTheOthersCleanly) {
  TempDir dir;
  std::vector<std::string> failures(2);
  const auto errors = run_ranks(2, [&](int r) {
    auto comm = make_gloo_comm(options(dir, r, 2, milliseconds(2000)));
    std::vector<float> v(1000, 1.0f);
    comm->allreduce_sum(v.data(), v.size());
    if (r == 1) return;  // rank 1 leaves: its communicator is destroyed
    try {
      comm->allreduce_sum(v.data(), v.size());
      failures[r] = "no error";
    } catch (const TransportError& e) {
      failures[r] = e.what();
    }
    // Broken from then on, with a message that says so.
    EXPECT_THROW(comm->barrier(), TransportError);
  });
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(errors[r]) << message(errors[r]);
  EXPECT_NE(failures[0].find("allreduce failed"), std::string::npos) << failures[0];
}

TEST(GlooComm, BadOptionsAreConfigErrors) {
  TempDir dir;
  EXPECT_THROW((void)make_gloo_comm(options(dir, 2, 2, milliseconds(100))), ConfigError);
  EXPECT_THROW((void)make_gloo_comm(options(dir, -1, 2, milliseconds(100))), ConfigError);
  SiteCommOptions o = options(dir, 0, 1, milliseconds(100));
  o.rendezvous_dir.clear();
  EXPECT_THROW((void)make_gloo_comm(o), ConfigError);
  auto one = make_gloo_comm(options(dir, 0, 1, milliseconds(100)));
  float x = 0;
  EXPECT_THROW(one->broadcast(&x, 1, 1), ConfigError);
}

}  // namespace
}  // namespace fedwan::testing
