// Data parallelism inside a site: the gradients of a torch::nn::Module are
// averaged over the site's ranks after every backward pass, as PyTorch's
// DistributedDataParallel does (LibTorch's C++ API has none).
//
// The trainable parameters are grouped into buckets of about bucket_bytes, in
// reverse registration order (roughly the order backward produces them);
// with overlap, after the first step they are regrouped in the order rank
// 0's backward actually produced them, parameters it did not use last.
// With overlap, autograd hooks copy each gradient into its bucket as soon as
// it is computed and a full bucket's allreduce starts on a background thread
// while backward goes on; buckets always start in index order, the same on
// every rank. synchronize() finishes the rest and writes the mean back into
// each parameter's .grad. Frozen parameters (requires_grad false) are left
// out; a parameter no rank used in a step keeps its .grad untouched, one
// that some ranks used gets the mean with zeros from the others.
//
// The result equals one rank training on the ranks' batches combined when
// the loss is a mean over equally sized local batches (checked by the tests
// within float tolerance, with and without overlap).
//
// CUDA parameters: each bucket lives on its parameters' device (a bucket
// never mixes devices) and is averaged there, so the communicator must take
// device memory (SiteComm::accepts_device_memory: the NCCL engine, from
// fedwan::cuda::make_site_comm(options, device)); the few host-side flags of
// a step travel on that GPU too. Gradients are copied into the buckets on
// the device's default stream, where LibTorch runs forward and backward
// unless told otherwise; the NCCL engine waits for that stream.
//
// Contract: one backward() per synchronize() (with overlap, a second one
// before synchronize() throws); every rank calls the same sequence, with its
// model on the same kind of device. Errors: ConfigError for parameters this
// engine cannot serve (not fp32, not on the CPU or a CUDA device, or CUDA
// parameters with a communicator that takes host memory only); a rank that
// dies or stalls makes synchronize() throw TransportError (SiteComm's
// timeout), never hang.
// Thread safety: one DataParallel per rank, driven by the training thread.
#pragma once

#include "fedwan/export.hpp"

#include <cstddef>
#include <memory>

#include <torch/nn/module.h>

#include "fedwan/site_comm.hpp"

namespace fedwan {

struct FEDWAN_API DataParallelOptions {
  size_t bucket_bytes = 25u << 20;  // fp32 bytes per bucket (a parameter is never split)
  bool overlap = true;              // allreduce full buckets during backward
};

struct FEDWAN_API DataParallelStats {
  uint64_t steps = 0;
  uint64_t buckets_during_backward = 0;  // started from a hook, before synchronize()
  uint64_t buckets_at_synchronize = 0;
};

class FEDWAN_API DataParallel {
 public:
  // `module` and `comm` must outlive this object. Registers the hooks.
  DataParallel(torch::nn::Module& module, SiteComm& comm, DataParallelOptions options = {});
  ~DataParallel();  // removes the hooks
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Every rank takes rank 0's parameters and buffers (at start, and after
  // the site leader loaded a new anchor).
  void broadcast_parameters();
  // After backward(): each trainable parameter's .grad becomes the mean of
  // the ranks' gradients.
  void synchronize();

  size_t num_buckets() const;
  const DataParallelStats& stats() const;

 private:
  class FEDWAN_LOCAL Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedwan
