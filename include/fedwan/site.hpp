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
// Thread safety: one training thread drives a Site.
#pragma once

#include <memory>
#include <optional>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fedwan/flat_parameters.hpp"
#include "fedwan/site_core.hpp"

namespace fedwan {

class Site {
 public:
  // Flattens `module`'s parameters (see FlatParameters). If an optimizer is
  // given, checks that it optimises exactly those parameters. With
  // options.checkpoint_dir, checkpoints also hold the optimizer's state, the
  // module's buffers and the step within the round, and join() restores
  // them (module and optimizer must outlive the Site).
  Site(SiteOptions options, torch::nn::Module& module,
       torch::optim::Optimizer* optimizer = nullptr);

  SyncResult join();
  // Counts one inner step; on every H-th it syncs with the federation
  // (blocking up to the round timeout) and returns the result.
  std::optional<SyncResult> step();
  SyncResult sync();  // ends the round now, whatever the step count

  bool finished() const { return core_->finished(); }
  uint64_t round() const { return core_->round(); }
  uint64_t inner_steps() const { return core_->inner_steps(); }
  FlatParameters& parameters() { return flat_; }
  SiteCore& core() { return *core_; }

 private:
  FlatParameters flat_;
  std::unique_ptr<SiteCore> core_;
  uint64_t steps_in_round_ = 0;
};

}  // namespace fedwan
