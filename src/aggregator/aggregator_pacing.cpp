// Pacing the sites' uploads (aggregator/uplink_pacer.hpp, docs/protocol.md
// "Pacing"): after each delivery, a child lost or a deadline, every site
// child is told how many chunks of the open round it may have sent, in a
// heartbeat with kFlagPace. One that cannot go now (a full window) goes
// from flush(); the heartbeat timer says each allowance again, so a lost
// one costs at most a heartbeat.
#include <algorithm>

#include "aggregator/aggregator_impl.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"
#include "wire/frame.hpp"

namespace fedwan {

// Under this many chunks of room, sites wait for allowances so often that
// the aggregator's queue runs dry between them (docs/benchmarks.md, "Sites
// paced by the root"): chunks are then left to wait on disk instead.
constexpr uint32_t kMinPaceWindow = 8;

bool Aggregator::Impl::pacing_on() const {
  // Only where chunks that wait for their other copies go to disk beyond a
  // budget (with none, every one does: spill_from_bytes 0).
  return opt_.pace_uploads && acc_.has_value() && anchors_.store.on() && model_.plan.has_value() &&
         opt_.spill_from_bytes != 0 && pacer_.window() >= kMinPaceWindow;
}

void Aggregator::Impl::pace_open() {
  pace_pending_.assign(down_.children.size(), false);
  if (!pacing_on()) return;
  pacer_.open(round_, model_.plan->count(), down_.children.size());
  pace_children();
}

void Aggregator::Impl::pace_children() {
  if (!pacer_.is_open() || !acc_ || !acc_->is_open() || acc_->round() != pacer_.round()) return;
  if (phase_ != Phase::kTraining) return;
  std::vector<aggregator::UplinkPacer::Progress> progress;
  progress.reserve(down_.children.size());
  for (uint32_t slot = 0; slot < down_.children.size(); ++slot) {
    const Child& c = down_.children[slot];
    const bool owing = acc_->expected(c.index) && !acc_->delivered_all(c.index);
    const bool paced = c.is_site && c.live && c.joined && c.welcomed;
    progress.push_back({slot, acc_->delivered(c.index), owing, paced});
  }
  queue_paces(pacer_.update(progress));
}

void Aggregator::Impl::pace_lift() { queue_paces(pacer_.lift()); }

void Aggregator::Impl::pace_again() {
  if (!pacer_.is_open() || pacer_.round() != round_ || phase_ != Phase::kTraining) return;
  for (uint32_t slot = 0; slot < pace_pending_.size(); ++slot) {
    if (pacer_.told(slot) > 0) pace_pending_[slot] = true;
  }
  send_paces();
}

void Aggregator::Impl::pace_welcomed(const Child& c, uint64_t round) {
  if (!pacing_on() || !c.is_site) return;
  const size_t slot = down_.link.slot(c.id);
  uint32_t allowed = pacer_.window();
  if (pacer_.is_open() && pacer_.round() == round) allowed = std::max(allowed, pacer_.told(slot));
  wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kHeartbeat, round);
  h.flags = wire::kFlagPace;
  // In its outbox, so it goes before the welcome whatever the window.
  send_child(c, node::make_frame(h, wire::encode_pace({allowed, pacer_.window()})), h);
}

void Aggregator::Impl::queue_paces(const std::vector<aggregator::UplinkPacer::Grant>& grants) {
  if (grants.empty()) return;
  if (pace_pending_.size() < down_.children.size()) pace_pending_.resize(down_.children.size());
  for (const auto& g : grants) pace_pending_[g.slot] = true;
  send_paces();
}

void Aggregator::Impl::send_paces() {
  pace_waiting_ = false;
  for (uint32_t slot = 0; slot < pace_pending_.size() && slot < down_.children.size(); ++slot) {
    if (!pace_pending_[slot]) continue;
    const Child& c = down_.children[slot];
    if (!c.live || !c.joined) {
      pace_pending_[slot] = false;
      continue;
    }
    wire::FrameHeader h =
        node::node_header(topo_, self_.index, wire::MsgType::kHeartbeat, pacer_.round());
    h.flags = wire::kFlagPace;
    try {
      if (down_.link.link().try_send(
              c.id, node::make_frame(h, wire::encode_pace({pacer_.told(slot), pacer_.window()})))) {
        pace_pending_[slot] = false;
      } else {
        pace_waiting_ = true;  // its window is full: from flush()
      }
    } catch (const Error&) {
      pace_pending_[slot] = false;  // not connected: told again when it is
    }
  }
}

}  // namespace fedwan
