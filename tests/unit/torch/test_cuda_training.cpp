// LibTorch training on CUDA devices. DataParallel refuses CUDA parameters
// over a communicator that takes host memory only. With the NCCL engine
// linked in (FEDWAN_TORCH_TESTS_WITH_CUDA): on one GPU, DataParallel over a
// one-rank site trains exactly as without it, and a Site whose model lives on
// the GPU ends with the federation's model; on two GPUs, two ranks on half a
// batch each match one CPU rank on the whole batch. Each test skips without
// the devices it needs (and without a CUDA build of LibTorch).
#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/data_parallel.hpp"
#include "fedwan/error.hpp"
#include "fedwan/flat_parameters.hpp"
#include "fedwan/site.hpp"
#include "fedwan/site_comm.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"
#include "harness/site_ranks.hpp"

#ifdef FEDWAN_TORCH_TESTS_WITH_CUDA
#include "fedwan/cuda.hpp"
#endif

namespace fedwan::testing {
namespace {

using std::chrono::seconds;

int cuda_devices() {
  if (!torch::cuda::is_available()) return 0;
  return static_cast<int>(torch::cuda::device_count());
}

#define SKIP_UNLESS_GPUS(n)                                                            \
  do {                                                                                 \
    if (cuda_devices() < (n)) {                                                        \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s) and a CUDA LibTorch, found " \
                   << cuda_devices();                                                  \
    }                                                                                  \
  } while (0)

torch::Device gpu(int i) { return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)); }

TEST(CudaTraining, DataParallelRefusesCudaParametersOverAHostOnlyCommunicator) {
  SKIP_UNLESS_GPUS(1);
  TempDir dir;
  auto comm = make_gloo_comm(rank_options(dir, 0, 1, seconds(3)));
  torch::nn::Linear lin(2, 2);
  lin->to(gpu(0));
  try {
    DataParallel dp(*lin, *comm);
    FAIL() << "DataParallel took CUDA parameters over the Gloo engine";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fedwan::cuda::make_site_comm"), std::string::npos)
        << e.what();
  }
}

TEST(CudaTraining, FlatParametersKeepAModelOnItsDevice) {
  SKIP_UNLESS_GPUS(1);
  torch::nn::Linear lin(3, 2);
  lin->to(gpu(0));
  FlatParameters flat(*lin);
  EXPECT_TRUE(flat.device().is_cuda());
  EXPECT_EQ(flat.numel(), 8u);
  for (const torch::Tensor& p : lin->parameters()) EXPECT_TRUE(p.device().is_cuda());
  // The parameters are views of the flat buffer, on the device.
  {
    torch::NoGradGuard no_grad;
    flat.flat().fill_(2.0f);
  }
  EXPECT_EQ(lin->weight.sum().item<float>(), 12.0f);
  // One device per model.
  torch::nn::Linear split(3, 2);
  split->weight.set_data(split->weight.data().to(gpu(0)));
  EXPECT_THROW(FlatParameters{*split}, ConfigError);
}

#ifdef FEDWAN_TORCH_TESTS_WITH_CUDA

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    unused = register_module("unused", torch::nn::Linear(4, 4));  // never in forward
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(torch::relu(fc1->forward(x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr};
};
TORCH_MODULE(Net);

constexpr int kSteps = 5;
constexpr int64_t kBatch = 32;

Net make_net(torch::Device device) {
  torch::manual_seed(11);
  Net net;  // drawn on the CPU: the same values wherever it then goes
  net->to(device);
  return net;
}

struct Data {
  torch::Tensor x, y;  // [kSteps, kBatch, ...] on the CPU
};
Data make_data() {
  torch::manual_seed(5);
  return {torch::randn({kSteps, kBatch, 8}), torch::randn({kSteps, kBatch, 4})};
}

// Trains on rows [begin, end) of each step's batch; returns the parameters
// on the CPU.
std::vector<torch::Tensor> train(Net& net, const Data& d, int64_t begin, int64_t end,
                                 torch::Device device, const std::function<void()>& after) {
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const torch::Tensor x = d.x[s].slice(0, begin, end).to(device);
    const torch::Tensor y = d.y[s].slice(0, begin, end).to(device);
    torch::mse_loss(net->forward(x), y).backward();
    after();
    opt.step();
  }
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : net->parameters()) out.push_back(p.detach().cpu());
  return out;
}

