// fedwan::Site with several ranks, in federations of threads (fp32 codec,
// sites directly under the root):
//   * site-1 runs 2 ranks (Gloo, DataParallel), site-0 one: every rank
//     leaves the loop at the same round, the ranks of site-1 hold
//     bit-identical models, and every site ends with the root's final model;
//     the same with overlapped syncs (federation.overlap_steps);
//   * a 2-rank site stopped at round 2 (rank 0 checkpoints, as at SIGTERM)
//     and started again with fresh optimizers gets rank 0's optimizer state
//     on every rank, and finishes in step.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/data_parallel.hpp"
#include "fedwan/site.hpp"
#include "fedwan/site_comm.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"
#include "harness/site_ranks.hpp"

namespace fedwan::testing {
namespace {

using std::chrono::seconds;

torch::nn::Sequential make_net() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
}

std::vector<float> flat_copy(torch::nn::Module& m) {
  std::vector<float> out;
  for (const torch::Tensor& p : m.parameters()) {
    const torch::Tensor c = p.detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
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

// The root and `sites` sites, `models` copies of one model and the data,
// all made on the test's thread (torch's generator is global to threads).
class SmallFederation {
 public:
  SmallFederation(int sites, int models, FederationSpec fed)
      : topo_(make_tree(dir_.path(), 0, sites, fed)) {
    for (int i = 0; i < models; ++i) nets.push_back(make_net());
    init_ = flat_copy(*nets[0]);
    torch::manual_seed(8);
    x_ = torch::randn({64, 6});
    y_ = torch::randn({64, 2});
  }

  void start_root() {
    nodes_.spawn("root", [this](NodeStopper& stopper) {
      AggregatorOptions o;
      o.topology = topo_;
      o.node_id = "root";
      o.join_timeout = seconds(30);
      o.security = security_for(topo_, "root");
      o.initial_model = init_;
      Aggregator aggregator(std::move(o));
      const auto bound = stopper.bind([&aggregator] { aggregator.stop(); });
      root = aggregator.run();
    });
  }
  // Runs `body` on a thread; what it throws is recorded under `who`.
  void start(const std::string& who, std::function<void()> body) {
    nodes_.spawn(who, [body = std::move(body)] {
      torch::set_num_threads(1);
      body();
    });
  }
  void join() { nodes_.join(); }

  std::unique_ptr<SiteComm> comm(const std::string& name, int rank, int ranks) {
    return make_gloo_comm(rank_options(dir_, rank, ranks, seconds(30), name));
  }
  SiteOptions site_options(const std::string& node) const {
    return fedwan::testing::site_options(topo_, node, seconds(30));
  }
  // One inner step of rank `rank` of `ranks` on its slice of batch `step`.
  void train_step(torch::nn::Sequential& net, torch::optim::Optimizer& opt, DataParallel* dp,
                  int64_t step, int rank, int ranks) const {
    const int64_t b0 = (step * 16) % 64;
    const int64_t lo = b0 + 16 * rank / ranks, hi = b0 + 16 * (rank + 1) / ranks;
    opt.zero_grad();
    torch::mse_loss(net->forward(x_.slice(0, lo, hi)), y_.slice(0, lo, hi)).backward();
    if (dp != nullptr) dp->synchronize();
    opt.step();
  }

  const std::filesystem::path& dir() const { return dir_.path(); }
  const std::vector<float>& init() const { return init_; }
  std::vector<std::string> errors() const { return nodes_.error_list(); }

  std::vector<torch::nn::Sequential> nets;
  AggregatorSummary root;
  std::mutex mu;  // guards what the threads report

 private:
  TempDir dir_;
  Topology topo_;
  std::vector<float> init_;
  torch::Tensor x_, y_;
  NodeSpawner nodes_;  // last: destroyed (stopped, joined) first
};

FederationSpec spec(uint64_t rounds, uint64_t inner_steps) {
  FederationSpec fed;
  fed.rounds = rounds;
  fed.inner_steps = inner_steps;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;
  fed.round_timeout_s = 60;
  fed.heartbeat_s = 0.3;
  fed.heartbeat_timeout_s = 5;
  return fed;
}

torch::optim::SGD make_sgd(torch::nn::Sequential& net) {
  return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
}

// tau = overlap_steps (0: blocking syncs).
void ranks_agree_and_end_with_the_global_model(uint64_t tau) {
  torch::set_num_threads(1);
  FederationSpec f = spec(3, 4);
  f.overlap_steps = tau;
  SmallFederation fed(2, 3, f);
  std::vector<std::vector<float>> finals(3);  // site-0, site-1 rank 0, site-1 rank 1
  std::vector<uint64_t> rounds(3);
  // `slot` indexes the models and results; rank/ranks slice each batch.
  auto site = [&](const std::string& node, int slot, int rank, int ranks) {
    std::unique_ptr<SiteComm> comm = ranks > 1 ? fed.comm(node, rank, ranks) : nullptr;
    torch::nn::Sequential& net = fed.nets[slot];
    torch::optim::SGD opt = make_sgd(net);
    Site s(fed.site_options(node), *net, &opt, comm.get());
    std::unique_ptr<DataParallel> dp;
    if (comm) dp = std::make_unique<DataParallel>(*net, *comm);
    s.join();
    for (int64_t step = 0; !s.finished(); ++step) {
      fed.train_step(net, opt, dp.get(), step, rank, ranks);
      s.step();
    }
    EXPECT_EQ(s.leader(), rank == 0);
    std::lock_guard<std::mutex> lock(fed.mu);
    finals[slot] = flat_copy(*net);
    rounds[slot] = s.round();
  };
  fed.start_root();
  fed.start("site-0", [&] { site("site-0", 0, 0, 1); });
  fed.start("site-1 rank 0", [&] { site("site-1", 1, 0, 2); });
  fed.start("site-1 rank 1", [&] { site("site-1", 2, 1, 2); });
  fed.join();
  ASSERT_TRUE(fed.errors().empty()) << ::testing::PrintToString(fed.errors());
  EXPECT_EQ(rounds, (std::vector<uint64_t>{3, 3, 3}));
  ASSERT_EQ(fed.root.global_model.size(), fed.init().size());
  EXPECT_NE(fed.root.global_model, fed.init()) << "the federation did not train";
  EXPECT_EQ(finals[1], finals[2]) << "the ranks of site-1 diverged";
  EXPECT_EQ(finals[0], fed.root.global_model);
  EXPECT_EQ(finals[1], fed.root.global_model);
}

TEST(MultiRankSite, RanksAgreeAndEndWithTheGlobalModel) {
  ranks_agree_and_end_with_the_global_model(0);
}

// Overlapped: the ranks train on while the leader's sync runs in the
// background, and all take the merged model at the same step.
TEST(MultiRankSite, OverlappedRanksAgreeAndEndWithTheGlobalModel) {
  ranks_agree_and_end_with_the_global_model(2);
}

TEST(MultiRankSite, ResumedLeaderHandsItsOptimizerStateToTheOtherRanks) {
  torch::set_num_threads(1);
  SmallFederation fed(1, 2, spec(4, 3));
  std::vector<std::vector<float>> finals(2);
  std::vector<std::vector<torch::Tensor>> resumed_momenta(2);
  std::vector<uint64_t> resumed_round(2);
  auto rank_main = [&](int rank) {
    torch::nn::Sequential& net = fed.nets[rank];
    for (int life = 0; life < 2; ++life) {
      std::unique_ptr<SiteComm> comm = fed.comm("site-0.life" + std::to_string(life), rank, 2);
      // A fresh process: a fresh optimizer (no momentum yet).
      torch::optim::SGD opt = make_sgd(net);
      SiteOptions o = fed.site_options("site-0");
      if (rank == 0) o.checkpoint_dir = (fed.dir() / "ckpt").string();
      Site s(std::move(o), *net, &opt, comm.get());
      DataParallel dp(*net, *comm);
      s.join();
      if (life == 1) {
        std::lock_guard<std::mutex> lock(fed.mu);
        resumed_momenta[rank] = momenta(opt);
        resumed_round[rank] = s.round();
      }
      for (int64_t step = 0; !s.finished(); ++step) {
        fed.train_step(net, opt, &dp, step, rank, 2);
        const std::optional<SyncResult> r = s.step();
        if (life == 0 && r && r->round == 2) {
          if (s.leader()) s.core().checkpoint();
          break;  // "SIGTERM"
        }
      }
      if (life == 1) {
        std::lock_guard<std::mutex> lock(fed.mu);
        finals[rank] = flat_copy(*net);
      }
    }
  };
  fed.start_root();
  fed.start("site-0 rank 0", [&] { rank_main(0); });
  fed.start("site-0 rank 1", [&] { rank_main(1); });
  fed.join();
  ASSERT_TRUE(fed.errors().empty()) << ::testing::PrintToString(fed.errors());
  EXPECT_EQ(resumed_round, (std::vector<uint64_t>{2, 2}));
  ASSERT_FALSE(resumed_momenta[0].empty()) << "rank 0 did not restore its optimizer state";
  ASSERT_EQ(resumed_momenta[1].size(), resumed_momenta[0].size())
      << "rank 1 did not receive the optimizer state";
  for (size_t i = 0; i < resumed_momenta[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed_momenta[0][i], resumed_momenta[1][i])) << i;
  }
  EXPECT_EQ(finals[0], finals[1]);
  EXPECT_EQ(finals[0], fed.root.global_model);
}

}  // namespace
}  // namespace fedwan::testing
