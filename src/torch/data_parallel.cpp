#include "fedwan/data_parallel.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fedwan/error.hpp"

namespace fedwan {

class DataParallel::Impl {
 public:
  Impl(torch::nn::Module& module, SiteComm& comm, DataParallelOptions o)
      : module_(module), comm_(comm), opt_(o) {
    if (opt_.bucket_bytes < sizeof(float)) {
      throw ConfigError("DataParallel: bucket_bytes must be at least 4");
    }
    const std::vector<torch::Tensor> all = module.parameters();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const torch::Tensor& p = *it;
      if (!p.requires_grad()) continue;  // frozen: not synchronised
      check_servable(p);
      // The step's bookkeeping (which parameters any rank used) goes where
      // the gradients go, so that a GPU site needs no host collective.
      if (p.device().is_cuda() && !control_.is_cuda()) control_ = p.device();
      Param q;
      q.tensor = p;
      q.numel = static_cast<size_t>(p.numel());
      params_.push_back(q);
    }
    std::vector<size_t> order(params_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    build_buckets(order);
    used_.assign(params_.size(), 0.0f);
    if (opt_.overlap) {
      for (size_t i = 0; i < params_.size(); ++i) {
        torch::Tensor p = params_[i].tensor;
        params_[i].hook = p.register_hook([this, i](torch::Tensor g) { on_grad(i, g); });
      }
    }
    worker_ = std::thread([this] { work(); });
  }

  ~Impl() {
    for (Param& p : params_) {
      if (p.hook >= 0) p.tensor.remove_hook(static_cast<unsigned>(p.hook));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void broadcast_parameters() {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> tensors = module_.parameters();
    for (const torch::Tensor& b : module_.buffers()) tensors.push_back(b);
    for (torch::Tensor t : tensors) {
      check_servable(t);
      torch::Tensor c = t.contiguous();
      run([&] { comm_.broadcast(c.data_ptr<float>(), static_cast<size_t>(c.numel()), 0); });
      wait_idle();
      if (!c.is_same(t)) t.copy_(c);
    }
  }

  void synchronize() {
    if (!opt_.overlap) {
      // Gradients as backward left them.
      for (size_t i = 0; i < params_.size(); ++i) {
        const torch::Tensor& g = params_[i].tensor.grad();
        if (g.defined()) on_grad(i, g);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Buckets with parameters unused here: zeros for those, in order.
      while (next_launch_ < buckets_.size()) {
        Bucket& b = buckets_[next_launch_];
        for (size_t pi : b.params) {
          if (!params_[pi].ready) slice(pi).zero_();
        }
        launch(next_launch_++);
        stats_.buckets_at_synchronize += 1;
      }
      // Which parameters any rank used (after the buckets, same order everywhere).
      queue_.push_back(
          [this] { on_control(used_, [this](float* v, size_t n) { comm_.allreduce_sum(v, n); }); });
    }
    cv_.notify_all();
    wait_idle();
    // The mean straight into each gradient: one pass over the bucket, no
    // temporary (a gradient backward did not make gets its own tensor).
    const float scale = 1.0f / static_cast<float>(comm_.size());
    const torch::Tensor factor = torch::scalar_tensor(scale);  // a CPU scalar, any device
    for (Param& p : params_) {
      const size_t i = static_cast<size_t>(&p - params_.data());
      if (used_[i] > 0) {
        const torch::Tensor sum = slice(i).view(p.tensor.sizes());
        if (!p.tensor.grad().defined()) {
          p.tensor.mutable_grad() = sum.mul(scale);
        } else if (comm_.size() == 1) {
          p.tensor.mutable_grad().copy_(sum);
        } else {
          torch::mul_out(p.tensor.mutable_grad(), sum, factor);
        }
      }
    }
    // Ready for the next step.
    for (Param& p : params_) p.ready = false;
    for (Bucket& b : buckets_) b.pending = b.params.size();
    std::fill(used_.begin(), used_.end(), 0.0f);
    next_launch_ = 0;
    stats_.steps += 1;
    if (stats_.steps == 1 && opt_.overlap && comm_.size() > 1) rebuild_in_arrival_order();
    arrival_.clear();
  }

  size_t num_buckets() const { return buckets_.size(); }

  // Buckets over the parameters in `order`, bucket_bytes each at most (a
  // parameter is never split), one open bucket per device: a bucket holds
  // the parameters of one device and lives there.
  void build_buckets(const std::vector<size_t>& order) {
    buckets_.clear();
    constexpr size_t kNone = ~size_t{0};
    std::vector<std::pair<torch::Device, size_t>> open;  // device -> its bucket being filled
    for (size_t i : order) {
      Param& p = params_[i];
      const torch::Device device = p.tensor.device();
      auto it =
          std::find_if(open.begin(), open.end(), [&](const auto& o) { return o.first == device; });
      if (it == open.end()) it = open.insert(open.end(), {device, kNone});
      size_t& k = it->second;
      if (k == kNone ||
          (buckets_[k].numel > 0 && (buckets_[k].numel + p.numel) * 4 > opt_.bucket_bytes)) {
        buckets_.emplace_back();
        buckets_.back().device = device;
        k = buckets_.size() - 1;
      }
      Bucket& b = buckets_[k];
      p.bucket = k;
      p.offset = b.numel;
      b.params.push_back(i);
      b.numel += p.numel;
    }
    for (Bucket& b : buckets_) {
      b.data = torch::zeros({static_cast<int64_t>(b.numel)},
                            torch::TensorOptions().dtype(torch::kFloat32).device(b.device));
      b.pending = b.params.size();
    }
  }

  // After the first step with overlap: buckets follow the order in which
  // rank 0's backward produced the gradients (unused parameters last), so a
  // parameter backward reaches late, or never, no longer holds up the
  // buckets before it. Rank 0's order is broadcast: every rank agrees.
  void rebuild_in_arrival_order() {
    std::vector<float> order(params_.size());
    std::vector<bool> seen(params_.size(), false);
    size_t k = 0;
    for (size_t i : arrival_) {
      if (!seen[i]) order[k++] = static_cast<float>(i), seen[i] = true;
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!seen[i]) order[k++] = static_cast<float>(i);
    }
    run([&] { on_control(order, [this](float* v, size_t n) { comm_.broadcast(v, n, 0); }); });
    wait_idle();
    std::vector<size_t> idx(order.size());
    for (size_t i = 0; i < order.size(); ++i) idx[i] = static_cast<size_t>(order[i]);
    build_buckets(idx);
  }
  const DataParallelStats& stats() const { return stats_; }

 private:
  struct Param {
    torch::Tensor tensor;
    size_t bucket = 0;
    size_t offset = 0;  // in the bucket, elements
    size_t numel = 0;
    int64_t hook = -1;
    bool ready = false;
  };
  struct Bucket {
    std::vector<size_t> params;
    size_t numel = 0;
    size_t pending = 0;
    torch::Device device = torch::kCPU;
    torch::Tensor data;  // fp32 [numel] on `device`
  };

  // Parameters this engine averages: fp32, on the CPU, or on a CUDA device
  // when the communicator takes device memory.
  void check_servable(const torch::Tensor& p) const {
    if (p.scalar_type() != torch::kFloat32 || !(p.device().is_cpu() || p.device().is_cuda())) {
      throw ConfigError(std::string("DataParallel: the ") + comm_.engine() +
                        " engine averages fp32 parameters on the CPU or a CUDA device; found "
                        "one of type " +
                        std::string(c10::toString(p.scalar_type())) + " on " + p.device().str());
    }
    if (p.device().is_cuda() && !comm_.accepts_device_memory()) {
      throw ConfigError(std::string("DataParallel: a parameter is on ") + p.device().str() +
                        " but the " + comm_.engine() +
                        " engine takes host memory only. CUDA parameters need a communicator "
                        "with the NCCL engine: fedwan::cuda::make_site_comm(options, device)");
    }
  }

  // Parameter i's place in its bucket, flat.
  torch::Tensor slice(size_t i) {
    const Param& p = params_[i];
    return buckets_[p.bucket].data.narrow(0, static_cast<int64_t>(p.offset),
                                          static_cast<int64_t>(p.numel));
  }

  // Runs `op` on `v` where the gradients live: on the host for a CPU model,
  // through a copy on the GPU for a CUDA one (the worker thread only).
  void on_control(std::vector<float>& v, const std::function<void(float*, size_t)>& op) {
    if (!control_.is_cuda()) {
      op(v.data(), v.size());
      return;
    }
    const torch::Tensor host =
        torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, torch::kFloat32);
    torch::Tensor device = host.to(control_);  // synchronous: done before op reads it
    op(device.data_ptr<float>(), v.size());    // blocks until complete
    host.copy_(device);
  }

  // A gradient computed by backward (hook), or found in .grad (no overlap).
  void on_grad(size_t i, const torch::Tensor& g) {
    std::lock_guard<std::mutex> lock(mu_);
    Param& p = params_[i];
    Bucket& b = buckets_[p.bucket];
    if (p.ready) {
      throw Error("DataParallel: a second backward() before synchronize(); call synchronize() "
                  "after each backward(), or construct with overlap = false");
    }
    // On the gradient's device; for CUDA, on the default stream, which the
    // NCCL engine waits for before it reads the bucket.
    slice(i).view(p.tensor.sizes()).copy_(g.detach());
    p.ready = true;
    used_[i] = 1.0f;
    arrival_.push_back(i);
    b.pending -= 1;
    if (!opt_.overlap) return;
    // Start full buckets in index order, the same order on every rank.
    bool launched = false;
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
      launch(next_launch_++);
      stats_.buckets_during_backward += 1;
      launched = true;
    }
    if (launched) cv_.notify_all();
  }

