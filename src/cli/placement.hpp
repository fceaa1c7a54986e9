// Where a rank of a site trains (`--device auto|cpu|cuda`) and the site
// communicator that goes with it. The CUDA side is there when the CLI was
// built with fedwan_cuda (FEDWAN_CLI_WITH_CUDA); without it, or without a
// GPU, auto means the CPU and cuda is a ConfigError saying what is missing.
#pragma once

#include <memory>
#include <string>

#include <torch/types.h>

#include "fedwan/site_comm.hpp"

namespace fedwan::cli {

struct Placement {
  int gpu = -1;  // -1: the CPU; else the CUDA device (rank % device count)
  bool cuda() const { return gpu >= 0; }
  torch::Device device() const;
  std::string describe() const;  // "cpu", "cuda:1"
};

// Resolves `flag` (auto, cpu or cuda) for rank `rank` of a site of `ranks`
// ranks on this machine. A site of several ranks on GPUs needs one GPU per
// rank (NCCL does not put two ranks of a communicator on one GPU): auto then
// falls back to the CPU, cuda is a ConfigError.
Placement place_rank(const std::string& flag, int rank, int ranks);

// The ranks' communicator: NCCL for device memory plus Gloo for host memory
// on a GPU (fedwan::cuda::make_site_comm), Gloo alone on the CPU.
std::unique_ptr<SiteComm> make_rank_comm(const SiteCommOptions& options, const Placement& place);

}  // namespace fedwan::cli
