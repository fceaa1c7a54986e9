#include "fedwan/site.hpp"

#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <unordered_set>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "fedwan/error.hpp"
#include "tensor/chunk_plan.hpp"

#if defined(FEDWAN_TORCH_WITH_CUDA)
#include "fedwan/cuda.hpp"
#endif

namespace fedwan {
namespace {

StateBlob archive_blob(std::string name, torch::serialize::OutputArchive& archive) {
  std::ostringstream os;
  archive.save_to(os);
  const std::string bytes = os.str();
  return {std::move(name), std::vector<uint8_t>(bytes.begin(), bytes.end())};
}

// Tensors land on `device` (the model's), whatever device the rank that
// saved them trained on.
torch::serialize::InputArchive archive_of(const StateBlob& blob, torch::Device device) {
  std::istringstream is(std::string(blob.bytes.begin(), blob.bytes.end()));
  torch::serialize::InputArchive archive;
  archive.load_from(is, device);
  return archive;
}

// Throws ConfigError unless every tensor `optimizer` updates is one of the
// flat parameters (an optimizer of another module would train a model the
// federation never sees).
void check_optimizer_params(const FlatParameters& flat, const torch::optim::Optimizer& optimizer) {
  std::unordered_set<const void*> ours;
  for (const torch::Tensor& t : flat.tensors()) ours.insert(t.unsafeGetTensorImpl());
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (!ours.count(p.unsafeGetTensorImpl())) {
        throw ConfigError("the optimizer holds a tensor that is not a parameter of the "
                          "module; build it from module->parameters()");
      }
    }
  }
}

// Checkpoints carry what the flat parameters do not: the inner optimizer's
// state (when there is one), the module's buffers and the step within the
// round.
std::vector<StateBlob> save_torch_state(torch::nn::Module& module,
                                        torch::optim::Optimizer* optimizer,
                                        uint64_t steps_in_round) {
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
  std::memcpy(steps.bytes.data(), &steps_in_round, sizeof(uint64_t));
  out.push_back(std::move(steps));
  return out;
}

// What save_torch_state saved, back into `module`, `optimizer` and
// `steps_in_round`, tensors onto `device`; blobs it does not know (or an
// optimizer's state without an optimizer) are skipped.
void load_torch_state(const std::vector<StateBlob>& blobs, torch::nn::Module& module,
                      torch::optim::Optimizer* optimizer, torch::Device device,
                      uint64_t& steps_in_round) {
  for (const StateBlob& blob : blobs) {
    if (blob.name == "torch.optimizer" && optimizer != nullptr) {
      torch::serialize::InputArchive a = archive_of(blob, device);
      optimizer->load(a);
    } else if (blob.name == "torch.buffers") {
      torch::serialize::InputArchive a = archive_of(blob, device);
      torch::NoGradGuard no_grad;
      for (auto& buf : module.named_buffers()) {
        torch::Tensor t;
        if (a.try_read(buf.key(), t)) buf.value().copy_(t);
      }
    } else if (blob.name == "site.steps" && blob.bytes.size() == sizeof(uint64_t)) {
      std::memcpy(&steps_in_round, blob.bytes.data(), sizeof(uint64_t));
    }
  }
}

// The options' round timeout, or the topology's when they give none.
std::chrono::milliseconds round_timeout_of(const SiteOptions& options) {
  return options.round_timeout.count() > 0
             ? options.round_timeout
             : std::chrono::milliseconds(
                   static_cast<int64_t>(options.topology.federation().round_timeout_s * 1000));
}

}  // namespace

