// make_site_comm: the communicator of a rank that may hold CUDA tensors. It
// owns a Gloo engine for host memory and, with a device, an NCCL engine for
// device memory, and sends each call to the engine that can read its data
// (is_device_pointer), as c10d picks a backend by the tensor's device.
// barrier() and broadcast_bytes() (host data) always go through Gloo.
#include <memory>
#include <string>
#include <utility>

#include "fedwan/cuda.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_comm.hpp"

namespace fedwan::cuda {
namespace {

class DeviceRoutedComm final : public SiteComm {
 public:
  // `device_engine` may be null: host memory only.
  DeviceRoutedComm(std::unique_ptr<SiteComm> host_engine, std::unique_ptr<SiteComm> device_engine)
      : host_(std::move(host_engine)), device_(std::move(device_engine)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* engine() const override { return device_ ? "nccl+gloo" : "gloo"; }
  bool accepts_device_memory() const override { return device_ != nullptr; }
  std::chrono::milliseconds timeout() const override { return host_->timeout(); }

  void allreduce_sum(float* data, size_t n) override { for_data(data, n).allreduce_sum(data, n); }
  void allreduce_mean(float* data, size_t n) override { for_data(data, n).allreduce_mean(data, n); }
  using SiteComm::broadcast;
  void broadcast(float* data, size_t n, int root, std::chrono::milliseconds timeout) override {
    for_data(data, n).broadcast(data, n, root, timeout);
  }
  void barrier() override { host_->barrier(); }

 private:
  SiteComm& for_data(const float* data, size_t n) {
    if (n == 0 || !is_device_pointer(data)) return *host_;
    if (device_) return *device_;
    throw ConfigError("site communicator, rank " + std::to_string(rank()) +
                      ": device memory given to a communicator made without a GPU (device -1); "
                      "make it with fedwan::cuda::make_site_comm(options, device) with the GPU "
                      "the data lives on");
  }

  // Declared first, destroyed last: the NCCL engine goes before the Gloo
  // one it was bootstrapped over.
  std::unique_ptr<SiteComm> host_;
  std::unique_ptr<SiteComm> device_;
};

}  // namespace

std::unique_ptr<SiteComm> make_site_comm(const SiteCommOptions& options, int device) {
  // Checked before joining anyone: a rank with no GPU fails now, not after
  // the others waited for it.
  if (device >= 0) {
    const int count = device_count();
    if (count == 0) {
      throw ConfigError("site communicator: GPU " + std::to_string(device) +
                        " asked for, but this machine has no CUDA device (device_count() is 0: "
                        "no GPU, or no driver); use device -1 to run the rank on the CPU");
    }
    if (device >= count) {
      throw ConfigError("site communicator: GPU " + std::to_string(device) +
                        " asked for, but this machine has " + std::to_string(count) +
                        " CUDA device(s) (device_count()), numbered 0.." +
                        std::to_string(count - 1));
    }
  }
  std::unique_ptr<SiteComm> gloo = make_gloo_comm(options);
  std::unique_ptr<SiteComm> nccl;
  if (device >= 0) nccl = make_nccl_comm(options, *gloo, device);
  return std::make_unique<DeviceRoutedComm>(std::move(gloo), std::move(nccl));
}

}  // namespace fedwan::cuda
