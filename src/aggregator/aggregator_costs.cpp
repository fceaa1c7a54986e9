// Aggregator, cost accounting (costs/cost_recorder.hpp): the bytes that
// crossed each of its links, one record per round, written as the next
// round opens and, for the last one, when the node stops. A round's record
// holds what crossed since the previous record, so the records add up to
// every byte counted once.
#include <string>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/role.hpp"

namespace fedwan {

void Aggregator::Impl::collect_costs() {
  costs::CostRecorder& rec = costs_.recorder;
  for (const Child& c : down_.children) {
    const uint64_t now = down_.link.link().bytes_sent_to(c.id);
    uint64_t& seen = costs_.sent_seen[c.id];
    if (now > seen) rec.sent(c.id, now - seen);
    seen = now;
  }
  if (session::Uplink* up = role_->uplink()) up->record_link_bytes(rec);
}

void Aggregator::Impl::costs_round_opened(uint64_t round) {
  if (!costs_.recorder.enabled()) return;
  if (costs_.open && round > costs_.round) {
    collect_costs();
    costs_.recorder.round_ended(costs_.round);
  }
  costs_.open = true;
  costs_.round = round;
}

void Aggregator::Impl::costs_stopped() {
  if (!costs_.recorder.enabled() || !costs_.open) return;
  collect_costs();
  costs_.recorder.round_ended(costs_.round);
  costs_.open = false;
}

}  // namespace fedwan
