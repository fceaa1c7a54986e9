// fedwan::Site with several ranks, in a federation of threads: site-1 runs
// 2 ranks (Gloo, DataParallel), site-0 one. Every rank leaves the loop at
// the same round, the two ranks of site-1 hold bit-identical models, and
// every site ends with the root's final global model (fp32 codec).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <thread>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/data_parallel.hpp"
#include "fedwan/site.hpp"
#include "fedwan/site_comm.hpp"
#include "harness/federation_fixture.hpp"

namespace fedwan::testing {
namespace {

torch::nn::Sequential make_net() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(),
                               torch::nn::Linear(8, 2));
}

std::vector<float> flat_copy(torch::nn::Module& m) {
  std::vector<float> out;
  for (const torch::Tensor& p : m.parameters()) {
    const torch::Tensor c = p.detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

TEST(MultiRankSite, RanksAgreeAndEndWithTheGlobalModel) {
  torch::set_num_threads(1);
  TempDir dir;
  FederationSpec fed;
  fed.rounds = 3;
  fed.inner_steps = 4;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;
  fed.round_timeout_s = 60;
  const Topology topo = make_tree(dir.path(), 0, 2, fed);
  // Models and data made here: torch's generator is global to the threads.
  std::vector<torch::nn::Sequential> nets = {make_net(), make_net(), make_net()};
  const std::vector<float> init = flat_copy(*nets[0]);
  torch::manual_seed(8);
  const torch::Tensor x = torch::randn({64, 6});
  const torch::Tensor y = torch::randn({64, 2});

  std::mutex mu;
  std::vector<std::string> errors;
  AggregatorSummary root;
  std::vector<std::vector<float>> finals(3);  // site-0, site-1 rank 0, site-1 rank 1
  std::vector<uint64_t> rounds(3);
  auto fail = [&](const std::string& who, const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(who + ": " + e.what());
  };
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    try {
      AggregatorOptions o;
      o.topology = topo;
      o.node_id = "root";
      o.join_timeout = std::chrono::seconds(30);
      o.security = security_for(topo, "root");
      o.initial_model = init;
      root = Aggregator(std::move(o)).run();
    } catch (const std::exception& e) {
      fail("root", e);
    }
  });
  // One training loop: `slot` indexes nets/finals; rank/ranks slice the batch.
  auto site = [&](const std::string& node, int slot, int rank, int ranks) {
    try {
      torch::set_num_threads(1);
      std::unique_ptr<SiteComm> comm;
      if (ranks > 1) {
        SiteCommOptions c;
        c.rank = rank;
        c.size = ranks;
        c.rendezvous_dir = (dir.path() / ("rdv-" + node)).string();
        c.name = node;
        c.timeout = std::chrono::seconds(30);
        comm = make_gloo_comm(c);
      }
      torch::nn::Sequential& net = nets[slot];
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
      SiteOptions o;
      o.topology = topo;
      o.node_id = node;
      o.join_timeout = std::chrono::seconds(30);
      o.round_timeout = std::chrono::seconds(30);
      o.security = security_for(topo, node);
      Site s(std::move(o), *net, &opt, comm.get());
      std::unique_ptr<DataParallel> dp;
      if (comm) dp = std::make_unique<DataParallel>(*net, *comm);
      s.join();
      int64_t step = 0;
      while (!s.finished()) {
        const int64_t b0 = (step * 16) % 64;
        const int64_t lo = b0 + 16 * rank / ranks, hi = b0 + 16 * (rank + 1) / ranks;
        opt.zero_grad();
        torch::mse_loss(net->forward(x.slice(0, lo, hi)), y.slice(0, lo, hi)).backward();
        if (dp) dp->synchronize();
        opt.step();
        s.step();
        ++step;
      }
      EXPECT_EQ(s.leader(), rank == 0);
      std::lock_guard<std::mutex> lock(mu);
      finals[slot] = flat_copy(*net);
      rounds[slot] = s.round();
    } catch (const std::exception& e) {
      fail(node + " rank " + std::to_string(rank), e);
    }
  };
  threads.emplace_back([&] { site("site-0", 0, 0, 1); });
  threads.emplace_back([&] { site("site-1", 1, 0, 2); });
  threads.emplace_back([&] { site("site-1", 2, 1, 2); });
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  EXPECT_EQ(rounds, (std::vector<uint64_t>{3, 3, 3}));
  ASSERT_EQ(root.global_model.size(), init.size());
  EXPECT_NE(root.global_model, init) << "the federation did not train";
  EXPECT_EQ(finals[1], finals[2]) << "the ranks of site-1 diverged";
  EXPECT_EQ(finals[0], root.global_model);
  EXPECT_EQ(finals[1], root.global_model);
}

// An optimizer's state entry for `param`: LibTorch 1.x keys the state by the
// printed address of the tensor, 2.x by the address itself.
template <class Map>
auto find_state(Map& state, void* param) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;
    key << param;
    return state.find(key.str());
  } else {
    return state.find(param);
  }
}

