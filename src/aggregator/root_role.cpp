// The root's steps (aggregator/root_role.hpp): a complete chunk of the
// children's mean steps the outer optimizer and goes down as the next
// anchor's chunk; a complete round commits (checkpoint durable, and held by
// a live standby, before the round's last anchor chunk leaves). Its link to
// its standby is in root_standby_link.cpp; the steps every role shares are
// Aggregator::Impl's.
#include "aggregator/root_role.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_meta.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "checkpoint/replica_fetch.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/half.hpp"
#include "common/byte_pool.hpp"
#include "common/keep_alive.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "node/node_frames.hpp"
#include "transport/crypto_workers.hpp"

namespace fedwan {
namespace fs = std::filesystem;

Aggregator::Impl::RootRole::RootRole(Impl& node) : Role(node) {
  model_ = aggregator::RootModel(std::move(n_.opt_.initial_model));
  n_.init_model_state(model_.size());
  outer_ = make_outer_optimizer(n_.cfg_.outer, model_.size());
  if (n_.cfg_.privacy.mode == node::NodeConfig::Privacy::Mode::kCentral) {
    noise_ = std::make_unique<aggregator::CentralNoise>(n_.cfg_.privacy, model_.size());
  }
  const node::NodeConfig::Privacy& p = n_.cfg_.privacy;
  if (p.target_quantile > 0) {
    quantile_.emplace(p.clip, p.target_quantile, p.clip_learning_rate, p.count_noise_multiplier);
  }
}

// ---- the round protocol ----------------------------------------------------------

void Aggregator::Impl::RootRole::children_joined() {
  // Hashed here, on the loop (a billion parameters take seconds, beside
  // the beats), not before it serves: handshakes wait for no hash.
  const std::array<uint8_t, 32> digest = model_.held_digest();
  for (Child& c : n_.down_.children) {
    if (!c.joined) continue;  // a late_join site that has not come yet
    const bool same = c.hello.model_digest == digest;
    std::vector<uint8_t> payload(digest.begin(), digest.end());
    wire::FrameHeader h = node::node_header(n_.topo_, n_.self_.index, wire::MsgType::kWelcome, 0);
    h.total_elements = n_.model_.elements;
    h.flags = (same ? wire::kFlagNoChange : 0) | n_.welcome_flags();
    Frame frame = std::make_shared<const std::vector<uint8_t>>(node::make_frame(h, payload));
    n_.send_child(c, n_.with_round_clip(std::move(frame), h), h);
    c.welcomed = true;
    if (!same) n_.send_full_anchor(c);
    n_.became_member(c);
  }
  n_.open_round(0);
}

void Aggregator::Impl::RootRole::round_opened(uint64_t round) { outer_->begin_round(round); }

void Aggregator::Impl::RootRole::chunk_complete(uint32_t chunk) {
  aggregation::ChunkSum cs = n_.take_chunk(chunk);
  const uint64_t off = n_.model_.plan->offset(chunk);
  const uint32_t n = n_.model_.plan->size(chunk);
  // The anchor chunk is encoded into its frame, a buffer used before
  // (every byte of it is written below).
  const wire::FrameHeader h =
      node::chunk_header(n_.topo_, n_.self_.index, wire::MsgType::kAnchor, n_.round_ + 1,
                         *n_.model_.plan, chunk, n_.cfg_.codec->id());
  const size_t encoded = n_.cfg_.codec->encoded_size(n);
  auto bytes = BytePool::shared().take_shared(wire::kHeaderSize + encoded);
  wire::frame_to_fill(h, encoded, *bytes);
  uint8_t* payload = bytes->data() + wire::kHeaderSize;
  // Central privacy: the noise goes on the sum before anything else sees
  // it.
  if (!cs.mean.empty() && noise_) {
    noise_->apply(cs.mean.data(), n, cs.weight, aggregator::max_site_weight(n_.topo_),
                  n_.privacy_clip_);
  }
  // Send what the children need to move from the anchor to the new global
  // model; the anchor then advances by exactly what they decode, so
  // whatever the encoding lost stays in the residual and goes with the
  // next round's update. A chunk that goes down now moves the anchor in the
  // same pass, where it may (advances_now); the others at the commit.
  const bool held_back = n_.acc_->round_complete() || noise_;
  const bool advances = !held_back && advances_now();
  std::optional<std::array<uint8_t, 32>> whole_digest;
  if (advances && !mixed_) whole_digest = model_.known_held_digest();  // before it moves
  step_and_encode(off, n, cs.mean, payload,
                  advances ? aggregator::RootModel::Anchor::kAdvances
                           : aggregator::RootModel::Anchor::kStays);
  if (advances) {
    if (!mixed_) {
      mixed_ = true;
      round_digest_ = whole_digest;
      advanced_.assign(n_.model_.plan->count(), false);
    }
    advanced_[chunk] = true;
  }
  n_.acc_->recycle(std::move(cs.mean));  // the next chunk's sum is written into it
  const Frame frame = std::move(bytes);
  n_.book_.report(n_.round_).weight = cs.weight;
  if (held_back) {
    pending_.emplace_back(chunk, frame);  // added to the anchor when the round commits
    held_back_.emplace_back(frame, h);    // sent once the round's checkpoint is durable
    return;
  }
  // On disk for a large model: read back as each child's window takes it.
  const aggregator::StoredFrame stored = n_.anchors_.store.keep(frame);
  if (!advances) pending_.emplace_back(chunk, stored);
  n_.anchors_.next.emplace_back(stored, h);
  n_.send_children(stored, h);
}

void Aggregator::Impl::RootRole::step_and_encode(uint64_t off, uint32_t n, std::vector<float>& mean,
                                                 uint8_t* payload,
                                                 aggregator::RootModel::Anchor anchor) {
  global_.resize(n);  // every value written next
  float* const global = global_.data();
  // A chunk whose every copy was refused keeps its values (and its
  // optimizer state) this round.
  const bool stepping = !mean.empty();
  const Codec& codec = *n_.cfg_.codec;
  transport::CryptoWorkers* const workers = n_.down_.link.link().crypto_workers();
  constexpr size_t kBlock = Fp16Codec::kBlock;
  const size_t blocks = Fp16Codec::blocks(n);
  const size_t most = workers == nullptr ? 1 : workers->threads() + 1;
  const size_t per = std::max(kCommitPartBlocks, (blocks + most - 1) / most);
  const size_t parts = (blocks + per - 1) / per;
  if (parts <= 1) {
    model_.global_chunk(off, n, global);
    if (stepping) outer_->step(global, mean.data(), off, n);
    model_.encode_and_settle(off, n, global, codec, payload, mean, anchor);
    return;
  }
  // The chunk in parts of whole fp16 blocks, each on one of the link's
  // crypto threads or this one: the global values, the outer step and (fp16)
  // each block's largest difference from the anchor; then, every value
  // known finite, each part encoded and settled. Parts touch disjoint
  // ranges of the model, the optimizer's state and the payload.
  const bool fp16 = codec.id() == CodecId::kFp16;
  std::vector<uint32_t> top(parts, 0);
  const auto range = [&](size_t p) {
    const size_t first = p * per;
    return std::make_pair(first, std::min(blocks, first + per));
  };
  workers->run_parts(parts, [&](size_t p) {
    const auto [first, end] = range(p);
    const size_t begin = first * kBlock;
    const size_t len = std::min<size_t>(n, end * kBlock) - begin;
    model_.global_chunk(off + begin, static_cast<uint32_t>(len), global + begin);
    if (stepping) outer_->step(global + begin, mean.data() + begin, off + begin, len);
    if (fp16) top[p] = model_.fp16_measure(off, n, global, payload, first, end);
  });
  if (!fp16 || *std::max_element(top.begin(), top.end()) >= kernels::kF32ExpMask) {
    // Other codecs encode the chunk whole; a value that is not finite is
    // named there, and nothing of the residual or the anchor moves.
    model_.encode_and_settle(off, n, global, codec, payload, mean, anchor);
    return;
  }
  model_.settling_starts(anchor);
  workers->run_parts(parts, [&](size_t p) {
    const auto [first, end] = range(p);
    model_.fp16_settle(off, n, global, payload, first, end, anchor);
  });
}

void Aggregator::Impl::RootRole::round_closed(Clock::time_point now, double secs) {
  RoundReport& r = n_.book_.report(n_.round_);
  r.round = n_.round_;
  r.seconds = secs;
  n_.book_.complete(n_.round_);
  const uint64_t finished = n_.round_;
  // Commit: the round's checkpoint is durable before the last anchor chunk
  // leaves, so no child can be ahead of what a restarted root remembers.
  // With a live standby, the standby must hold that checkpoint too (its
  // acknowledgement releases the chunk, see on_standby_frame), so a
  // takeover never finds children ahead of it.
  n_.round_ += 1;
  apply_pending();       // the anchor becomes the next round's
  adapt_clip(finished);  // before the checkpoint, which keeps the next round's clip
  n_.save_checkpoint();
  n_.start_upload();
  committed_ = true;
  const bool wait_for_standby = !held_back_.empty() && standby_awaited() && n_.uploading();
  if (wait_for_standby) {
    held_since_ = Clock::now();
  } else {
    if (standby_.link) standby_missing("it is not connected");
    release_held_back();
  }
  if (n_.opt_.on_model) n_.opt_.on_model(finished, model_.global());
  audit_privacy(finished);
  if (n_.round_ == n_.cfg_.rounds) {
    if (!held_back_.empty()) {
      done_pending_ = true;  // after the last chunk
    } else {
      n_.send_done(n_.round_);
    }
    n_.phase_ = Phase::kDraining;
    n_.clock_.phase_deadline = Clock::now() + n_.cfg_.round_timeout;
    n_.clock_.finish_deadline = Clock::now() + n_.cfg_.finish_wait;
  } else {
    n_.open_round(n_.round_);
    n_.clock_.round_started = now;
    n_.welcome_pending();
  }
  report(finished);
}

// Adds what is left of the round's anchor update, as its children decode
// it, to the anchor: it is the next round's, whole.
void Aggregator::Impl::RootRole::apply_pending() {
  std::vector<uint8_t> scratch;  // one frame read back at a time
  for (const auto& [chunk, stored] : pending_) {
    const uint8_t* frame = stored.bytes(scratch);
    model_.apply(n_.model_.plan->offset(chunk), n_.model_.plan->size(chunk), *n_.cfg_.codec,
                 frame + wire::kHeaderSize);
    KeepAlive::pulse();
  }
  pending_.clear();
  mixed_ = false;
  round_digest_.reset();
  advanced_.clear();
}

// Every child is a site: each can be sent a mixed anchor in full. A region
// relays the round's frames as they come to children that hold its anchor,
// so under one the anchor moves only at the commit.
bool Aggregator::Impl::RootRole::advances_now() const {
  for (const Child& c : n_.down_.children) {
    if (!c.is_site && !c.removed) return false;
  }
  return true;
}

std::array<uint8_t, 32> Aggregator::Impl::RootRole::anchor_digest() const {
  // Mid-round, the round's own anchor is named only by a digest taken
  // before it began to move; without one, the mixed anchor's (which no
  // child's hello names: a site offers none while its anchor is mixed).
  if (mixed_ && round_digest_) return *round_digest_;
  return model_.held_digest();
}

// Adaptive clipping: the share of sites whose update was not clipped this
// round, noised, moves the clip the next round's copies get.
void Aggregator::Impl::RootRole::adapt_clip(uint64_t finished) {
  if (!quantile_) return;
  uint64_t members = 0;
  for (const NodeSpec& s : n_.topo_.nodes()) {
    if (s.role == fedwan::Role::kSite && !s.removed) members += 1;
  }
  const double used = quantile_->clip();
  const uint64_t unclipped = std::min(n_.acc_->privacy_unclipped_senders(), members);
  const privacy::QuantileClip::Step s = quantile_->step(unclipped, members, count_rng_);
  n_.privacy_clip_ = s.next_clip;
  for (uint32_t idx : n_.self_.children) n_.clip_children_copies(idx);
  n_.security_->audit("privacy_clip", {{"round", finished},
                                       {"clip", used},
                                       {"next_clip", s.next_clip},
                                       {"noised_unclipped_share", s.noised_share},
                                       {"target_quantile", n_.cfg_.privacy.target_quantile}});
}

// What the round spent, in the audit log; and the budget's end, said once.
void Aggregator::Impl::RootRole::audit_privacy(uint64_t finished) {
  if (!n_.cfg_.privacy.on()) return;
  nlohmann::json fields = aggregator::privacy_spent(n_.cfg_, n_.round_, n_.privacy_clip_);
  fields["round"] = finished;
  if (noise_) fields["noise_std"] = noise_->sum_std();
  n_.security_->audit("privacy", fields);
  if (n_.round_ == n_.cfg_.rounds && n_.cfg_.rounds < n_.cfg_.privacy.topology_rounds) {
    log().warn("[agg:{}] the privacy budget (epsilon {}) ends the federation after round {} of "
               "the {} asked: epsilon spent {:.4g}",
               n_.self_.id, n_.cfg_.privacy.epsilon_budget, finished,
               n_.cfg_.privacy.topology_rounds, fields["epsilon"].get<double>());
    n_.security_->audit("privacy_budget_reached", fields);
  }
}

void Aggregator::Impl::RootRole::release_held_back() {
  if (!committed_) return;
  committed_ = false;
  if (held_back_.empty()) return;
  for (auto& [held, h] : held_back_) {
    // Adaptive clipping: the round committed has moved the clip the anchor's
    // round gets; its regions learn it from the anchor.
    n_.send_children(n_.with_round_clip(held, h), h);
  }
  held_back_.clear();
  if (done_pending_) {
    done_pending_ = false;
    n_.send_done(n_.round_);
  }
  // Once the next round is open: inside round_closed (no standby to wait
  // for) the anchor chunks just added to the anchor are still kept to go down,
  // and a child welcomed then would be sent them twice.
  if (n_.acc_ && n_.acc_->is_open() && n_.acc_->round() == n_.round_) n_.welcome_pending();
}

void Aggregator::Impl::RootRole::report(uint64_t round) {
  if (!n_.book_.ready(round, n_.live_region_children())) return;
  const node::Traffic t = n_.take_traffic(round);
  n_.publish_report(n_.book_.take_report(round), t);
}

void Aggregator::Impl::RootRole::finished() {
  if (standby_.link && standby_.link->established()) {
    // The federation is over: the standby has nothing left to stand by for.
    (void)standby_.link->try_send(node::make_frame(
        node::node_header(n_.topo_, n_.self_.index, wire::MsgType::kDone, n_.round_), {}));
  }
}

void Aggregator::Impl::RootRole::summarize(AggregatorSummary& s) {
  // The run is over: the final model moves to the summary, and what only
  // the rounds needed goes before anything else is allocated.
  s.global_model = model_.take_global();
  outer_.reset();
  held_back_.clear();
  pending_.clear();
  advanced_.clear();
  mixed_ = false;
}

// ---- checkpoints -------------------------------------------------------------------

void Aggregator::Impl::RootRole::save(Checkpoint& c, nlohmann::json& meta) const {
  model_.save(c);
  for (const OuterOptimizer::StateBuffer& b : outer_->state()) {
    c.sections.push_back(checkpoint::float_section("outer." + b.name, b.data, b.size));
  }
  meta["outer"] = std::string(outer_->name());
  // Adaptive clipping: the clip the next round's copies get.
  if (quantile_) meta["privacy_clip"] = quantile_->clip();
}

// The checkpoint viewed the anchor (model_.save): its "held" digest is the
// anchor's while it stands, so welcomes need not hash it again.
void Aggregator::Impl::RootRole::saved(const Checkpoint& c,
                                       const std::vector<std::array<uint8_t, 32>>& digests) {
  const std::array<uint8_t, 32>* d = checkpoint::section_digest(c, digests, "held");
  const CheckpointSection* held = c.find("held");
  if (d != nullptr && held != nullptr &&
      held->data() == reinterpret_cast<const uint8_t*>(model_.held().data()) &&
      held->size() == model_.size() * sizeof(float)) {
    model_.adopt_held_digest(*d);
  }
}

void Aggregator::Impl::RootRole::no_checkpoint() {
  // Starting over from round 0 beside a checkpoint that could not be
  // read would silently redo and double count committed rounds.
  fs::path p = checkpoint::checkpoint_path(n_.opt_.checkpoint_dir, n_.self_.id);
  std::error_code ec;
  if (fs::exists(p.string() + ".corrupt", ec) && !n_.self_.standby_endpoint.empty() &&
      !n_.opt_.standby && !standby_.link) {
    corrupt_ = true;  // its standby keeps a copy: recover() asks for it
    return;
  }
  if (fs::exists(p.string() + ".corrupt", ec)) {
    throw CryptoError("root '" + n_.self_.id + "': its checkpoint " + p.string() +
                      " is corrupt and no intact one is left; restore one (see "
                      "docs/operations.md) or move the directory away to start over");
  }
}

void Aggregator::Impl::RootRole::restore(const Checkpoint& c, const std::string& /*path*/) {
  model_ = aggregator::RootModel::restore(c);
  pending_.clear();
  advanced_.clear();
  mixed_ = false;
  round_digest_.reset();
  n_.init_model_state(model_.size());
  outer_ = make_outer_optimizer(n_.cfg_.outer, model_.size());
  for (const OuterOptimizer::StateBuffer& b : outer_->state()) {
    checkpoint::copy_floats(c, "outer." + b.name, b.data, b.size);
  }
  (void)model_.held_digest();  // known before the round's anchor moves it
  if (!quantile_) return;
  // Adaptive clipping resumes where the clip was (a checkpoint without it:
  // from the topology's clip).
  const nlohmann::json j = checkpoint::checkpoint_meta(c);
  if (j.contains("privacy_clip") && j["privacy_clip"].is_number()) {
    quantile_->restore(j["privacy_clip"].get<double>());
  }
  n_.privacy_clip_ = quantile_->clip();
  for (uint32_t idx : n_.self_.children) n_.clip_children_copies(idx);
}

bool Aggregator::Impl::RootRole::recover(bool resumed) {
  if (!resumed && corrupt_) {
    // Only corrupt checkpoints: the standby's copy, or no start at all
    // (starting over beside them would redo committed rounds).
    open_standby_link();
    if (checkpoint::fetch_replica(
            *standby_.link,
            [this](const std::string&) -> transport::ParentLink& {
              open_standby_link();
              return *standby_.link;
            },
            n_.topo_, n_.self_, n_.cfg_, n_.opt_.checkpoint_dir, n_.model_.elements,
            n_.opt_.join_timeout, *n_.security_, &n_.stop_requested)) {
      resumed = n_.resume_from_checkpoint();
    }
    if (!resumed) {
      throw CryptoError("root '" + n_.self_.id +
                        "': its checkpoints are corrupt and its standby "
                        "keeps no copy; restore one (see docs/operations.md) or move the "
                        "directory away to start over");
    }
  }
  if (!n_.self_.standby_endpoint.empty() && !standby_.link) open_standby_link();
  if (!resumed) {
    // A fresh start: the residual and the optimizer's state are zeros whose
    // pages come while the children join (a second a GB on a small VM),
    // not on the loop in the first round. Not before a restore, which
    // replaces and writes them.
    model_.warm();
    outer_->warm_state();
  }
  return resumed;
}

}  // namespace fedwan
