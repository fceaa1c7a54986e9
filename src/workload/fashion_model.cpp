#include "workload/fashion_model.hpp"

#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <algorithm>
#include <string>
#include <utility>

#include "fedwan/error.hpp"

namespace fedwan::workload {
namespace {

constexpr int64_t kClasses = 10;
constexpr int64_t kEvalBatch = 1000;

// Fisher-Yates with an explicit unbiased draw: std::shuffle's sequence of
// draws is unspecified, and the demo's sites should see the same batches on
// every standard library.
void shuffle(std::vector<int64_t>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    const uint64_t bound = i;
    const uint64_t threshold = (0 - bound) % bound;
    uint64_t r = rng();
    while (r < threshold) r = rng();
    std::swap(v[i - 1], v[static_cast<size_t>(r % bound)]);
  }
}

}  // namespace

FashionCnnImpl::FashionCnnImpl(const FashionCnnOptions& options) {
  if (options.conv1_channels < 1 || options.conv2_channels < 1 || options.hidden < 0) {
    throw ConfigError("FashionCnn: channel counts must be >= 1 and hidden >= 0");
  }
  conv1_ = register_module(
      "conv1",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, options.conv1_channels, 5).padding(2)));
  conv2_ = register_module(
      "conv2",
      torch::nn::Conv2d(
          torch::nn::Conv2dOptions(options.conv1_channels, options.conv2_channels, 5).padding(2)));
  const int64_t flat = options.conv2_channels * 7 * 7;
  if (options.hidden == 0) {
    fc1_ = register_module("fc1", torch::nn::Linear(flat, kClasses));
  } else {
    fc1_ = register_module("fc1", torch::nn::Linear(flat, options.hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(options.hidden, kClasses));
  }
}

torch::Tensor FashionCnnImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(conv1_->forward(x)), 2);
  x = torch::max_pool2d(torch::relu(conv2_->forward(x)), 2);
  x = fc1_->forward(x.flatten(1));
  if (fc2_) x = fc2_->forward(torch::relu(x));
  return x;
}

FashionCnn make_fashion_cnn(uint64_t seed, const FashionCnnOptions& options) {
  torch::manual_seed(seed);
  return FashionCnn(options);
}

Trainer::Trainer(torch::Tensor images, torch::Tensor labels, std::vector<int64_t> indices,
                 int64_t batch_size, uint64_t seed)
    : images_(std::move(images)),
      labels_(std::move(labels)),
      order_(std::move(indices)),
      batch_size_(batch_size),
      rng_(seed) {
  if (order_.empty()) throw ConfigError("Trainer: a site needs at least one sample");
  if (batch_size_ < 1) throw ConfigError("Trainer: batch size must be >= 1");
  if (images_.dim() != 4 || labels_.dim() != 1 || images_.size(0) != labels_.size(0)) {
    throw ConfigError("Trainer: images must be [N,1,28,28] and labels [N]");
  }
  const int64_t n = images_.size(0);
  for (int64_t i : order_) {
    if (i < 0 || i >= n) {
      throw ConfigError("Trainer: sample index " + std::to_string(i) + " outside [0, " +
                        std::to_string(n) + ")");
    }
  }
  shuffle(order_, rng_);
}

torch::Tensor Trainer::next_batch() {
  torch::Tensor batch = torch::empty({batch_size_}, torch::kInt64);
  int64_t* out = batch.data_ptr<int64_t>();
  for (int64_t k = 0; k < batch_size_; ++k) {
    if (cursor_ == order_.size()) {
      shuffle(order_, rng_);
      cursor_ = 0;
      ++epoch_;
    }
    out[k] = order_[cursor_++];
  }
  return batch;
}

float Trainer::step(FashionCnn& model, torch::optim::Optimizer& optimizer,
                    const std::function<void()>& after_backward, int rank, int ranks) {
  torch::Tensor index = next_batch();
  if (ranks > 1) {
    const int64_t b = index.size(0);
    index = index.slice(0, b * rank / ranks, b * (rank + 1) / ranks);
  }
  index = index.to(images_.device());  // no copy on the CPU
  const torch::Tensor x = images_.index_select(0, index);
  const torch::Tensor y = labels_.index_select(0, index);
  model->train();
  optimizer.zero_grad();
  torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
  loss.backward();
  if (after_backward) after_backward();
  optimizer.step();
  return loss.item<float>();
}

Evaluation evaluate(FashionCnn& model, const torch::Tensor& images, const torch::Tensor& labels) {
  const int64_t n = images.size(0);
  if (n == 0 || labels.size(0) != n) throw ConfigError("evaluate: need N > 0 images and N labels");
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += kEvalBatch) {
    const int64_t end = std::min(n, begin + kEvalBatch);
    const torch::Tensor logits = model->forward(images.slice(0, begin, end));
    const torch::Tensor y = labels.slice(0, begin, end);
    loss_sum +=
        torch::nn::functional::cross_entropy(
            logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  }
  model->train(was_training);
  Evaluation result;
  result.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  result.loss = loss_sum / static_cast<double>(n);
  return result;
}

}  // namespace fedwan::workload
