// A region (aggregator/role.hpp): a complete chunk of its children's mean
// goes up (residency checked, error feedback for lossy codecs); the
// parent's model comes down (its welcome, with the model in full when the
// region lacks it; the next anchor chunk by chunk, applied and relayed to
// the children at once; the end). Its link to the parent, the child's end
// of the protocol as a site's is, is RegionLink (aggregator/region_link.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "aggregator/region_link.hpp"
#include "aggregator/role.hpp"

namespace fedwan {

class Aggregator::Impl::RegionRole final : public Aggregator::Impl::Role {
 public:
  explicit RegionRole(Impl& node);

  const std::vector<float>& anchor() const override { return anchor_; }
  std::array<uint8_t, 32> anchor_digest() const override;
  session::Uplink* uplink() override { return &link_.uplink(); }
  void children_joined() override;
  void round_opened(uint64_t round) override;
  void chunk_complete(uint32_t chunk) override;
  void round_closed(Clock::time_point now, double secs) override;
  void report(uint64_t round) override;
  void report_membership() override { link_.report_membership(); }
  bool sits_out_empty_rounds() const override { return true; }
  // Also while it holds no anchor (restored from its replica image, until
  // the parent's model is in): children wait for it.
  bool resyncing() const override {
    return n_.phase_ == Phase::kAwaitWelcome || link_.welcome.full_pending ||
           anchor_.size() != n_.model_.elements;
  }
  void finished() override { link_.done(); }

  void watch(std::vector<transport::Transport::Interest>* interests) override {
    link_.watch(interests);
  }
  void receive(transport::Incoming& in) override { link_.receive(in); }
  bool flush() override { return link_.flush(); }
  size_t waiting() const override { return link_.waiting(); }
  void heartbeat(Clock::time_point now) override { link_.heartbeat(now); }
  void busy_beat() override { link_.busy_beat(); }
  void check_stuck(Clock::time_point now) const override { link_.check_stuck(now); }
  std::string awaited() const override { return link_.awaited(); }
  bool replicates(uint64_t round) const override { return link_.replicates(round); }
  transport::ParentLink* replica_link() override { return link_.replica_link(); }

  void save(Checkpoint& c, nlohmann::json& meta) const override;
  void saved(const Checkpoint& c, const std::vector<std::array<uint8_t, 32>>& digests) override;
  void restore(const Checkpoint& c, const std::string& path) override;
  void resumed() override { link_.hello(); }
  bool recover(bool resumed) override;

  // ---- what comes from the parent (RegionLink hands it over)
  void on_parent_welcome(const wire::ParsedFrame& f);
  void on_parent_anchor(const wire::ParsedFrame& f, const uint8_t* raw, size_t raw_size);
  void on_parent_done(uint64_t final_round);
  // The digest of the anchor it holds, for its hello (the parent can then
  // skip the model in full), or nullopt.
  std::optional<std::array<uint8_t, 32>> held_digest() const;
  // Nothing of the next anchor came for a heartbeat timeout.
  bool anchor_stalled(Clock::time_point now) const {
    return now - anchor_progress_at_ > n_.cfg_.heartbeat_timeout;
  }

 private:
  // Withholds the values of a chunk too few sites stand behind.
  void check_residency(aggregation::ChunkSum& cs) const;
  void finish_parent_welcome();  // the welcome's model is in
  // A welcome "no change" at its round: false (and a hello offering no
  // digest has gone) when the parent's anchor digest is not this region's.
  bool anchor_matches(const wire::ParsedFrame& f);
  // Its residual from a checkpoint or replica image (in fp32 from an
  // earlier fedwan, to bf16); throws CryptoError for a wrong size.
  void restore_residual(const Checkpoint& c, const std::string& path);
  void restore_image_residual(const Checkpoint& image, const std::string& path);
  // Adaptive clipping: the clip the parent sent in `what` (0: none), which
  // under adaptive clipping it must; throws ProtocolError otherwise.
  double parent_clip(double clip, const char* what, uint64_t round) const;
  // Adds the relayed chunks of the next anchor to anchor_ (it is whole).
  void apply_relayed();
  // The copies of `round` (the one it opens next, or the open one) get
  // `clip`; a change is audited.
  void use_clip(double clip, uint64_t round);

  RegionLink link_;
  std::vector<float> anchor_;  // the anchor its children hold
  // The digest of anchor_, taken when a hello needs it (a rejoin) rather
  // than every round: hashing a 100M model's anchor is 0.2 CPU-s. Reset
  // wherever anchor_ changes; between a round's opening and the next
  // anchor applied whole it does not (the next anchor's chunks wait in
  // their frames), so it names the round's anchor.
  mutable std::optional<std::array<uint8_t, 32>> anchor_digest_;
  void anchor_changed() { anchor_digest_.reset(); }
  // Joining with the model the federation starts from (options'
  // initial_model): its digest goes up in the first hello.
  bool holds_initial_ = false;
  // Its anchor differed from the parent's: hellos offer no digest until the
  // model comes in full.
  bool offer_none_ = false;
  // Error-feedback residual of the forwarded means (lossy codecs), kept in
  // bf16 (codec/compact_feedback.hpp), and a chunk's fp32 working copy.
  std::vector<uint16_t> residual_;
  std::vector<float> residual_scratch_;
  // Anchor relay progress: which chunks of the next anchor (round
  // relay_round) are applied and relayed. A chunk the parent sends again
  // (after welcoming this region back) is neither applied twice nor counted
  // twice.
  struct Relay {
    uint64_t round = 0;
    std::vector<bool> done;
    uint32_t chunks = 0;
    double clip = 0;  // adaptive clipping: the clip the chunks carry
    // The chunks relayed, as they came: added to anchor_ once the anchor is
    // whole, so anchor_ stays the open round's anchor until then (a child
    // that rejoins meanwhile is sent it as it is, no copy beside it).
    struct Pending {
      uint32_t chunk = 0;
      const Codec* codec = nullptr;
      aggregator::StoredFrame frame;  // on disk for a large model
    };
    std::vector<Pending> pending;
  } relay_;
  Clock::time_point anchor_progress_at_;  // the round's anchor last advanced
  // The end, come before the final anchor was whole: its round and when.
  struct EndWaiting {
    uint64_t round = 0;
    Clock::time_point since;
  } done_;
};

}  // namespace fedwan
