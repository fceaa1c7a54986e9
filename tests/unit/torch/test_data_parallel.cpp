// DataParallel over the Gloo engine, ranks as threads: 2 ranks on half a
// batch each end, after K SGD steps, with the parameters of 1 rank trained
// on the whole batch (float tolerance), with and without overlap, with
// several buckets, an unused and a frozen parameter; a rank that leaves makes
// the other fail with a clear error.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/data_parallel.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_comm.hpp"
#include "harness/site_ranks.hpp"

namespace fedwan::testing {
namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    unused = register_module("unused", torch::nn::Linear(4, 4));  // never in forward
    frozen = register_parameter("frozen", torch::ones({4}), /*requires_grad=*/false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(torch::relu(fc1->forward(x))) + frozen;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr};
  torch::Tensor frozen;
};
TORCH_MODULE(Net);

constexpr int kSteps = 5;
constexpr int64_t kBatch = 32;

Net make_net() {
  torch::manual_seed(11);
  return Net();
}

// The batches of every step, made once (torch's generator is global: the
// ranks' threads must not draw from it).
struct Data {
  torch::Tensor x, y;
};
Data make_data() {
  torch::manual_seed(5);
  return {torch::randn({kSteps, kBatch, 8}), torch::randn({kSteps, kBatch, 4})};
}

// Trains on rows [begin, end) of the batch of each step; `after_backward`
// is the data-parallel hook (nothing for the single-rank reference).
std::vector<torch::Tensor> train(Net& net, const Data& d, int64_t begin, int64_t end,
                                 const std::function<void()>& after_backward) {
  const torch::Tensor& x = d.x;
  const torch::Tensor& y = d.y;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    torch::Tensor out = net->forward(x[s].slice(0, begin, end));
    torch::mse_loss(out, y[s].slice(0, begin, end)).backward();
    after_backward();
    opt.step();
  }
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : net->parameters()) params.push_back(p.detach().clone());
  return params;
}

void expect_same_training(bool overlap, size_t bucket_bytes) {
  torch::set_num_threads(1);
  const Data data = make_data();
  Net ref = make_net();
  const std::vector<torch::Tensor> expected = train(ref, data, 0, kBatch, [] {});
  // Rank 1 starts from another model: the broadcast must fix that.
  std::vector<Net> nets = {make_net(), Net(nullptr)};
  torch::manual_seed(99);
  nets[1] = Net();
  TempDir dir;
  std::vector<std::vector<torch::Tensor>> got(2);
  std::vector<DataParallelStats> stats(2);
  const auto errors = run_ranks(2, [&](int r) {
    torch::set_num_threads(1);
    auto comm = make_gloo_comm(rank_options(dir, r, 2, std::chrono::seconds(20)));
    Net& net = nets[r];
    DataParallelOptions dpo;
    dpo.overlap = overlap;
    dpo.bucket_bytes = bucket_bytes;
    DataParallel dp(*net, *comm, dpo);
    dp.broadcast_parameters();
    got[r] = train(net, data, r * kBatch / 2, (r + 1) * kBatch / 2, [&] { dp.synchronize(); });
    stats[r] = dp.stats();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << "rank " << r << ": " << message(errors[r]);
    ASSERT_EQ(got[r].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[r][i], expected[i], 1e-5, 1e-6))
          << "rank " << r << " parameter " << i << " differs by "
          << (got[r][i] - expected[i]).abs().max().item<float>();
    }
    EXPECT_EQ(stats[r].steps, static_cast<uint64_t>(kSteps));
  }
  // The two ranks hold bit-identical models.
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(torch::equal(got[0][i], got[1][i]));
  if (overlap && bucket_bytes < 1024) {
    EXPECT_GT(stats[0].buckets_during_backward, 0u) << "no bucket started during backward";
  }
  // The unused layer was never trained (its gradient stays undefined, so
  // momentum SGD leaves it alone): bit for bit its initial value.
  EXPECT_TRUE(torch::equal(nets[0]->unused->weight, ref->unused->weight));
  EXPECT_TRUE(torch::equal(nets[1]->unused->weight, ref->unused->weight));
  EXPECT_FALSE(nets[0]->unused->weight.grad().defined());
}

TEST(DataParallel, TwoRanksMatchOneRankOnTheCombinedBatchWithOverlap) {
  expect_same_training(/*overlap=*/true, /*bucket_bytes=*/256);
}

TEST(DataParallel, TwoRanksMatchOneRankOnTheCombinedBatchWithoutOverlap) {
  expect_same_training(/*overlap=*/false, /*bucket_bytes=*/256);
}

TEST(DataParallel, OneBucketForTheWholeModel) {
  expect_same_training(/*overlap=*/true, /*bucket_bytes=*/25u << 20);
}

TEST(DataParallel, ARankThatLeavesFailsTheSiteWithAClearError) {
  torch::set_num_threads(1);
  TempDir dir;
  std::string error;
  std::vector<Net> nets = {make_net(), make_net()};
  const torch::Tensor input = torch::randn({4, 8});
  const auto errors = run_ranks(2, [&](int r) {
    torch::set_num_threads(1);
    auto comm = make_gloo_comm(rank_options(dir, r, 2, std::chrono::seconds(3)));
    Net& net = nets[r];
    DataParallel dp(*net, *comm);
    dp.broadcast_parameters();
    if (r == 1) return;  // leaves before training
    net->forward(input).sum().backward();
    try {
      dp.synchronize();
    } catch (const TransportError& e) {
      error = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(errors[r]) << message(errors[r]);
  EXPECT_NE(error.find("failed"), std::string::npos) << error;
}

TEST(DataParallel, RefusesParametersItCannotServe) {
  TempDir dir;
  auto comm = make_gloo_comm(rank_options(dir, 0, 1, std::chrono::seconds(3)));
  torch::nn::Linear lin(2, 2);
  lin->to(torch::kFloat64);
  EXPECT_THROW(DataParallel(*lin, *comm), ConfigError);
}

}  // namespace
}  // namespace fedwan::testing
