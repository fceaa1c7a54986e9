#include "cli/synthetic_rounds.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "fedwan/synthetic.hpp"

namespace fedwan::cli {
namespace {

using Clock = SiteReport::Clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The CPU time of this thread, which takes every synthetic step: what the
// steps cost, apart from the sync's work on other threads meanwhile.
double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

class Rounds {
 public:
  Rounds(SiteCore& site, const SyntheticTraining& t, SiteReport& report)
      : site_(site),
        t_(t),
        report_(report),
        steps_(site.inner_steps()),
        tau_(site.overlap_steps()),
        step_time_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double, std::milli>(t.step_time_ms))) {}

  bool run(SyncResult r) {
    // A site resumed at an overlapped merge already took `done` steps of
    // its round (its data position); a resync restarts the round.
    uint64_t done = tau_ > 0 && site_.resumed() && !r.resynced
                        ? std::min<uint64_t>(site_.data_position(), steps_)
                        : 0;
    while (!r.finished) {
      if (t_.leave_at_round && site_.round() >= *t_.leave_at_round) {
        site_.leave();
        if (t_.left) *t_.left = true;
        return true;
      }
      const Clock::time_point train_started = Clock::now();
      const double cpu_started = thread_cpu_s();
      const Outcome trained = train(done, steps_);
      report_.trained(seconds_since(train_started), thread_cpu_s() - cpu_started);
      if (trained == Outcome::kStop) return false;
      if (trained == Outcome::kResynced) {
        done = 0;
        continue;
      }
      const uint64_t ending = site_.round();
      const Clock::time_point sync_started = Clock::now();
      if (tau_ == 0) {
        r = site_.sync();
        report_.synced(ending, sync_started, r);
        done = 0;
        continue;
      }
      site_.begin_sync();
      const double begin_s = seconds_since(sync_started);
      // No steps after the last round's update: the final model replaces them.
      done = site_.round() + 1 < site_.rounds() ? tau_ : 0;
      const Clock::time_point overlap_started = Clock::now();
      const double overlap_cpu_started = thread_cpu_s();
      const Outcome overlapped = train(0, done);
      const double overlap_train_s = seconds_since(overlap_started);
      const double overlap_train_cpu_s = thread_cpu_s() - overlap_cpu_started;
      // Stopping: finish_sync still merges within the stop's grace (or
      // throws StoppedError, and the last merge's checkpoint stays).
      site_.set_data_position(done);
      const Clock::time_point merge_started = Clock::now();
      r = site_.finish_sync();
      report_.synced(ending, sync_started, r, begin_s + seconds_since(merge_started));
      report_.trained(overlap_train_s, overlap_train_cpu_s);
      if (r.resynced) done = 0;
      if (overlapped == Outcome::kStop) return false;
    }
    return true;
  }

 private:
  enum class Outcome { kDone, kResynced, kStop };

  // Steps [from, to) of the round; paced steps keep deadlines from the
  // first one, so sleeping late in one step does not push back the next.
  Outcome train(uint64_t from, uint64_t to) {
    const bool paced = t_.step_time_ms > 0;
    const Clock::time_point started = Clock::now();
    std::vector<float>& p = *t_.params;
    for (uint64_t k = from; k < to; ++k) {
      if (!paced || k == from) {
        synthetic::local_steps(p.data(), p.size(), t_.site_index, 1, t_.seed);
      }
      const bool resynced =
          paced ? wait_for_step(started + step_time_ * static_cast<int64_t>(k - from + 1))
                : site_.service().resynced;
      if (t_.stop_requested()) return Outcome::kStop;
      if (resynced) return Outcome::kResynced;
    }
    return Outcome::kDone;
  }

  // Waits for a paced step's deadline without using the CPU, in slices
  // short enough that a stop is seen promptly and the parent keeps hearing
  // from the site. True when the parent resynced the site meanwhile.
  bool wait_for_step(Clock::time_point deadline) {
    constexpr Clock::duration kSlice = std::chrono::milliseconds(50);
    for (;;) {
      if (site_.service().resynced) return true;
      const Clock::time_point now = Clock::now();
      if (now >= deadline || t_.stop_requested()) return false;
      std::this_thread::sleep_for(std::min(deadline - now, kSlice));
    }
  }

  SiteCore& site_;
  const SyntheticTraining& t_;
  SiteReport& report_;
  const uint64_t steps_;
  const uint64_t tau_;
  const Clock::duration step_time_;
};

}  // namespace

bool run_synthetic_rounds(SiteCore& site, const SyncResult& joined, const SyntheticTraining& t,
                          SiteReport& report) {
  return Rounds(site, t, report).run(joined);
}

}  // namespace fedwan::cli
