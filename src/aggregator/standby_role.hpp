// The root's standby (aggregator/role.hpp): a root run with
// AggregatorOptions::standby. Passive, it keeps the checkpoints the active
// root streams to it (acknowledging each, so the root may release the
// round's last anchor chunk) and serves the root its copy when the root's
// own are lost; when the root has been silent for a heartbeat timeout and a
// child comes to it, it takes over from the newest one and is the root from
// then on (a root that comes back is told to stop).
#pragma once

#include <string>

#include "aggregator/root_role.hpp"

namespace fedwan {

class Aggregator::Impl::StandbyRole final : public Aggregator::Impl::RootRole {
 public:
  explicit StandbyRole(Impl& node);

  void heartbeat(Clock::time_point now) override;
  void not_listening(Clock::duration d, Clock::time_point now) override;
  bool recover(bool resumed) override;
  void summarize(AggregatorSummary& s) override;
  bool passive() const override { return passive_; }
  bool own_frame(transport::Incoming& in) override;
  bool may_serve(const std::string& peer) override;

 private:
  void on_root_frame(transport::Incoming& in);  // the active root's checkpoints
  void serve_root_replica();                    // the root lost its own checkpoints
  void take_over(const std::string& asker);

  bool passive_ = false;
  Clock::time_point root_heard_;  // the active root last heard
  bool root_seen_ = false;        // heard the active root at least once
};

}  // namespace fedwan
