// The Gloo engine of SiteComm over the Gloo inside LibTorch, through c10d's
// ProcessGroupGloo. Built only against a LibTorch that carries its own Gloo
// (the pip torch wheel), where fedwan_core has none (comm/gloo_engine.hpp):
// one Gloo in the process. Same contract as comm/gloo_comm.cpp: ranks meet
// in the rendezvous directory (a c10d FileStore there), every failure is a
// TransportError naming the operation, and a failed communicator stays
// failed.
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/gloo_engine.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_comm.hpp"

namespace fedwan {
namespace {

class C10dGlooComm final : public SiteComm {
 public:
  explicit C10dGlooComm(const SiteCommOptions& o) : opt_(o) {
    comm::prepare_site_comm(o);
    guard("joining the site", [&] {
      const std::string path =
          (std::filesystem::path(o.rendezvous_dir) / (o.name + ".c10d-store")).string();
      auto store = c10::make_intrusive<::c10d::FileStore>(path, o.size);
      store->setTimeout(o.timeout);
      auto prefixed = c10::make_intrusive<::c10d::PrefixStore>(o.name, store);
      auto options = ::c10d::ProcessGroupGloo::Options::create(o.timeout);
      options->devices.push_back(::c10d::ProcessGroupGloo::createDeviceForHostname(o.hostname));
      options->threads = 1;
      group_ = c10::make_intrusive<::c10d::ProcessGroupGloo>(prefixed, o.rank, o.size, options);
      // Every rank has joined once a first collective completes.
      group_->barrier()->wait(o.timeout);
    });
  }

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.size; }
  const char* engine() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const override { return opt_.timeout; }

  void allreduce_sum(float* data, size_t n) override {
    if (opt_.size == 1 || n == 0) return;
    guard("allreduce", [&] {
      std::vector<at::Tensor> t = {view(data, n)};
      ::c10d::AllreduceOptions a;
      a.reduceOp = ::c10d::ReduceOp::SUM;
      a.timeout = opt_.timeout;
      group_->allreduce(t, a)->wait(opt_.timeout);
    });
  }

  using SiteComm::broadcast;
  void broadcast(float* data, size_t n, int root, std::chrono::milliseconds timeout) override {
    comm::check_root(opt_, root);
    if (opt_.size == 1 || n == 0) return;
    guard("broadcast", [&] {
      std::vector<at::Tensor> t = {view(data, n)};
      ::c10d::BroadcastOptions b;
      b.rootRank = root;
      b.rootTensor = 0;
      b.timeout = timeout;
      group_->broadcast(t, b)->wait(timeout);
    });
  }

  void barrier() override {
    if (opt_.size == 1) return;
    guard("barrier", [&] { group_->barrier()->wait(opt_.timeout); });
  }

 private:
  // The caller's host memory as a tensor (no copy).
  static at::Tensor view(float* data, size_t n) {
    return torch::from_blob(data, {static_cast<int64_t>(n)}, torch::kFloat32);
  }

  template <class F>
  void guard(const char* what, F&& f) {
    comm::guarded(opt_, broken_, what, std::forward<F>(f));
  }

  SiteCommOptions opt_;
  c10::intrusive_ptr<::c10d::ProcessGroupGloo> group_;
  bool broken_ = false;
};

std::unique_ptr<SiteComm> make_c10d_gloo_comm(const SiteCommOptions& options) {
  return std::make_unique<C10dGlooComm>(options);
}

// Installed when libfedwan is loaded: make_gloo_comm() then runs on it.
const bool kInstalled = [] {
  comm::install_gloo_engine(&make_c10d_gloo_comm);
  return true;
}();

}  // namespace
}  // namespace fedwan
