#include "fedwan/site.hpp"

#include <cstring>
#include <sstream>
#include <string>
#include <unordered_set>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "fedwan/error.hpp"

namespace fedwan {
namespace {

StateBlob archive_blob(std::string name, torch::serialize::OutputArchive& archive) {
  std::ostringstream os;
  archive.save_to(os);
  const std::string bytes = os.str();
  return {std::move(name), std::vector<uint8_t>(bytes.begin(), bytes.end())};
}

torch::serialize::InputArchive archive_of(const StateBlob& blob) {
  std::istringstream is(std::string(blob.bytes.begin(), blob.bytes.end()));
  torch::serialize::InputArchive archive;
  archive.load_from(is);
  return archive;
}

}  // namespace

Site::Site(SiteOptions options, torch::nn::Module& module, torch::optim::Optimizer* optimizer)
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
  // Checkpoints carry what the flat parameters do not: the inner
  // optimizer's state, the module's buffers and the step within the round.
  options.save_state = [this, &module, optimizer] {
    std::vector<StateBlob> out;
    if (optimizer != nullptr) {
      torch::serialize::OutputArchive a;
      optimizer->save(a);
      out.push_back(archive_blob("torch.optimizer", a));
    }
    torch::serialize::OutputArchive b;
    for (const auto& buf : module.named_buffers()) b.write(buf.key(), buf.value());
    out.push_back(archive_blob("torch.buffers", b));
    StateBlob steps{"site.steps", std::vector<uint8_t>(sizeof(uint64_t))};
    std::memcpy(steps.bytes.data(), &steps_in_round_, sizeof(uint64_t));
    out.push_back(std::move(steps));
    return out;
  };
  options.load_state = [this, &module, optimizer](const std::vector<StateBlob>& blobs) {
    for (const StateBlob& blob : blobs) {
      if (blob.name == "torch.optimizer" && optimizer != nullptr) {
        torch::serialize::InputArchive a = archive_of(blob);
        optimizer->load(a);
      } else if (blob.name == "torch.buffers") {
        torch::serialize::InputArchive a = archive_of(blob);
        torch::NoGradGuard no_grad;
        for (auto& buf : module.named_buffers()) {
          torch::Tensor t;
          if (a.try_read(buf.key(), t)) buf.value().copy_(t);
        }
      } else if (blob.name == "site.steps" && blob.bytes.size() == sizeof(uint64_t)) {
        std::memcpy(&steps_in_round_, blob.bytes.data(), sizeof(uint64_t));
      }
    }
  };
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
