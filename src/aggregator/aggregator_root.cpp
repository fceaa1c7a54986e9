// Aggregator, the root's own steps: a complete chunk of the children's
// mean steps the outer optimizer and goes down as the next anchor's chunk; a
// complete round commits (checkpoint durable, and held by a live standby,
// before the round's last anchor chunk leaves). The region's counterparts
// are in aggregator_region.cpp; the steps both roles share in
// aggregator_rounds.cpp.
#include <memory>
#include <vector>

#include "aggregator/aggregator_impl.hpp"
#include "fedwan/codec.hpp"
#include "node/node_frames.hpp"

namespace fedwan {

void Aggregator::Impl::root_step_chunk(uint32_t chunk, ChunkSum& cs) {
  const uint64_t off = plan_->offset(chunk);
  const uint32_t n = plan_->size(chunk);
  std::vector<uint8_t> payload(cfg_.codec->encoded_size(n));
  root_.outer->step(root_.global.data() + off, cs.mean.data(), off, n);
  // Send what the children need to move from `held` to the new global
  // model; `held` then advances by exactly what they decode, so whatever
  // the encoding lost is carried into the next round's update.
  for (uint32_t k = 0; k < n; ++k) cs.mean[k] = root_.global[off + k] - root_.held[off + k];
  cfg_.codec->encode(cs.mean.data(), n, nullptr, payload.data());
  keep_round_anchor(chunk);
  cfg_.codec->decode_accumulate(payload.data(), n, 1.0f, root_.held.data() + off);
  const wire::FrameHeader h = chunk_header(topo_, self_.index, wire::MsgType::kAnchor, round_ + 1,
                                           *plan_, chunk, cfg_.codec->id());
  const Frame frame = std::make_shared<const std::vector<uint8_t>>(make_frame(h, payload));
  book_.report(round_).weight = cs.weight;
  if (acc_->round_complete()) {
    root_.held_back.emplace(frame, h);  // sent once the round's checkpoint is durable
    return;
  }
  next_anchor_.emplace_back(frame, h);
  for (const Child& c : down_.children) {
    if (c.live && !c.rejoin_pending) send_child(c, frame, h);
  }
}

void Aggregator::Impl::root_commit_round(Clock::time_point now, double secs) {
  RoundReport& report = book_.report(round_);
  report.round = round_;
  report.seconds = secs;
  book_.complete(round_);
  const uint64_t finished = round_;
  // Commit: the round's checkpoint is durable before the last anchor chunk
  // leaves, so no child can be ahead of what a restarted root remembers.
  // With a live standby, the standby must hold that checkpoint too (its
  // acknowledgement releases the chunk, see on_standby_frame), so a
  // takeover never finds children ahead of it.
  round_ += 1;
  save_checkpoint();
  start_upload();
  const bool wait_for_standby = root_.held_back && standby_awaited() && uploading();
  if (wait_for_standby) {
    root_.held_since = Clock::now();
  } else {
    if (standby_.link) standby_missing("it is not connected");
    release_held_back();
  }
  if (opt_.on_model) opt_.on_model(finished, root_.global);
  if (round_ == cfg_.rounds) {
    if (root_.held_back) {
      root_.done_pending = true;  // after the last chunk
    } else {
      send_done(round_);
    }
    phase_ = Phase::kDraining;
    phase_deadline_ = Clock::now() + cfg_.round_timeout;
    finish_deadline_ = Clock::now() + cfg_.finish_wait;
  } else {
    open_round(round_);
    round_started_ = now;
    welcome_pending();
  }
  try_finish_round_report(finished);
}

void Aggregator::Impl::release_held_back() {
  if (!root_.held_back) return;
  for (const Child& c : down_.children) {
    if (c.live && !c.rejoin_pending) send_child(c, root_.held_back->first, root_.held_back->second);
  }
  root_.held_back.reset();
  if (root_.done_pending) {
    root_.done_pending = false;
    send_done(round_);
  }
  // Once the next round is open: inside root_commit_round (no standby to
  // wait for) the round's replaced anchor chunks are still kept, and a
  // child welcomed then would be sent the round that just ended.
  if (acc_ && acc_->is_open() && acc_->round() == round_) welcome_pending();
}

}  // namespace fedwan