TEST(CudaTraining, OneGpuSiteTrainsAsWithoutDataParallel) {
  SKIP_UNLESS_GPUS(1);
  torch::set_num_threads(1);
  const Data data = make_data();
  Net ref = make_net(gpu(0));
  const std::vector<torch::Tensor> expected = train(ref, data, 0, kBatch, gpu(0), [] {});
  TempDir dir;
  auto comm = cuda::make_site_comm(rank_options(dir, 0, 1, seconds(20)), 0);
  Net net = make_net(gpu(0));
  DataParallelOptions o;
  o.bucket_bytes = 256;  // several buckets
  DataParallel dp(*net, *comm, o);
  EXPECT_GT(dp.num_buckets(), 1u);
  dp.broadcast_parameters();
  const std::vector<torch::Tensor> got =
      train(net, data, 0, kBatch, gpu(0), [&] { dp.synchronize(); });
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], expected[i], 1e-6, 1e-7)) << "parameter " << i;
  }
  EXPECT_FALSE(net->unused->weight.grad().defined());
}

TEST(CudaTraining, TwoGpusMatchOneCpuRankOnTheCombinedBatch) {
  SKIP_UNLESS_GPUS(2);
  if (cuda::device_count() < 2) GTEST_SKIP() << "fedwan's CUDA side sees fewer than 2 GPUs";
  torch::set_num_threads(1);
  const Data data = make_data();
  Net ref = make_net(torch::kCPU);
  const std::vector<torch::Tensor> expected = train(ref, data, 0, kBatch, torch::kCPU, [] {});
  std::vector<Net> nets = {make_net(gpu(0)), make_net(gpu(1))};
  {
    // Rank 1 starts from another model: the broadcast must fix that.
    torch::NoGradGuard no_grad;
    for (torch::Tensor p : nets[1]->parameters()) p.add_(1.0f);
  }
  TempDir dir;
  std::vector<std::vector<torch::Tensor>> got(2);
  std::vector<DataParallelStats> stats(2);
  const auto errors = run_ranks(2, [&](int r) {
    torch::set_num_threads(1);
    auto comm = cuda::make_site_comm(rank_options(dir, r, 2, seconds(30)), r);
    DataParallelOptions o;
    o.bucket_bytes = 256;
    DataParallel dp(*nets[r], *comm, o);
    dp.broadcast_parameters();
    got[r] = train(nets[r], data, r * kBatch / 2, (r + 1) * kBatch / 2, gpu(r),
                   [&] { dp.synchronize(); });
    stats[r] = dp.stats();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << "rank " << r << ": " << message(errors[r]);
    ASSERT_EQ(got[r].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[r][i], expected[i], 1e-4, 1e-5))
          << "rank " << r << " parameter " << i << " differs by "
          << (got[r][i] - expected[i]).abs().max().item<float>();
    }
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[0][i], got[1][i])) << "the ranks diverged at parameter " << i;
  }
  EXPECT_GT(stats[0].buckets_during_backward, 0u) << "no bucket started during backward";
}

