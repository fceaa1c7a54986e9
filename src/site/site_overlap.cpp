// Overlapped rounds (federation.overlap_steps): begin_sync() copies params
// and runs the round's sync - the same steps as sync(), on the copy - on a
// worker thread; finish_sync() joins it and merges the next anchor into
// params with the local progress made meanwhile kept on top:
//
//   params += new anchor - params at begin_sync
//
// The worker owns the link, the anchor, the residual and the copy; the
// caller owns params. As the next anchor's chunks come in, the worker turns
// the copy into (new anchor - params sent) chunk by chunk
// (apply_update_chunk), so a pending sync costs one extra model copy.
// Checkpoints read params, so the worker defers them to finish_sync, which
// saves at the merge point: the merged params, the new anchor and round.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "site/site_impl.hpp"

namespace fedwan {

SiteCore::Impl::~Impl() {
  if (!overlap.worker.joinable()) return;
  // The caller is gone: the worker stops at its next check (within ~100 ms,
  // or a bounded send's timeout).
  stop_deadline_ns.store(0);
  stop_requested.store(true);
  overlap.worker.join();
}

void SiteCore::Impl::begin_sync() {
  throw_if_failed();
  if (overlap.pending) {
    throw Error("site '" + self.id + "': a sync is already pending; call finish_sync() first");
  }
  if (!joined) throw Error("site '" + self.id + "': call join() before begin_sync()");
  if (finished) throw Error("site '" + self.id + "': the federation is already finished");
  if (left) throw Error("site '" + self.id + "' has left the federation");
  if (opt.update_encoder) {
    throw ConfigError("site '" + self.id +
                      "': an overlapped sync encodes its update on the host; it cannot use an "
                      "UpdateEncoder (fedwan::Site installs none when overlap_steps > 0)");
  }
  throw_if_stopped("before its sync");
  overlap.sent.assign(params, params + plan.total());
  cost_training_ends();
  trained_since = Clock::now();  // training goes on while the sync runs
  overlap.round = round;
  overlap.began = Clock::now();
  overlap.result = SyncResult();
  overlap.error = nullptr;
  overlap.checkpoint_due = overlap.upload_due = false;
  overlap.done.store(false);
  overlap.generation += 1;
  sync_unfinished = true;
  in_sync.store(true);
  work = overlap.sent.data();
  overlap.pending = true;
  try {
    overlap.worker = std::thread([this] {
      LogScope scope(self.id, &round);
      try {
        run_sync(&overlap.result);
      } catch (...) {
        overlap.error = std::current_exception();
      }
      overlap.set_done();
    });
  } catch (const std::system_error& e) {
    work = params;
    overlap.pending = false;
    in_sync.store(false);
    overlap.failed = true;
    throw Error("site '" + self.id + "': cannot start the sync's thread: " + e.what());
  }
}

SyncResult SiteCore::Impl::finish_sync() {
  if (!overlap.pending) {
    throw Error("site '" + self.id + "': no sync is pending; call begin_sync() first");
  }
  if (overlap.worker.joinable()) overlap.worker.join();  // service() may have joined it
  overlap.pending = false;
  work = params;
  in_sync.store(false);
  if (overlap.error) {
    overlap.failed = true;  // params are the caller's; the anchor may be half new
    std::rethrow_exception(std::exchange(overlap.error, nullptr));
  }
  SyncResult res = overlap.result;
  const size_t n = plan.total();
  if (res.resynced || finished) {
    // A model in full replaced the round, or the federation ended: the
    // progress since begin_sync was made on a model that is gone.
    std::memcpy(params, anchor.data(), n * sizeof(float));
  } else if (round == overlap.round + 1) {
    const float* correction = overlap.sent.data();
    for (size_t k = 0; k < n; ++k) params[k] += correction[k];
  }
  sync_unfinished = false;
  if (overlap.checkpoint_due) {
    boundary_checkpoint(overlap.upload_due);
    if (overlap.upload_due) start_upload();
  }
  cost_training_ends();
  cost_link_bytes();
  costs.round_ended(overlap.round, round == overlap.round + 1 && !res.resynced);
  pause_outside_window(&res);  // a resync there puts the new model into params
  cost_link_bytes();
  trained_since = Clock::now();
  res.round = round;
  res.replica_bytes = replica_bytes_since_last();
  update_metrics(true, overlap.seconds());
  res.finished = finished;
  return res;
}

}  // namespace fedwan