Site::Site(SiteOptions options, torch::nn::Module& module, torch::optim::Optimizer* optimizer,
           SiteComm* ranks)
    : flat_(module), ranks_(ranks != nullptr && ranks->size() > 1 ? ranks : nullptr) {
  if (optimizer != nullptr) check_optimizer_params(flat_, *optimizer);
  save_state_ = [this, &module, optimizer] {
    return save_torch_state(module, optimizer, steps_in_round_);
  };
  load_state_ = [this, &module, optimizer](const std::vector<StateBlob>& blobs) {
    load_torch_state(blobs, module, optimizer, flat_.device(), steps_in_round_);
  };
  options.save_state = save_state_;
  options.load_state = load_state_;
  join_timeout_ = options.join_timeout;
  round_timeout_ = round_timeout_of(options);
  inner_steps_ = options.topology.federation().inner_steps;
  overlap_steps_ = options.topology.federation().overlap_steps;
  rounds_ = options.topology.rounds_to_run();
  if (flat_.device().is_cuda()) {
    // Pinned: the copies each round go at full bus speed.
    host_ = torch::empty({static_cast<int64_t>(flat_.numel())},
                         torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
    to_host();
  }
  // Cost records count every rank's device, of the model's kind.
  options.devices = ranks_ == nullptr ? 1 : static_cast<uint32_t>(ranks_->size());
  options.device_kind = flat_.device().is_cuda() ? "gpu" : "cpu";
  // Only the leader talks to the federation.
  if (ranks_ == nullptr || ranks_->rank() == 0) {
#if defined(FEDWAN_TORCH_WITH_CUDA)
    // Overlapped syncs encode a host copy on a worker thread instead, and
    // local differential privacy noises the update on the host.
    if (host_.defined() && !options.update_encoder && overlap_steps_ == 0 &&
        options.topology.federation().privacy.mode != "local") {
      // The update is computed and encoded on the GPU; only its encoded
      // bytes come to the host (the host copy then serves the federation's
      // anchors, checkpoints and joins).
      const tensor::ChunkPlan plan =
          tensor::ChunkPlan::from_bytes(flat_.numel(), options.topology.federation().chunk_bytes);
      device_encoder_ = std::make_shared<cuda::DeviceUpdateEncoder>(
          flat_.device().index(), flat_.data(), flat_.numel(), plan.chunk_elements(),
          round_timeout_);
      options.update_encoder = device_encoder_;
    }
#endif
    float* params = host_.defined() ? host_.data_ptr<float>() : flat_.data();
    core_ = std::make_unique<SiteCore>(std::move(options), params, flat_.numel());
  }
}

Site::~Site() = default;

// A single-rank site follows its link directly; ranks follow what the leader
// shared, so that they all leave the loop at the same step.
bool Site::finished() const { return ranks_ == nullptr ? core_->finished() : finished_; }
uint64_t Site::round() const { return ranks_ == nullptr ? core_->round() : round_; }

SiteCore& Site::core() {
  if (!core_) {
    throw Error("rank " + std::to_string(ranks_->rank()) +
                " of the site has no link to the federation; only rank 0 has");
  }
  return *core_;
}

void Site::to_host() {
  if (!host_.defined()) return;
  torch::NoGradGuard no_grad;
  host_.copy_(flat_.flat());  // waits for the training queued on the device
}

void Site::to_device() {
  if (!host_.defined()) return;
  torch::NoGradGuard no_grad;
  flat_.flat().copy_(host_);
}

void Site::share_parameters(std::chrono::milliseconds timeout) {
  if (!host_.defined() || ranks_->accepts_device_memory()) {
    // Where the model lives (the leader's device copy is current).
    ranks_->broadcast(flat_.data(), flat_.numel(), 0, timeout);
    return;
  }
  ranks_->broadcast(host_.data_ptr<float>(), flat_.numel(), 0, timeout);
  if (!leader()) to_device();
}

SyncResult Site::share(SyncResult r, std::chrono::milliseconds timeout) {
  if (ranks_ != nullptr) {
    // The leader's model and where the site stands, to every rank.
    float head[4] = {static_cast<float>(r.round & 0xffffff), static_cast<float>(r.round >> 24),
                     r.finished ? 1.0f : 0.0f, r.resynced ? 1.0f : 0.0f};
    ranks_->broadcast(head, 4, 0, timeout);
    share_parameters(timeout);
    if (!leader()) {
      r = SyncResult{};
      r.round = static_cast<uint64_t>(head[0]) | (static_cast<uint64_t>(head[1]) << 24);
      r.finished = head[2] != 0.0f;
      r.resynced = head[3] != 0.0f;
    }
  }
  round_ = r.round;
  finished_ = r.finished;
  return r;
}

void Site::share_state() {
  // A leader that resumed a checkpoint holds the optimizer state and buffers
  // the other ranks must have too, or their models would drift apart.
  std::vector<uint8_t> flag = {static_cast<uint8_t>(leader() && core_->resumed() ? 1 : 0)};
  ranks_->broadcast_bytes(flag, 0, ranks_->timeout());
  if (flag.empty() || flag[0] == 0) return;
  std::vector<StateBlob> blobs;
  if (leader()) blobs = save_state_();
  std::vector<uint8_t> count = {static_cast<uint8_t>(blobs.size())};
  ranks_->broadcast_bytes(count, 0, ranks_->timeout());
  blobs.resize(count.empty() ? 0 : count[0]);
  for (StateBlob& b : blobs) {
    std::vector<uint8_t> name(b.name.begin(), b.name.end());
    ranks_->broadcast_bytes(name, 0, ranks_->timeout());
    b.name.assign(name.begin(), name.end());
    ranks_->broadcast_bytes(b.bytes, 0, ranks_->timeout());
  }
  if (!leader()) load_state_(blobs);
}

void Site::anchor_to_device() {
#if defined(FEDWAN_TORCH_WITH_CUDA)
  if (device_encoder_) {
    static_cast<cuda::DeviceUpdateEncoder&>(*device_encoder_).set_anchor(core_->anchor());
  }
#endif
}

SyncResult Site::join() {
  SyncResult r;
  if (leader()) {
    to_host();
    r = core_->join();
    to_device();
    anchor_to_device();
  }
  r = share(r, join_timeout_ + round_timeout_);
  if (ranks_ != nullptr) share_state();
  return r;
}

std::optional<SyncResult> Site::step() {
  // Keep the link alive between syncs (heartbeats, reconnects); a resync to
  // the parent's anchor restarts the round's count.
  SyncResult s = leader() ? core_->service() : SyncResult{};
  if (s.resynced && leader()) {
    to_device();
    anchor_to_device();
  }
  if (ranks_ != nullptr) {
    // Every rank learns of a resync at the same step.
    float resynced = s.resynced ? 1.0f : 0.0f;
    ranks_->broadcast(&resynced, 1, 0);
    if (resynced != 0.0f) {
      // The leader's model was replaced: every rank takes it.
      SyncResult r = s;
      if (leader()) {
        r.round = core_->round();
        r.finished = core_->finished();
      }
      s = share(r, ranks_->timeout());
      s.resynced = true;
    }
  }
  if (s.resynced) {
    if (ranks_ == nullptr) {
      round_ = core_->round();
      finished_ = core_->finished();
    }
    steps_in_round_ = 0;
    return s;
  }
  ++steps_in_round_;
  if (pending_) {
    // Overlapped: the anchor is merged tau steps after the update went.
    if (steps_in_round_ < overlap_steps_) return std::nullopt;
    return finish_pending();
  }
  if (steps_in_round_ < inner_steps_) return std::nullopt;
  if (overlap_steps_ == 0) return sync();
  steps_in_round_ = 0;
  if (leader()) {
    to_host();
    core_->begin_sync();
  }
  pending_ = true;
  // After the last round's update, the final model replaces any steps.
  if (round() + 1 >= rounds_) return finish_pending();
  return std::nullopt;
}

SyncResult Site::finish_pending() {
  pending_ = false;
  SyncResult r;
  if (leader()) {
    to_host();  // the steps since begin_sync, to merge the anchor into
    r = core_->finish_sync();
    if (r.resynced || r.finished) steps_in_round_ = 0;
    to_device();
  }
  r = share(r, round_timeout_ + round_timeout_);
  if (r.resynced || r.finished) steps_in_round_ = 0;
  return r;
}

SyncResult Site::sync() {
  // An overlapped sync in flight ends first; then this one blocks.
  if (pending_) {
    const SyncResult merged = finish_pending();
    if (merged.finished) return merged;
  }
  steps_in_round_ = 0;
  SyncResult r;
  if (leader()) {
    const uint64_t before = core_->round();
    // Encoded on the GPU, the update needs no fp32 copy on the host first.
    if (!device_encoder_) to_host();
    r = core_->sync();
    if (r.round != before || r.resynced) {
      to_device();  // the host copy holds the next anchor
      anchor_to_device();
    } else {
      to_host();  // it ended without one: the device holds the model
    }
  }
  return share(r, round_timeout_ + round_timeout_);
}

void Site::checkpoint() {
  if (!leader()) return;
  to_host();
  core_->checkpoint();
}

void Site::stop(std::chrono::milliseconds grace) {
  if (core_) core_->stop(grace);
}

bool Site::leave(std::chrono::milliseconds timeout) { return core_ ? core_->leave(timeout) : true; }

}  // namespace fedwan
