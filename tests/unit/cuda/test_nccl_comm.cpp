// The NCCL engine of the site communicator and make_site_comm, which routes
// each call by where its data lives. Without a GPU only the CPU side runs
// (a Gloo-only communicator; asking for a GPU is a clear ConfigError) and the
// GPU tests skip. With one GPU: a site of one rank. With two or more: ranks
// as threads, one GPU each, against host-computed results, and a rank that
// never joins or stops answering makes the other fail within the timeout.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fedwan/cuda.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_comm.hpp"
#include "harness/site_ranks.hpp"

namespace fedwan::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

#define SKIP_UNLESS_GPUS(n)                                                                 \
  do {                                                                                      \
    if (cuda::device_count() < (n)) {                                                       \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << cuda::device_count(); \
    }                                                                                       \
  } while (0)

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// n floats in the memory of `device`, freed at scope exit. The calling
// thread's current device is set to `device`.
class DeviceFloats {
 public:
  DeviceFloats(int device, const std::vector<float>& values) : n_(values.size()) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaMalloc(&p_, std::max<size_t>(n_, 1) * sizeof(float)), "cudaMalloc");
    if (n_ > 0) {
      check(cudaMemcpy(p_, values.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
            "cudaMemcpy");
    }
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() { return p_; }
  size_t size() const { return n_; }
  std::vector<float> read() const {
    std::vector<float> out(n_);
    if (n_ > 0) {
      check(cudaMemcpy(out.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    }
    return out;
  }

 private:
  float* p_ = nullptr;
  size_t n_;
};

std::vector<float> pattern(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i % 7);
  return v;
}

// ---- without a GPU (run everywhere) ----------------------------------------

TEST(SiteCommRouter, WithoutADeviceItIsTheGlooEngine) {
  TempDir dir;
  std::vector<std::vector<float>> sums(2);
  std::vector<std::string> engines(2);
  const auto errors = run_ranks(2, [&](int r) {
    auto comm = cuda::make_site_comm(rank_options(dir, r, 2, milliseconds(20000)), -1);
    engines[r] = comm->engine();
    EXPECT_FALSE(comm->accepts_device_memory());
    EXPECT_EQ(comm->rank(), r);
    EXPECT_EQ(comm->size(), 2);
    sums[r] = pattern(1001, static_cast<float>(r + 1));
    comm->allreduce_sum(sums[r].data(), sums[r].size());
    std::vector<float> b(10, static_cast<float>(r));
    comm->broadcast(b.data(), b.size(), 1);
    EXPECT_EQ(b, std::vector<float>(10, 1.0f));
    std::vector<uint8_t> bytes;
    if (r == 0) bytes = {1, 2, 3, 4, 5};
    comm->broadcast_bytes(bytes, 0, milliseconds(20000));
    EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3, 4, 5}));
    comm->barrier();
  });
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(errors[r]) << message(errors[r]);
  EXPECT_EQ(engines, (std::vector<std::string>{"gloo", "gloo"}));
  EXPECT_EQ(sums[0], pattern(1001, 3.0f));
  EXPECT_EQ(sums[1], sums[0]);
}

TEST(SiteCommRouter, AGpuOnAMachineWithoutOneIsAConfigError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  try {
    (void)cuda::make_site_comm(rank_options(dir, 0, 1, milliseconds(2000)), 0);
    FAIL() << "made an NCCL communicator without a GPU";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device_count()"), std::string::npos) << e.what();
  }
  // The engine itself says the same, whatever the bootstrap.
  auto gloo = make_gloo_comm(rank_options(dir, 0, 1, milliseconds(2000)));
  EXPECT_THROW((void)cuda::make_nccl_comm(rank_options(dir, 0, 1, milliseconds(2000)), *gloo, 0),
               ConfigError);
  // Host memory is never taken for device memory.
  std::vector<float> host(4);
  EXPECT_FALSE(cuda::is_device_pointer(host.data()));
}

// ---- one GPU -----------------------------------------------------------------

