// PySiteCore: SiteCore over a caller-owned float32 NumPy array, as
// bind_site_core.cpp exposes it to Python. The wrapper keeps the array alive
// for as long as the SiteCore writes into it, and releases the GIL while
// join(), sync() and finish_sync() block on the network. Included by that
// one file only.
#pragma once

#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>

#include "bindings.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_core.hpp"
#include "typed_args.hpp"

namespace fedwan::python {

inline py::dict sync_dict(const SyncResult& r) {
  py::dict d;
  d["round"] = r.round;
  d["finished"] = r.finished;
  d["bytes_sent"] = r.bytes_sent;
  d["bytes_received"] = r.bytes_received;
  d["bytes_resent"] = r.bytes_resent;
  d["replica_bytes"] = r.replica_bytes;
  d["resynced"] = r.resynced;
  d["paused_seconds"] = r.paused_seconds;
  return d;
}

// Thread safety: one Python thread at a time may be in join()/sync()/
// finish_sync(); a second gets fedwan.Error at once rather than waiting
// (waiting while holding the GIL could deadlock with the first thread
// re-taking it). The read-only properties never block.
//
// While an overlapped sync is pending (begin_sync() .. finish_sync()) the
// core's worker thread owns the link, the anchor and the security state:
// the wrapper then refuses checkpoint() and leaves the alarms as they were
// (reading them would race with the worker).
class PySiteCore {
 public:
  PySiteCore(const TopologyArg& topology, const std::string& node_id, const Float32ArrayArg& params,
             double join_timeout_s, std::optional<double> round_timeout_s, int window,
             const OptionalPathArg& credentials, bool insecure_plaintext, const std::string& cipher,
             const OptionalPathArg& audit_log, const OptionalPathArg& checkpoint_dir,
             const OptionalPathArg& costs_path, int devices, const std::string& device_kind,
             const std::string& metrics, const OptionalPathArg& metrics_token_file,
             double checkpoint_budget, std::optional<int64_t> page_out_from_bytes)
      : params_(float32_buffer(params.obj, "params", /*writable=*/true, /*non_empty=*/true)) {
    SiteOptions opt;
    opt.topology = topology_from(topology.obj);
    opt.node_id = node_id;
    set_node_options(opt, join_timeout_s, round_timeout_s, window, credentials.obj,
                     insecure_plaintext, cipher, audit_log.obj, checkpoint_dir.obj);
    if (!costs_path.obj.is_none()) opt.costs_path = path_from(costs_path.obj, "costs_path");
    opt.checkpoint_budget = checkpoint_budget;
    if (page_out_from_bytes) {
      opt.page_out_from_bytes =
          *page_out_from_bytes < 0 ? SIZE_MAX : static_cast<size_t>(*page_out_from_bytes);
    }
    if (devices < 1) throw ConfigError("devices must be >= 1, got " + std::to_string(devices));
    opt.devices = static_cast<uint32_t>(devices);
    opt.device_kind = device_kind;
    opt.metrics_bind = metrics;
    if (!metrics_token_file.obj.is_none()) {
      opt.metrics_token_file = path_from(metrics_token_file.obj, "metrics_token_file");
    }
    core_ = std::make_unique<SiteCore>(std::move(opt), static_cast<float*>(params_.mutable_data()),
                                       static_cast<size_t>(params_.size()));
    inner_steps_ = core_->inner_steps();
    overlap_steps_ = core_->overlap_steps();
    rounds_ = core_->rounds();
  }

  // Closing the socket may wait up to its linger time (seconds) for frames
  // a vanished parent never took; other Python threads run meanwhile.
  ~PySiteCore() {
    py::gil_scoped_release nogil;
    core_.reset();
  }
  PySiteCore(const PySiteCore&) = delete;
  PySiteCore& operator=(const PySiteCore&) = delete;

  // join() and sync() block on the network: Ctrl-C stops the site (see
  // run_interruptible). service() returns within a heartbeat.
  py::dict join() {
    return run_locked(
        "join", [this] { return core_->join(); }, true);
  }
  py::dict sync() {
    return run_locked(
        "sync", [this] { return core_->sync(); }, true);
  }
  py::dict service() {
    return run_locked("service", [this] { return core_->service(); });
  }

  // Overlapped rounds: begin_sync() only copies params and starts the
  // core's worker; finish_sync() waits for it like sync() waits for the
  // network (interruptible). round and finished keep describing the round
  // that ended until finish_sync() returns.
  void begin_sync() {
    run_locked("begin_sync", [this] {
      handle_ = core_->begin_sync();
      return current();
    });
  }
  // Waits at most timeout_s (the GIL released) for the pending sync; once
  // it is in, merges it as finish_sync() does. None while still pending.
  py::object wait_sync(double timeout_s) {
    const auto timeout = seconds_to_ms(timeout_s, "timeout_s");
    bool merged = false;
    py::dict d = run_locked("wait_sync", [this, timeout, &merged] {
      if (!core_->sync_pending()) {
        throw Error("SiteCore.wait_sync(): no sync is pending; call begin_sync() first");
      }
      std::optional<SyncResult> r = handle_.wait(timeout);
      merged = r.has_value();
      return merged ? *r : current();
    });
    if (!merged) return py::none();
    return std::move(d);
  }
  py::dict finish_sync() {
    return run_locked(
        "finish_sync", [this] { return core_->finish_sync(); }, true);
  }