// The momentum buffers of `opt`, in parameter order (empty before a step).
std::vector<torch::Tensor> momenta(torch::optim::SGD& opt) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : opt.param_groups()[0].params()) {
    auto it = find_state(opt.state(), p.unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    out.push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
  }
  return out;
}

// Rank 0 checkpoints at round 2 and both ranks stop, as processes stopped by
// SIGTERM would; started again with fresh optimizers, rank 0 resumes its
// checkpoint and hands its optimizer state to rank 1, and the site finishes
// the federation with its ranks in step.
TEST(MultiRankSite, ResumedLeaderHandsItsOptimizerStateToTheOtherRanks) {
  torch::set_num_threads(1);
  TempDir dir;
  FederationSpec fed;
  fed.rounds = 4;
  fed.inner_steps = 3;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;
  fed.round_timeout_s = 60;
  fed.heartbeat_s = 0.3;
  fed.heartbeat_timeout_s = 5;
  const Topology topo = make_tree(dir.path(), 0, 1, fed);
  std::vector<torch::nn::Sequential> nets = {make_net(), make_net()};
  const std::vector<float> init = flat_copy(*nets[0]);
  torch::manual_seed(8);
  const torch::Tensor x = torch::randn({64, 6});
  const torch::Tensor y = torch::randn({64, 2});

  std::mutex mu;
  std::vector<std::string> errors;
  AggregatorSummary root;
  std::vector<std::vector<float>> finals(2);
  std::vector<std::vector<torch::Tensor>> resumed_momenta(2);
  std::vector<uint64_t> resumed_round(2);
  auto fail = [&](const std::string& who, const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(who + ": " + e.what());
  };
  std::thread root_thread([&] {
    try {
      AggregatorOptions o;
      o.topology = topo;
      o.node_id = "root";
      o.join_timeout = std::chrono::seconds(30);
      o.security = security_for(topo, "root");
      o.initial_model = init;
      root = Aggregator(std::move(o)).run();
    } catch (const std::exception& e) {
      fail("root", e);
    }
  });
  auto rank_main = [&](int rank) {
    try {
      torch::set_num_threads(1);
      torch::nn::Sequential& net = nets[rank];
      for (int life = 0; life < 2; ++life) {
        SiteCommOptions c;
        c.rank = rank;
        c.size = 2;
        c.rendezvous_dir = (dir.path() / ("rdv-" + std::to_string(life))).string();
        c.timeout = std::chrono::seconds(30);
        std::unique_ptr<SiteComm> comm = make_gloo_comm(c);
        // A fresh process: a fresh optimizer (no momentum yet).
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
        SiteOptions o;
        o.topology = topo;
        o.node_id = "site-0";
        o.join_timeout = std::chrono::seconds(30);
        o.round_timeout = std::chrono::seconds(30);
        o.security = security_for(topo, "site-0");
        if (rank == 0) o.checkpoint_dir = (dir.path() / "ckpt").string();
        Site s(std::move(o), *net, &opt, comm.get());
        DataParallel dp(*net, *comm);
        s.join();
        if (life == 1) {
          std::lock_guard<std::mutex> lock(mu);
          resumed_momenta[rank] = momenta(opt);
          resumed_round[rank] = s.round();
        }
        int64_t step = 0;
        while (!s.finished()) {
          const int64_t b0 = (step * 16) % 64;
          const int64_t lo = b0 + 8 * rank, hi = lo + 8;
          opt.zero_grad();
          torch::mse_loss(net->forward(x.slice(0, lo, hi)), y.slice(0, lo, hi)).backward();
          dp.synchronize();
          opt.step();
          const std::optional<SyncResult> r = s.step();
          ++step;
          if (life == 0 && r && r->round == 2) {
            if (s.leader()) s.core().checkpoint();
            break;  // "SIGTERM"
          }
        }
        if (life == 1) {
          std::lock_guard<std::mutex> lock(mu);
          finals[rank] = flat_copy(*net);
        }
      }
    } catch (const std::exception& e) {
      fail("site-0 rank " + std::to_string(rank), e);
    }
  };
  std::thread r0([&] { rank_main(0); });
  std::thread r1([&] { rank_main(1); });
  r0.join();
  r1.join();
  root_thread.join();
  ASSERT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  EXPECT_EQ(resumed_round, (std::vector<uint64_t>{2, 2}));
  ASSERT_FALSE(resumed_momenta[0].empty()) << "rank 0 did not restore its optimizer state";
  ASSERT_EQ(resumed_momenta[1].size(), resumed_momenta[0].size())
      << "rank 1 did not receive the optimizer state";
  for (size_t i = 0; i < resumed_momenta[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed_momenta[0][i], resumed_momenta[1][i])) << i;
  }
  EXPECT_EQ(finals[0], finals[1]);
  EXPECT_EQ(finals[0], root.global_model);
}

}  // namespace
}  // namespace fedwan::testing
