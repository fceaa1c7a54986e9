// Central differential privacy at every aggregator (docs/security.md,
// "Differential privacy"): the clip its children's copies get, the clip
// sent down under adaptive clipping, and a region's count of unclipped
// sites taken in. The root's noise and the clip's moves are RootRole's.
#include <memory>
#include <string>
#include <vector>

#include "aggregator/aggregator_impl.hpp"
#include "wire/frame.hpp"

namespace fedwan {

// Central differential privacy: the aggregator a site sends to clips it. A
// region's copy, a weighted mean of clipped updates, is within the clip
// already: bounded there too (with room for float rounding), so not even a
// dishonest region can put a sum beyond the noise's lattice.
void Aggregator::Impl::clip_children_copies(uint32_t idx) {
  if (cfg_.privacy.mode != node::NodeConfig::Privacy::Mode::kCentral || !acc_) return;
  const bool site = topo_.node(idx).role == fedwan::Role::kSite;
  acc_->clip_copies_of(idx, privacy_clip_ * (site ? 1.0 : 1.0 + 1e-6), site);
}

Aggregator::Impl::Frame Aggregator::Impl::with_round_clip(Frame frame, wire::FrameHeader& h) const {
  if (!adaptive_clip()) return frame;
  h.flags |= wire::kFlagClip;
  return std::make_shared<const std::vector<uint8_t>>(wire::with_clip(*frame, privacy_clip_));
}

// Adaptive clipping over regions: a region's count of its sites whose
// update was not clipped this round, at most the sites under it.
void Aggregator::Impl::take_unclipped_report(const Child& c, uint64_t round, uint64_t sites,
                                             aggregation::AddOutcome outcome) {
  using aggregation::AddOutcome;
  if (outcome != AddOutcome::kAccepted && outcome != AddOutcome::kRefused &&
      outcome != AddOutcome::kDuplicate) {
    return;
  }
  if (!acc_->is_open() || round != acc_->round()) return;
  const uint64_t under = topo_.sites_under(c.index).size();
  if (sites > under) {
    security_->log_noise("unclipped-count:" + c.id,
                         "[agg:" + self_.id + "] '" + c.id + "' counted " + std::to_string(sites) +
                             " unclipped sites in round " + std::to_string(round) + "; it has " +
                             std::to_string(under) + ", so " + std::to_string(under) + " is used");
    security_->audit("privacy_count_capped",
                     {{"sender", c.id}, {"round", round}, {"claimed", sites}, {"sites", under}});
    sites = under;
  }
  acc_->report_unclipped(c.index, sites);
}

}  // namespace fedwan