// A root and two single-rank sites as threads (fp32 codec): site-0 trains on
// the GPU, site-1 on the CPU (or, with two GPUs, as two ranks over NCCL).
// The GPU site's update is encoded on the GPU (cuda::DeviceUpdateEncoder):
// losslessly with fp32, and with int8 and its error feedback.
class GpuSiteCodec : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuSiteCodec, ASiteOnTheGpuEndsWithTheFederationsModel) {
  SKIP_UNLESS_GPUS(1);
  const bool lossless = GetParam() == "fp32";
  torch::set_num_threads(1);
  const bool two_rank_site = cuda_devices() >= 2 && cuda::device_count() >= 2;
  FederationSpec fed;
  fed.rounds = 3;
  fed.inner_steps = 4;
  fed.codec = GetParam();
  fed.chunk_bytes = 4096;
  fed.round_timeout_s = 60;
  fed.heartbeat_s = 0.3;
  fed.heartbeat_timeout_s = 5;
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 2, fed);
  const Data data = make_data();
  // Every site starts from the same CPU-drawn model.
  std::vector<float> init;
  {
    Net n = make_net(torch::kCPU);
    for (const torch::Tensor& p : n->parameters()) {
      const torch::Tensor c = p.detach().contiguous();
      init.insert(init.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
  }
  std::vector<Net> nets = {make_net(gpu(0)), make_net(two_rank_site ? gpu(0) : torch::kCPU),
                           make_net(two_rank_site ? gpu(1) : torch::kCPU)};
  std::mutex mu;
  std::vector<std::vector<float>> finals(3);
  AggregatorSummary root;
  // `slot` picks the model; ranks > 1 meet over make_site_comm.
  auto site = [&](const std::string& node, int slot, int rank, int ranks) {
    torch::set_num_threads(1);
    Net& net = nets[slot];
    const torch::Device device = net->fc1->weight.device();
    std::unique_ptr<SiteComm> comm;
    if (ranks > 1) {
      comm = cuda::make_site_comm(rank_options(dir, rank, ranks, seconds(30), node), rank);
    }
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
    Site s(site_options(topo, node, seconds(30)), *net, &opt, comm.get());
    EXPECT_EQ(s.parameters().device(), device);
    std::unique_ptr<DataParallel> dp;
    if (comm) dp = std::make_unique<DataParallel>(*net, *comm);
    s.join();
    for (int64_t step = 0; !s.finished(); ++step) {
      const int64_t b0 = step % kSteps;
      const int64_t lo = kBatch * rank / ranks, hi = kBatch * (rank + 1) / ranks;
      opt.zero_grad();
      torch::mse_loss(net->forward(data.x[b0].slice(0, lo, hi).to(device)),
                      data.y[b0].slice(0, lo, hi).to(device))
          .backward();
      if (dp) dp->synchronize();
      opt.step();
      s.step();
    }
    const torch::Tensor flat = s.parameters().flat().cpu();
    std::lock_guard<std::mutex> lock(mu);
    finals[slot].assign(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  };
  NodeSpawner nodes;
  nodes.spawn("root", [&](NodeStopper& stopper) {
    torch::set_num_threads(1);
    AggregatorOptions o;
    o.topology = topo;
    o.node_id = "root";
    o.join_timeout = seconds(30);
    o.security = security_for(topo, "root");
    o.initial_model = init;
    Aggregator aggregator(std::move(o));
    const auto bound = stopper.bind([&aggregator] { aggregator.stop(); });
    AggregatorSummary s = aggregator.run();
    std::lock_guard<std::mutex> lock(mu);
    root = std::move(s);
  });
  nodes.spawn("site-0", [&] { site("site-0", 0, 0, 1); });
  if (two_rank_site) {
    nodes.spawn("site-1 rank 0", [&] { site("site-1", 1, 0, 2); });
    nodes.spawn("site-1 rank 1", [&] { site("site-1", 2, 1, 2); });
  } else {
    nodes.spawn("site-1", [&] { site("site-1", 1, 0, 1); });
  }
  nodes.join();
  ASSERT_TRUE(nodes.error_list().empty()) << ::testing::PrintToString(nodes.error_list());
  ASSERT_EQ(root.global_model.size(), init.size());
  EXPECT_NE(root.global_model, init) << "the federation did not train";
  // Every site holds the same final model; with fp32 it is the root's.
  EXPECT_EQ(finals[0], finals[1]) << "the GPU site does not hold the federation's model";
  if (two_rank_site) {
    EXPECT_EQ(finals[2], finals[1]);
  }
  if (lossless) {
    EXPECT_EQ(finals[0], root.global_model) << "the GPU site does not hold the global model";
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, GpuSiteCodec, ::testing::Values("fp32", "int8"));

#endif  // FEDWAN_TORCH_TESTS_WITH_CUDA

}  // namespace
}  // namespace fedwan::testing
