// The demo's model and training helpers: a small CNN for Fashion-MNIST, a
// per-site minibatch trainer and a test-set evaluation. Sized so that a whole
// federation plus its centralised baseline trains in a few CPU minutes.
//
// Threading: none of this sets the intra-op thread count; callers that share
// the machine with other processes call torch::set_num_threads(1) first.
// Not thread safe: one model, optimizer and Trainer per thread.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace fedwan::workload {

struct FashionCnnOptions {
  int64_t conv1_channels = 8;   // 5x5 conv, padding 2, on 28x28, then ReLU + 2x2 max-pool
  int64_t conv2_channels = 16;  // 5x5 conv, padding 2, on 14x14, then ReLU + 2x2 max-pool
  int64_t hidden = 0;           // 0: linear 7*7*conv2 -> 10; else -> hidden -> ReLU -> 10
};

class FashionCnnImpl : public torch::nn::Module {
 public:
  explicit FashionCnnImpl(const FashionCnnOptions& options = {});
  // x: float [N, 1, 28, 28]; returns logits [N, 10].
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};  // null when options.hidden == 0
};
TORCH_MODULE(FashionCnn);

// Builds the model with parameters drawn from torch's global generator seeded
// with `seed` (torch::manual_seed), so every process that calls this with the
// same seed and options holds bit-identical initial parameters. Side effect:
// re-seeds torch's global generator.
FashionCnn make_fashion_cnn(uint64_t seed, const FashionCnnOptions& options = {});

// One site's view of the training set: its sample indices, drawn in
// minibatches of a fixed size from a seeded shuffle, reshuffled every epoch.
// A batch that crosses the end of an epoch is completed from the next epoch's
// shuffle, so every step sees exactly `batch_size` samples (a site with fewer
// samples than `batch_size` repeats samples within a batch).
class Trainer {
 public:
  // `images` [N,1,28,28] and `labels` [N] are shared, not copied, and may
  // live on a GPU (the model must then be there too); `indices` must be
  // non-empty and index into them.
  Trainer(torch::Tensor images, torch::Tensor labels, std::vector<int64_t> indices,
          int64_t batch_size, uint64_t seed);

  // One optimizer step on the next minibatch (train mode, cross-entropy);
  // returns the minibatch's mean loss. In a site of `ranks` ranks, rank
  // `rank` trains on its slice of the minibatch (every rank draws the same
  // minibatches) and `after_backward` averages the gradients (DataParallel).
  float step(FashionCnn& model, torch::optim::Optimizer& optimizer,
             const std::function<void()>& after_backward = {}, int rank = 0, int ranks = 1);

  int64_t batch_size() const { return batch_size_; }
  size_t num_samples() const { return order_.size(); }
  uint64_t epoch() const { return epoch_; }

 private:
  torch::Tensor next_batch();

  torch::Tensor images_;
  torch::Tensor labels_;
  std::vector<int64_t> order_;
  int64_t batch_size_;
  std::mt19937_64 rng_;
  size_t cursor_ = 0;
  uint64_t epoch_ = 0;
};

struct Evaluation {
  double accuracy = 0.0;  // share of correct top-1 predictions, in [0, 1]
  double loss = 0.0;      // mean cross-entropy
};

// Accuracy and loss over the whole set, in batches of 1000 without autograd.
// The model is put in eval mode for the pass and restored to its previous mode.
Evaluation evaluate(FashionCnn& model, const torch::Tensor& images, const torch::Tensor& labels);

}  // namespace fedwan::workload