TEST(NcclComm, OneRankLeavesDeviceDataAsItIs) {
  SKIP_UNLESS_GPUS(1);
  TempDir dir;
  const SiteCommOptions o = rank_options(dir, 0, 1, milliseconds(20000));
  auto gloo = make_gloo_comm(o);
  auto nccl = cuda::make_nccl_comm(o, *gloo, 0);
  EXPECT_STREQ(nccl->engine(), "nccl");
  EXPECT_TRUE(nccl->accepts_device_memory());
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->size(), 1);
  const std::vector<float> values = pattern(4099, 1.5f);
  DeviceFloats d(0, values);
  nccl->allreduce_sum(d.get(), d.size());
  EXPECT_EQ(d.read(), values);
  nccl->allreduce_mean(d.get(), d.size());
  EXPECT_EQ(d.read(), values);
  nccl->broadcast(d.get(), d.size(), 0);
  EXPECT_EQ(d.read(), values);
  nccl->barrier();
  nccl->allreduce_sum(d.get(), 0);  // nothing to do
  nccl->allreduce_sum(nullptr, 0);
  // Host memory is the caller's mistake, not a broken communicator.
  std::vector<float> host = values;
  try {
    nccl->allreduce_sum(host.data(), host.size());
    FAIL() << "the NCCL engine took host memory";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("host memory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(nccl->broadcast(d.get(), d.size(), 1), ConfigError);  // no rank 1
  nccl->allreduce_sum(d.get(), d.size());
  EXPECT_EQ(d.read(), values);
}

TEST(NcclComm, RouterSendsHostDataToGlooAndDeviceDataToNccl) {
  SKIP_UNLESS_GPUS(1);
  TempDir dir;
  auto comm = cuda::make_site_comm(rank_options(dir, 0, 1, milliseconds(20000)), 0);
  EXPECT_STREQ(comm->engine(), "nccl+gloo");
  EXPECT_TRUE(comm->accepts_device_memory());
  // The NCCL engine throws on host memory: these went through Gloo.
  std::vector<float> host = pattern(100, 2.0f);
  comm->allreduce_sum(host.data(), host.size());
  comm->allreduce_mean(host.data(), host.size());
  comm->broadcast(host.data(), host.size(), 0);
  EXPECT_EQ(host, pattern(100, 2.0f));
  std::vector<uint8_t> bytes = {9, 8, 7};
  comm->broadcast_bytes(bytes, 0, milliseconds(20000));
  EXPECT_EQ(bytes, (std::vector<uint8_t>{9, 8, 7}));
  DeviceFloats d(0, pattern(100, 3.0f));
  comm->allreduce_sum(d.get(), d.size());
  comm->broadcast(d.get(), d.size(), 0);
  EXPECT_EQ(d.read(), pattern(100, 3.0f));
  comm->barrier();
}

TEST(NcclComm, DeviceDataWithoutAGpuEngineIsAConfigError) {
  SKIP_UNLESS_GPUS(1);
  TempDir dir;
  auto comm = cuda::make_site_comm(rank_options(dir, 0, 1, milliseconds(5000)), -1);
  EXPECT_STREQ(comm->engine(), "gloo");
  DeviceFloats d(0, pattern(16, 1.0f));
  EXPECT_THROW(comm->allreduce_sum(d.get(), d.size()), ConfigError);
}

TEST(NcclComm, BadOptionsAreConfigErrors) {
  SKIP_UNLESS_GPUS(1);
  TempDir dir;
  auto gloo = make_gloo_comm(rank_options(dir, 0, 1, milliseconds(5000)));
  // The options must be the bootstrap's.
  EXPECT_THROW((void)cuda::make_nccl_comm(rank_options(dir, 0, 2, milliseconds(5000)), *gloo, 0),
               ConfigError);
  EXPECT_THROW((void)cuda::make_nccl_comm(rank_options(dir, 0, 1, milliseconds(5000)), *gloo,
                                          cuda::device_count()),
               ConfigError);
  EXPECT_THROW((void)cuda::make_site_comm(rank_options(dir, 0, 1, milliseconds(5000), "other"),
                                          cuda::device_count()),
               ConfigError);
}

// ---- two GPUs: ranks as threads ------------------------------------------------

TEST(NcclComm, TwoRanksAgreeWithTheHostComputedResults) {
  SKIP_UNLESS_GPUS(2);
  TempDir dir;
  constexpr size_t kN = 100003;  // not a multiple of anything NCCL chunks by
  std::vector<std::vector<float>> sums(2), means(2), bcast(2), host(2);
  const auto errors = run_ranks(2, [&](int r) {
    auto comm = cuda::make_site_comm(rank_options(dir, r, 2, milliseconds(30000)), r);
    EXPECT_STREQ(comm->engine(), "nccl+gloo");
    DeviceFloats s(r, pattern(kN, static_cast<float>(r + 1)));
    comm->allreduce_sum(s.get(), kN);
    sums[r] = s.read();
    DeviceFloats m(r, std::vector<float>(kN, static_cast<float>(4 * r)));
    comm->allreduce_mean(m.get(), kN);
    means[r] = m.read();
    std::vector<float> b = pattern(kN, static_cast<float>(10 + r));
    DeviceFloats bd(r, b);
    comm->broadcast(bd.get(), kN, 1);
    bcast[r] = bd.read();
    // Host data on the same communicator: through Gloo.
    host[r] = pattern(1000, static_cast<float>(r + 1));
    comm->allreduce_sum(host[r].data(), host[r].size());
    comm->barrier();
  });
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(errors[r]) << "rank " << r << ": " << message(errors[r]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sums[r], pattern(kN, 3.0f)) << "rank " << r;              // 1 + 2
    EXPECT_EQ(means[r], std::vector<float>(kN, 2.0f)) << "rank " << r;  // (0 + 4) / 2
    EXPECT_EQ(bcast[r], pattern(kN, 11.0f)) << "rank " << r;            // rank 1's
    EXPECT_EQ(host[r], pattern(1000, 3.0f)) << "rank " << r;
  }
}

