// fedwan::Site: the federation from a LibTorch training loop.
//
//   fedwan::SiteOptions opts;
//   opts.topology = fedwan::Topology::load("federation.yaml");
//   opts.node_id = "site-eu-1";
//   opts.security.credentials_dir = "pki/site-eu-1";  // from `fedwan certs init`
//   fedwan::Site site(opts, *model);           // flattens the parameters
//   torch::optim::Adam opt(model->parameters());
//   site.join();                               // loads the federation's model
//   while (!site.finished()) {
//     ...forward, backward, opt.step()...
//     site.step();                             // every H calls: syncs (blocks)
//   }
//
// A site of several ranks (processes, each with a copy of the model, its
// gradients averaged every step by fedwan::DataParallel over the same
// SiteComm): give every rank's Site the communicator. Rank 0, the leader,
// talks to the federation; at join and after every sync it broadcasts the
// model (and, after resuming a checkpoint, the optimizer state and buffers)
// to the other ranks, which never open a connection. Every rank calls
// join/step/sync in the same sequence.
//
// A model on a CUDA device: the federation still works on a host copy of the
// flat parameters, which the leader refreshes from the device before it
// joins, syncs or checkpoints and writes back to the device after (one
// device-to-host and one host-to-device copy per round). The ranks share
// the leader's model on the device when their communicator takes device
// memory (fedwan::cuda::make_site_comm), else through the host.
//
// Thread safety: one training thread drives a Site.
#pragma once

#include "fedwan/export.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fedwan/flat_parameters.hpp"
#include "fedwan/site_comm.hpp"
#include "fedwan/site_core.hpp"

namespace fedwan {

class FEDWAN_API Site {
 public:
  // Flattens `module`'s parameters (see FlatParameters). If an optimizer is
  // given, checks that it optimises exactly those parameters. With
  // options.checkpoint_dir, checkpoints also hold the optimizer's state, the
  // module's buffers and the step within the round, and join() restores
  // them (module and optimizer must outlive the Site).
  Site(SiteOptions options, torch::nn::Module& module, torch::optim::Optimizer* optimizer = nullptr,
       SiteComm* ranks = nullptr);
  ~Site();

  SyncResult join();
  // Counts one inner step; on every H-th it syncs with the federation
  // (blocking up to the round timeout) and returns the result. With
  // federation.overlap_steps = tau, the H-th step starts the sync in the
  // background (SiteCore::begin_sync) and training goes on; tau steps later
  // step() merges the next anchor, keeping the progress made meanwhile
  // (SiteCore::finish_sync, waiting for the anchor if it is not in yet),
  // and returns the result; the rounds' H steps count from the update.
  std::optional<SyncResult> step();
  // Ends the round now, whatever the step count (an overlapped sync in
  // flight is merged first).
  SyncResult sync();
  // Leader: writes a checkpoint now (SIGTERM handling; a no-op without a
  // checkpoint directory). Other ranks: nothing to do.
  void checkpoint();
  // Leader: SiteCore::stop(grace) (a join in progress throws StoppedError,
  // a sync after `grace` unless it finished). Other ranks wait on the leader
  // and fail when its process ends. Callable from any thread and from a
  // signal handler.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
  // Leader: SiteCore::leave(timeout), between steps (after a sync); every
  // rank then stops training. Other ranks: nothing to tell (true).
  bool leave(std::chrono::milliseconds timeout = std::chrono::seconds(5));

  bool finished() const;
  uint64_t round() const;
  uint64_t inner_steps() const { return inner_steps_; }
  bool leader() const { return core_ != nullptr; }
  FlatParameters& parameters() { return flat_; }
  // The leader's link to the federation; throws Error on another rank. For
  // a CUDA model it works on the host copy: use Site's join/step/sync/
  // checkpoint, which keep that copy current, rather than the core's.
  SiteCore& core();

 private:
  // Leader: the model, the round, finished/resynced; others: receive them.
  SyncResult share(SyncResult r, std::chrono::milliseconds timeout);
  SyncResult finish_pending();  // every rank: the overlapped sync's merge
  void share_state();           // leader's optimizer state and buffers, after a resume
  void share_parameters(std::chrono::milliseconds timeout);
  // CUDA model only (no-ops on the CPU): the host copy from, and to, the device.
  void to_host();
  void to_device();
  void anchor_to_device();  // the device encoder's anchor, from the leader's core

  FlatParameters flat_;
  torch::Tensor host_;              // CUDA model: what the federation reads and writes
  std::unique_ptr<SiteCore> core_;  // the leader's only
  // CUDA model, CUDA build: encodes the leader's update on the GPU.
  std::shared_ptr<UpdateEncoder> device_encoder_;
  SiteComm* ranks_ = nullptr;  // null or size 1: a single-rank site
  std::function<std::vector<StateBlob>()> save_state_;
  std::function<void(const std::vector<StateBlob>&)> load_state_;
  std::chrono::milliseconds join_timeout_, round_timeout_;
  uint64_t steps_in_round_ = 0;
  uint64_t round_ = 0;
  uint64_t inner_steps_ = 0;
  uint64_t overlap_steps_ = 0;  // tau; 0: blocking syncs
  uint64_t rounds_ = 0;
  bool pending_ = false;  // an overlapped sync is in flight (every rank knows)
  bool finished_ = false;
};

}  // namespace fedwan
