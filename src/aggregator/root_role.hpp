// The root (aggregator/role.hpp): the global model and the outer optimizer
// stepped on each complete chunk of its children's mean, the new anchor
// streamed down chunk by chunk, the round's commit, the traffic report of
// the whole tree, and the link to its standby (the root's checkpoint goes
// there every round; a live standby holds a round before the round's last
// anchor chunk leaves, so a takeover loses nothing).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aggregator/privacy_noise.hpp"
#include "aggregator/role.hpp"
#include "aggregator/root_model.hpp"
#include "privacy/quantile_clip.hpp"
#include "privacy/random_source.hpp"

namespace fedwan {

class Aggregator::Impl::RootRole : public Aggregator::Impl::Role {
 public:
  explicit RootRole(Impl& node);

  const std::vector<float>& anchor() const override { return model_.held(); }
  std::array<uint8_t, 32> anchor_digest() const override;
  bool chunk_advanced(uint32_t chunk) const override {
    return chunk < advanced_.size() && advanced_[chunk];
  }
  bool vouches_for_round_anchor() const override { return !mixed_ || round_digest_.has_value(); }
  bool anchor_whole() const override { return !mixed_; }
  void saved(const Checkpoint& c, const std::vector<std::array<uint8_t, 32>>& digests) override;
  void children_joined() override;
  void round_opened(uint64_t round) override;
  void chunk_complete(uint32_t chunk) override;
  void round_closed(Clock::time_point now, double secs) override;
  void report(uint64_t round) override;
  bool holds_rejoins() const override { return !held_back_.empty(); }
  bool end_held_back() const override { return done_pending_; }
  void finished() override;

  void watch(std::vector<transport::Transport::Interest>* interests) override;
  void receive(transport::Incoming& in) override;
  void heartbeat(Clock::time_point now) override;
  void busy_beat() override;  // to its standby
  void not_listening(Clock::duration d, Clock::time_point now) override;
  bool replicates(uint64_t round) const override;
  transport::ParentLink* replica_link() override { return standby_.link.get(); }

  void save(Checkpoint& c, nlohmann::json& meta) const override;
  void no_checkpoint() override;
  void restore(const Checkpoint& c, const std::string& path) override;
  bool recover(bool resumed) override;
  void summarize(AggregatorSummary& s) override;

 private:
  void on_standby_frame(transport::Incoming& in);
  void open_standby_link();
  // A round committed without its standby holding it (logged and audited
  // as standby_lost once, until the standby is back).
  void standby_missing(const std::string& why);
  aggregator::StandbyLink standby_view() const {
    return {standby_.link != nullptr, standby_.seen, standby_.warned, standby_.heard,
            standby_.link_opened};
  }
  // What a round's last anchor chunk waits for (aggregator/round_wait.hpp).
  bool standby_awaited() const;
  void release_held_back();  // the round's last anchor chunk, once committed
  void audit_privacy(uint64_t finished);
  void adapt_clip(uint64_t finished);

  // The model every child holds (exact), and the global model as that plus
  // a bf16 residual (aggregator/root_model.hpp). Where every child is a
  // site, each chunk of the next anchor is added to the anchor in the pass
  // that encodes it, as it goes down (advanced_): the anchor is mixed until
  // the round commits. A site welcomed in full mid-round is sent it as it
  // is and, for the chunks already added, updates that change nothing
  // (Impl::welcome_one); one that offers the round's anchor is told "no
  // change" only where its digest was known before the first chunk moved
  // (round_digest_), else it is sent the model in full. Chunks held back
  // for the commit (the round's last; every chunk with central noise, which
  // must not leave before the commit) and every chunk under a region (a
  // region relays the round's frames to children that hold its anchor)
  // wait in their encoded frames (pending_) and are added at the commit.
  aggregator::RootModel model_;
  std::vector<float> global_;  // one chunk's global values (chunk_complete)
  // A chunk's global values stepped by the outer optimizer with `mean` (if
  // any copy stood), encoded into `payload` and settled
  // (RootModel::encode_and_settle), split over the children's link's
  // crypto threads where it has some, in parts of at least
  // kCommitPartBlocks fp16 blocks (64K values: a tenth of a millisecond of
  // work, where handing a part to a thread costs some microseconds).
  static constexpr size_t kCommitPartBlocks = 32;
  void step_and_encode(uint64_t off, uint32_t n, std::vector<float>& mean, uint8_t* payload,
                       aggregator::RootModel::Anchor anchor);
  std::vector<std::pair<uint32_t, aggregator::StoredFrame>> pending_;  // chunk, its anchor frame
  void apply_pending();
  bool advances_now() const;    // whether the next chunk of the anchor may be added as it goes
  std::vector<bool> advanced_;  // the open round's chunks already in the anchor
  bool mixed_ = false;          // any of them
  std::optional<std::array<uint8_t, 32>> round_digest_;  // the round's own anchor's, if known
  std::unique_ptr<OuterOptimizer> outer_;
  // The last anchor chunk of a round waits until the round's checkpoint is
  // durable (and held by a live standby), so no child ever holds a round
  // the root could forget in a crash. With central differential privacy
  // every chunk of the round waits so: a noised round leaves the root once,
  // never again after a restart with other noise.
  std::vector<std::pair<Frame, wire::FrameHeader>> held_back_;
  bool committed_ = false;  // the held chunks' round is committed: they may go
  Clock::time_point held_since_;
  std::unique_ptr<aggregator::CentralNoise> noise_;  // central differential privacy
  std::optional<privacy::QuantileClip> quantile_;    // adaptive clipping
  privacy::CryptoRandom count_rng_;                  // its count's noise
  bool done_pending_ = false;                        // kDone waits for the held-back chunk
  bool corrupt_ = false;                             // only corrupt checkpoints; ask the standby

  // The link its checkpoints go over, and what the standby acknowledged.
  struct StandbyLink {
    std::unique_ptr<transport::ParentLink> link;
    Clock::time_point link_opened;
    bool seen = false;
    bool warned = false;
    Clock::time_point heard;
    std::optional<uint64_t> acked;
  } standby_;
};

}  // namespace fedwan