  void checkpoint() {
    run_locked("checkpoint", [this] {
      if (core_->sync_pending()) {
        throw Error("SiteCore.checkpoint(): a sync is pending (begin_sync()); call "
                    "finish_sync() first: it checkpoints at the merge");
      }
      core_->checkpoint();
      return current();
    });
  }

  bool leave(double timeout_s) {
    bool told = false;
    run_locked("leave", [this, timeout_s, &told] {
      told = core_->leave(seconds_to_ms(timeout_s, "timeout_s"));
      return current();
    });
    return told;
  }

  // Not under busy_: it is how another thread ends a join() or sync().
  // A no-op once closed.
  void stop() {
    std::lock_guard<std::mutex> lock(core_mu_);
    if (core_) core_->stop();
  }

  // Releases the link (sockets, TLS state, audit log) now rather than when
  // the object is collected. Idempotent; every later join/sync/service/
  // checkpoint raises fedwan.Error. Closing may wait up to the socket's
  // linger time for frames a vanished parent never took (GIL released).
  void close() {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy) {
      throw Error("SiteCore.close(): a join(), sync() or finish_sync() of this site is in "
                  "progress; call stop() first (it raises fedwan.StoppedError there), then "
                  "close()");
    }
    std::unique_ptr<SiteCore> core;
    {
      std::lock_guard<std::mutex> lock(core_mu_);
      core = std::move(core_);
    }
    pending_.store(false);
    py::gil_scoped_release nogil;
    core.reset();  // stops and joins the worker of a pending sync
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(core_mu_);
    return core_ == nullptr;
  }

  uint64_t round() const { return round_.load(); }
  bool finished() const { return finished_.load(); }
  uint64_t inner_steps() const { return inner_steps_; }
  uint64_t overlap_steps() const { return overlap_steps_; }
  uint64_t rounds() const { return rounds_; }
  bool sync_pending() const { return pending_.load(); }
  // Under core_mu_: close() cannot free the core meanwhile. The core reads
  // its pending flag and the worker's done flag (an atomic); like every
  // call, it is meant for the thread that drives the site.
  bool sync_ready() const {
    std::lock_guard<std::mutex> lock(core_mu_);
    return core_ != nullptr && pending_.load() && core_->sync_ready();
  }
  std::vector<std::string> alarms() const {
    std::lock_guard<std::mutex> lock(alarms_mu_);
    return alarms_;
  }
  const py::array& params() const { return params_; }
  py::bytes initial_digest() const {
    require_open("initial_digest");
    const auto& d = core_->initial_digest();
    return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
  }

 private:
  template <class F>
  py::dict run_locked(const char* what, F&& call, bool interruptible = false) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock) {
      throw Error(std::string("SiteCore.") + what +
                  "(): a join(), sync() or finish_sync() of this site is "
                  "in progress (another thread, or this one under a signal handler); drive a "
                  "site from one thread, and from a signal handler call stop() (the call in "
                  "progress raises fedwan.StoppedError, then checkpoint())");
    }
    require_open(what);
    struct AfterCall {  // however the call ends
      PySiteCore& self;
      ~AfterCall() {
        const bool pending = self.core_->sync_pending();
        self.pending_.store(pending);
        if (pending) return;  // the worker owns the security state
        std::vector<std::string> a = self.core_->alarms();
        std::lock_guard<std::mutex> lock(self.alarms_mu_);
        self.alarms_ = std::move(a);
      }
    };
    SyncResult r;
    if (interruptible) {
      AfterCall after{*this};
      r = run_interruptible<SyncResult>(call, [this] { core_->stop(); });
    } else {
      py::gil_scoped_release nogil;
      AfterCall after{*this};
      r = call();
    }
    round_.store(r.round);
    finished_.store(r.finished);
    return sync_dict(r);
  }

  // Where the site stands, for the calls that return no SyncResult (with a
  // sync pending: the round that ended, not finished).
  SyncResult current() const {
    SyncResult r;
    r.round = core_->round();
    r.finished = core_->finished();
    return r;
  }

  // Under busy_ (or for a const read): core_ only changes in close(),
  // which holds busy_.
  void require_open(const char* what) const {
    if (core_ == nullptr) {
      throw Error(std::string("SiteCore.") + what +
                  "(): the site is closed; build a new "
                  "SiteCore (it resumes from checkpoint_dir if it had one)");
    }
  }

  py::array params_;                // the caller's buffer; kept alive while core_ writes into it
  std::unique_ptr<SiteCore> core_;  // null once closed
  mutable std::mutex core_mu_;      // core_ against stop() from another thread
  uint64_t inner_steps_ = 0;
  uint64_t overlap_steps_ = 0;
  uint64_t rounds_ = 0;
  std::mutex busy_;
  std::atomic<uint64_t> round_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> pending_{false};  // an overlapped sync is in flight
  PendingSync handle_;                // of the last begin_sync(), under busy_
  mutable std::mutex alarms_mu_;
  std::vector<std::string> alarms_;  // as of the last call with no sync pending
};

}  // namespace fedwan::python