TEST(NcclComm, ARankThatNeverJoinsNcclFailsTheOtherWithinTheTimeout) {
  SKIP_UNLESS_GPUS(2);
  TempDir dir;
  const milliseconds timeout(3000);
  std::string failure;
  Clock::duration took{};
  const auto errors = run_ranks(2, [&](int r) {
    const SiteCommOptions o = rank_options(dir, r, 2, timeout);
    auto gloo = make_gloo_comm(o);
    if (r == 1) {
      // Takes the NCCL id rank 0 hands out (make_nccl_comm's first step)
      // and never joins NCCL.
      std::vector<uint8_t> id;
      gloo->broadcast_bytes(id, 0, milliseconds(20000));
      return;
    }
    const auto t0 = Clock::now();
    try {
      (void)cuda::make_nccl_comm(o, *gloo, 0);
      failure = "joined without rank 1";
    } catch (const TransportError& e) {
      failure = e.what();
    }
    took = Clock::now() - t0;
  });
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(errors[r]) << "rank " << r << ": " << message(errors[r]);
  // NCCL's own error, or our deadline ("did not complete within 3000 ms").
  EXPECT_NE(failure.find("joining the NCCL communicator"), std::string::npos) << failure;
  EXPECT_LT(took, std::chrono::seconds(20)) << "aborting a pending join took too long";
}

TEST(NcclComm, ARankThatStopsAnsweringFailsTheOtherAndBreaksItForGood) {
  SKIP_UNLESS_GPUS(2);
  TempDir dir;
  std::string first, later;
  Clock::duration took{};
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  const auto errors = run_ranks(2, [&](int r) {
    auto comm = cuda::make_site_comm(rank_options(dir, r, 2, milliseconds(3000)), r);
    DeviceFloats d(r, pattern(1 << 20, 1.0f));
    comm->allreduce_sum(d.get(), d.size());  // together once
    if (r == 1) {
      done.wait();  // alive, but never calls the next allreduce
      return;
    }
    struct Release {  // rank 1 goes once rank 0 is done, however it ends
      std::promise<void>& p;
      ~Release() { p.set_value(); }
    } release{rank0_done};
    const auto t0 = Clock::now();
    try {
      comm->allreduce_sum(d.get(), d.size());
      first = "no error";
    } catch (const TransportError& e) {
      first = e.what();
    }
    took = Clock::now() - t0;
    try {
      comm->allreduce_sum(d.get(), d.size());
      later = "no error";
    } catch (const TransportError& e) {
      later = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(errors[r]) << "rank " << r << ": " << message(errors[r]);
  EXPECT_NE(first.find("allreduce"), std::string::npos) << first;
  EXPECT_NE(first.find("restart the site"), std::string::npos) << first;
  EXPECT_LT(took, std::chrono::seconds(20));
  EXPECT_NE(later.find("unusable after an earlier failure"), std::string::npos) << later;
}

}  // namespace
}  // namespace fedwan::testing
