#include "fedwan/site.hpp"

#include <unordered_set>

#include "fedwan/error.hpp"

namespace fedwan {

Site::Site(SiteOptions options, torch::nn::Module& module,
           const torch::optim::Optimizer* optimizer)
    : flat_(module) {
  if (optimizer != nullptr) {
    std::unordered_set<const void*> ours;
    for (const torch::Tensor& t : flat_.tensors()) ours.insert(t.unsafeGetTensorImpl());
    for (const auto& group : optimizer->param_groups()) {
      for (const torch::Tensor& p : group.params()) {
        if (!ours.count(p.unsafeGetTensorImpl())) {
          throw ConfigError("the optimizer holds a tensor that is not a parameter of the "
                            "module; build it from module->parameters()");
        }
      }
    }
  }
  core_ = std::make_unique<SiteCore>(std::move(options), flat_.data(), flat_.numel());
}

SyncResult Site::join() { return core_->join(); }

std::optional<SyncResult> Site::step() {
  // Keep the link alive between syncs (heartbeats, reconnects); a resync to
  // the parent's anchor restarts the round's count.
  const SyncResult s = core_->service();
  if (s.resynced) {
    steps_in_round_ = 0;
    return s;
  }
  if (++steps_in_round_ < core_->inner_steps()) return std::nullopt;
  return sync();
}

SyncResult Site::sync() {
  steps_in_round_ = 0;
  return core_->sync();
}

}  // namespace fedwan
