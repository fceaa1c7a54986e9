#include "cli/placement.hpp"

#include <torch/cuda.h>

#include "fedwan/error.hpp"

#ifdef FEDWAN_CLI_WITH_CUDA
#include "fedwan/cuda.hpp"
#endif

namespace fedwan::cli {
namespace {

// CUDA devices this build can train on: 0 without the CUDA side, without a
// GPU, or with a LibTorch built for the CPU only.
int usable_gpus(std::string* why) {
#ifdef FEDWAN_CLI_WITH_CUDA
  const int count = fedwan::cuda::device_count();
  if (count == 0) {
    *why = "this machine has no CUDA device (device_count() is 0: no GPU, or no driver)";
    return 0;
  }
  if (!torch::cuda::is_available()) {
    *why = "LibTorch here has no CUDA support (torch::cuda::is_available() is false); install "
           "a CUDA build of LibTorch";
    return 0;
  }
  return count;
#else
  *why = "this fedwan was built without its CUDA side (no CUDA toolkit at build time); rebuild "
         "with one (FEDWAN_WITH_CUDA=ON)";
  return 0;
#endif
}

}  // namespace

torch::Device Placement::device() const {
  return cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpu))
                : torch::Device(torch::kCPU);
}

std::string Placement::describe() const { return cuda() ? "cuda:" + std::to_string(gpu) : "cpu"; }

Placement place_rank(const std::string& flag, int rank, int ranks) {
  if (flag != "auto" && flag != "cpu" && flag != "cuda") {
    throw ConfigError("--device " + flag + ": choose auto, cpu or cuda");
  }
  if (flag == "cpu") return {};
  std::string why;
  const int gpus = usable_gpus(&why);
  if (gpus > 0 && ranks > gpus) {
    why = "a site of " + std::to_string(ranks) +
          " ranks needs a GPU per rank and this machine "
          "has " +
          std::to_string(gpus);
  }
  if (!why.empty()) {
    if (flag == "cuda") throw ConfigError("--device cuda: " + why + "; or use --device cpu");
    return {};
  }
  Placement p;
  p.gpu = rank % gpus;
  return p;
}

std::unique_ptr<SiteComm> make_rank_comm(const SiteCommOptions& options, const Placement& place) {
#ifdef FEDWAN_CLI_WITH_CUDA
  if (place.cuda()) return fedwan::cuda::make_site_comm(options, place.gpu);
#else
  (void)place;  // place_rank never picks a GPU without the CUDA side
#endif
  return make_gloo_comm(options);
}

}  // namespace fedwan::cli
