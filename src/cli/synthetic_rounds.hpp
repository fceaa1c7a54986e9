// The round loop of `fedwan site --trainer synthetic`: H inner steps of the
// synthetic workload (optionally paced to a wall time per step, standing for
// a GPU's step), then a sync; with federation.overlap_steps = tau, the sync
// overlaps the next round's first tau steps (SiteCore::begin_sync /
// finish_sync). Thread safety: one training thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "cli/site_report.hpp"
#include "fedwan/site_core.hpp"

namespace fedwan::cli {

struct SyntheticTraining {
  std::vector<float>* params = nullptr;  // the SiteCore's buffer
  uint32_t site_index = 0;               // the site's node index (its target)
  uint64_t seed = 0;
  // > 0: each step takes this wall time without using the CPU, and the
  // model moves one synthetic step per round (dense updates, cheap steps).
  double step_time_ms = 0;
  std::function<bool()> stop_requested;  // polled between steps
  // Set: the site leaves the federation (SiteCore::leave) once it reaches
  // this round, and the loop ends (true, *left set).
  std::optional<uint64_t> leave_at_round;
  bool* left = nullptr;
};

// Trains and syncs from the state join() left (`joined`) until the
// federation finishes (true) or stop_requested() turns true between steps
// (false: the caller checkpoints and exits). Overlapped, every merge is
// checkpointed with the data position = the steps of the new round already
// taken, from which a resumed site goes on. Throws what SiteCore throws.
bool run_synthetic_rounds(SiteCore& site, const SyncResult& joined, const SyntheticTraining& t,
                          SiteReport& report);

}  // namespace fedwan::cli
