// What an aggregator does as the root, as a region or as the root's
// standby. One event loop (Aggregator::Impl: the children, their rounds,
// membership, checkpoints, metrics) serves every role and calls its role at
// the points where they differ; the role is chosen once, in Impl's
// constructor (make_role), and owns the state only it has:
//   RootRole     (root_role.cpp)     the global model and the outer
//                                    optimizer, the round's commit, the link
//                                    to its standby;
//   StandbyRole  (standby_role.cpp)  a root that keeps the active root's
//                                    checkpoints, passive until it takes over;
//   RegionRole   (region_role.cpp)   the anchor relayed down, aggregates
//                                    sent up, the child's end of the parent
//                                    protocol (session::Uplink).
// docs/architecture.md draws them. Not thread safe: run()'s thread only.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"

namespace fedwan {

class Aggregator::Impl::Role {
 public:
  explicit Role(Impl& node) : n_(node) {}
  virtual ~Role() = default;
  Role(const Role&) = delete;
  Role& operator=(const Role&) = delete;

  // The model its children hold: the root's `held`, a region's anchor.
  virtual const std::vector<float>& anchor() const = 0;
  // SHA-256 of anchor()'s fp32 bytes, as a child's hello names the model
  // it holds. Roles that know it keep it while the anchor stands.
  virtual std::array<uint8_t, 32> anchor_digest() const;
  // Mid-round, whether anchor() already holds chunk `chunk` of the next
  // anchor (the root adds each chunk as it goes down when every child is a
  // site): a child sent the anchor in full gets, for that chunk, an update
  // that changes nothing instead of the round's frame.
  virtual bool chunk_advanced(uint32_t /*chunk*/) const { return false; }
  // Whether anchor_digest() names the round's own anchor, so a child that
  // says it holds that anchor can be told "no change" (the root, mid-round,
  // only where it knew that digest before the anchor began to move).
  virtual bool vouches_for_round_anchor() const { return true; }
  // Whether anchor() is the round's own anchor (not mixed with chunks of
  // the next): children other than sites are welcomed mid-round only then.
  virtual bool anchor_whole() const { return true; }
  // The child's end of the link to a parent (a region's), or null.
  virtual session::Uplink* uplink() { return nullptr; }

  // ---- the round protocol
  // Every child that is waited for said hello.
  virtual void children_joined() = 0;
  virtual void round_opened(uint64_t round) = 0;
  // Chunk `chunk` of the open round is complete in the accumulator.
  virtual void chunk_complete(uint32_t chunk) = 0;
  virtual void round_closed(Clock::time_point now, double secs) = 0;
  // Round `round`'s traffic report, once nothing it waits for is missing.
  virtual void report(uint64_t round) = 0;
  // Its membership to its parent (a region's).
  virtual void report_membership() {}
  // A round with no member under it is sat out (a region), not failed.
  virtual bool sits_out_empty_rounds() const { return false; }
  // It is being resynced by its parent itself (a region): children that
  // rejoin now wait for its own welcome.
  virtual bool resyncing() const { return false; }
  // The round's last anchor chunk is held back for the standby (the root):
  // children that rejoin now are welcomed once it is out.
  virtual bool holds_rejoins() const { return false; }
  // The end waits for the round's held-back last anchor chunk (the root).
  virtual bool end_held_back() const { return false; }
  // The federation is over here: tell whoever is above.
  virtual void finished() = 0;

  // ---- the link above the children: a region's parent, the root's standby
  virtual void watch(std::vector<transport::Transport::Interest>* interests) = 0;
  virtual void receive(transport::Incoming& in) = 0;
  // Sends what waits to go up; whether nothing does.
  virtual bool flush() { return true; }
  virtual size_t waiting() const { return 0; }
  virtual void heartbeat(Clock::time_point now) = 0;
  // A heartbeat marked busy (wire::kFlagBusy) to the peer above, if it can
  // go now: the node writes its checkpoint and reads nothing meanwhile.
  virtual void busy_beat() {}
  // This node did not read its links for `d` until `now` (its loop was
  // away): the peers only its role talks to (the root's standby, a
  // standby's root) are not blamed for their silence meanwhile.
  virtual void not_listening(Clock::duration /*d*/, Clock::time_point /*now*/) {}
  // Throws when the link above has not read for too long.
  virtual void check_stuck(Clock::time_point /*now*/) const {}
  // Whom the phases that wait for an answer from above wait for.
  virtual std::string awaited() const { return "nobody"; }
  // This node's checkpoint goes up this round (to a parent that keeps
  // replicas, or to the root's standby), and the link it goes over while
  // nothing of the round protocol waits (null: not now).
  virtual bool replicates(uint64_t round) const = 0;
  virtual transport::ParentLink* replica_link() = 0;

  // ---- checkpoints and recovery
  virtual void save(Checkpoint& c, nlohmann::json& meta) const = 0;
  // `c` was written; `digests` are its sections' SHA-256 in their order.
  virtual void saved(const Checkpoint& /*c*/,
                     const std::vector<std::array<uint8_t, 32>>& /*digests*/) {}
  // No checkpoint of its own could be loaded (throws when starting over
  // would redo committed rounds).
  virtual void no_checkpoint() {}
  virtual void restore(const Checkpoint& c, const std::string& path) = 0;
  // The round it resumed at is open.
  virtual void resumed() {}
  // After trying its own checkpoint: the copy kept above, when it has none.
  virtual bool recover(bool resumed) = 0;
  // Once the run is over: what the summary takes from the role (the root's
  // final model, moved out), the role's own buffers released.
  virtual void summarize(AggregatorSummary& /*s*/) {}

  // ---- a standby's
  // Passive: not serving the federation (no deadlines apply).
  virtual bool passive() const { return false; }
  // A frame on the children's socket that is the role's own (the active
  // root's, at its standby): handled.
  virtual bool own_frame(transport::Incoming& /*in*/) { return false; }
  // Whether the child `peer` is served (a passive standby: not while the
  // root lives).
  virtual bool may_serve(const std::string& /*peer*/) { return true; }

 protected:
  Impl& n_;
};

}  // namespace fedwan