  // Under mu_.
  void launch(size_t k) {
    queue_.push_back(
        [this, k] { comm_.allreduce_sum(buckets_[k].data.data_ptr<float>(), buckets_[k].numel); });
  }

  void run(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_all();
  }

  // Waits until the worker ran everything queued; rethrows its failure.
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      queue_.clear();
      std::rethrow_exception(e);
    }
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_) return;
      std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      if (!error_) {
        lock.unlock();
        try {
          job();
        } catch (...) {
          lock.lock();
          error_ = std::current_exception();
          lock.unlock();
        }
        lock.lock();
      }
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  torch::nn::Module& module_;
  SiteComm& comm_;
  DataParallelOptions opt_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<float> used_;              // 1 where this rank produced a gradient this step
  torch::Device control_ = torch::kCPU;  // where used_ is reduced: the first CUDA device, or CPU
  std::vector<size_t> arrival_;          // parameters in the order their gradients came
  size_t next_launch_ = 0;
  DataParallelStats stats_;

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;  // collectives, run in order by the worker
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

DataParallel::DataParallel(torch::nn::Module& module, SiteComm& comm, DataParallelOptions o)
    : impl_(std::make_unique<Impl>(module, comm, o)) {}
DataParallel::~DataParallel() = default;
void DataParallel::broadcast_parameters() { impl_->broadcast_parameters(); }
void DataParallel::synchronize() { impl_->synchronize(); }
size_t DataParallel::num_buckets() const { return impl_->num_buckets(); }
const DataParallelStats& DataParallel::stats() const { return impl_->stats(); }

}  // namespace fedwan
