// SiteCore over a caller-owned float32 NumPy array. The wrapper keeps the
// array alive for as long as the SiteCore writes into it, and releases the
// GIL while join(), sync() and finish_sync() block on the network.
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
namespace {

py::dict sync_dict(const SyncResult& r) {
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
    opt.join_timeout = seconds_to_ms(join_timeout_s, "join_timeout_s");
    if (round_timeout_s) opt.round_timeout = seconds_to_ms(*round_timeout_s, "round_timeout_s");
    if (window < 1) throw ConfigError("window must be >= 1, got " + std::to_string(window));
    opt.window = window;
    opt.security = security_options(credentials.obj, insecure_plaintext, cipher, audit_log.obj);
    if (!checkpoint_dir.obj.is_none()) {
      opt.checkpoint_dir = path_from(checkpoint_dir.obj, "checkpoint_dir");
    }
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

}  // namespace

constexpr const char* kSiteCoreDoc =
    R"(The site side of the federation over a float32 NumPy array.

`params` must be a C-contiguous, writeable float32 ndarray; it is used in place
(no copy) and kept alive by this object. join() and sync() write the federation's
model into it. With federation.overlap_steps > 0, begin_sync() and finish_sync()
end a round while training goes on. For a torch model use fedwan.Site, which
builds such an array over the model's parameters.

Links are mutual TLS 1.3 with AEAD frames: `credentials` is this site's bundle
directory (fedwan.credentials_path(dir, node_id) after
fedwan.provision_credentials). Without it the site needs insecure_plaintext=True,
which secure parents refuse; neither raises fedwan.ConfigError. `cipher` is
"aes-256-gcm" or "chacha20-poly1305"; `audit_log` a path for a hash-chained JSONL
log of handshakes and updates sent.)";

// Overlapped rounds: begin_sync(), wait_sync() and finish_sync().
void def_overlapped_rounds(py::class_<PySiteCore>& cls) {
  using namespace pybind11::literals;
  cls.def("begin_sync", &PySiteCore::begin_sync,
          "Overlapped rounds (federation.overlap_steps = tau > 0): ends the round as sync() "
          "does, the update being (anchor - params) now, but returns at once: params are "
          "copied and the update goes up and the next model comes down on a worker thread. "
          "Keep training on params; tau inner steps later call finish_sync(). Until then "
          "only finish_sync(), service(), stop(), close() and the properties may be used "
          "(sync() and checkpoint() raise fedwan.Error); round and finished still describe "
          "the round that ended. Raises fedwan.Error when a sync is already pending, before "
          "join(), after the federation finished or after a failed overlapped sync; "
          "fedwan.StoppedError after stop().")
      .def("wait_sync", &PySiteCore::wait_sync, "timeout_s"_a,
           "Waits at most timeout_s for the pending overlapped sync (the GIL released): once "
           "the next model is in, merges it as finish_sync() does and returns the same dict; "
           "None while it is still on its way (train on and ask again). Raises fedwan.Error "
           "when no sync is pending, and what finish_sync() raises.")
      .def("finish_sync", &PySiteCore::finish_sync,
           "Ends the pending overlapped sync: waits for the next model if it is not in yet "
           "(the GIL released; Ctrl-C stops the site and raises KeyboardInterrupt within a "
           "second) and merges it: params += (new model - params at begin_sync()), keeping "
           "the training done since. On a resync params become the parent's model; when the "
           "federation finishes, its final model. Checkpoints at the merge. Returns the same "
           "dict as sync(). Raises fedwan.Error when no sync is pending, and what sync() "
           "raises; after it raised the site is unusable: build a new SiteCore (its join() "
           "resumes from checkpoint_dir).");
}

// The read-only properties: where the site stands, and its settings.
void def_properties(py::class_<PySiteCore>& cls) {
  cls.def_property_readonly("closed", &PySiteCore::closed, "True after close().")
      .def_property_readonly("round", &PySiteCore::round,
                             "The round the site trains in (while a sync is pending: the round "
                             "that ended, until finish_sync()).")
      .def_property_readonly("finished", &PySiteCore::finished,
                             "True once the federation is done; params hold the final model. "
                             "False while a sync is pending.")
      .def_property_readonly("inner_steps", &PySiteCore::inner_steps,
                             "H: local steps per round, from the topology.")
      .def_property_readonly("overlap_steps", &PySiteCore::overlap_steps,
                             "tau: inner steps between begin_sync() and finish_sync(), from the "
                             "topology (federation.overlap_steps); 0: blocking rounds (sync()).")
      .def_property_readonly("rounds", &PySiteCore::rounds,
                             "Rounds of the whole federation, from the topology.")
      .def_property_readonly("sync_pending", &PySiteCore::sync_pending,
                             "True between begin_sync() and the end of finish_sync() (however "
                             "it ends).")
      .def_property_readonly("sync_ready", &PySiteCore::sync_ready,
                             "True when a sync is pending and finish_sync() would not wait: the "
                             "next model is in (or the sync failed and finish_sync() raises).")
      .def_property_readonly("params", &PySiteCore::params, "The array the site works on.")
      .def_property_readonly("alarms", &PySiteCore::alarms,
                             "Conditions an operator must act on that the site rode out (its "
                             "audit log could not be written, the CRL is expiring or expired, "
                             "...), as 'kind: message' strings, as of the last call made "
                             "with no sync pending.")
      .def_property_readonly("initial_digest", &PySiteCore::initial_digest,
                             "SHA-256 of params when the SiteCore was built.");
}

// The constructor: every SiteOptions a Python site sets, keyword-only after
// the join timeout.
void def_constructor(py::class_<PySiteCore>& cls) {
  using namespace pybind11::literals;
  cls.def(py::init<const TopologyArg&, const std::string&, const Float32ArrayArg&, double,
                   std::optional<double>, int, const OptionalPathArg&, bool, const std::string&,
                   const OptionalPathArg&, const OptionalPathArg&, const OptionalPathArg&, int,
                   const std::string&, const std::string&, const OptionalPathArg&, double,
                   std::optional<int64_t>>(),
          "topology"_a, "node_id"_a, "params"_a, "join_timeout_s"_a = 300.0, py::kw_only(),
          "round_timeout_s"_a = py::none(), "window"_a = NodeOptions{}.window,
          "credentials"_a = py::none(), "insecure_plaintext"_a = false, "cipher"_a = "aes-256-gcm",
          "audit_log"_a = py::none(), "checkpoint_dir"_a = py::none(), "costs_path"_a = py::none(),
          "devices"_a = 1, "device_kind"_a = "cpu", "metrics"_a = "",
          "metrics_token_file"_a = py::none(), "checkpoint_budget"_a = 0.05,
          "page_out_from_bytes"_a = py::none(),
          "params: the C-contiguous float32 array the site trains (used in place). "
          "join_timeout_s bounds join(); round_timeout_s bounds each sync() (None: the "
          "topology's federation.round_timeout_s); window: frames in flight to the parent. "
          "checkpoint_dir: a checkpoint at every round boundary, resumed from by join(); "
          "checkpoint_budget: over 64 MiB, whole ones take at most this share of the time, "
          "replica images between them. "
          "page_out_from_bytes: from this model size (fp32 bytes; None: 1 GiB, -1: never) "
          "the anchor lives in a file the kernel pages and the update's frames on disk. "
          "costs_path: one JSON line of costs per round (training seconds x devices of "
          "device_kind 'cpu' or 'gpu', bytes), billed by `fedwan costs`. metrics: 'host:port' "
          "to serve Prometheus metrics and the status at ('' = the topology's); "
          "metrics_token_file: a file (owner-only) holding the bearer token the endpoint then "
          "requires. Raises "
          "fedwan.ConfigError (bad options, no credentials, a bundle of another node) or "
          "fedwan.CryptoError (the site's certificate is expired or revoked).");
}

// join, the blocking rounds, checkpoints, leaving, stopping and closing.
void def_lifecycle(py::class_<PySiteCore>& cls) {
  using namespace pybind11::literals;
  cls.def("join", &PySiteCore::join,
          "Connects and joins; afterwards params hold the federation's model. Ctrl-C while "
          "it waits stops the site (as stop() does) and raises KeyboardInterrupt within a "
          "second. Returns {round, finished, bytes_sent, bytes_received, bytes_resent, resynced}. "
          "Raises "
          "fedwan.TimeoutError or fedwan.ProtocolError (refused by the parent), "
          "fedwan.StoppedError after stop().")
      .def("sync", &PySiteCore::sync,
           "Ends the round: sends the pseudo-gradient, waits for the next model and loads it "
           "into params; Ctrl-C stops the site and raises KeyboardInterrupt within a second "
           "(checkpoint() then keeps the round's start). Returns {round, finished, "
           "bytes_sent, bytes_received, bytes_resent, replica_bytes (its checkpoint replica "
           "sent to the parent since the last sync), resynced}. Raises "
           "fedwan.TimeoutError, fedwan.ProtocolError, fedwan.TransportError, or "
           "fedwan.StoppedError after stop(); fedwan.Error while a begin_sync() is pending.")
      .def("service", &PySiteCore::service,
           "Keeps the link alive between syncs (heartbeats, reconnects); call it between inner "
           "steps. Returns the same dict as sync(); resynced=True means params now hold the "
           "parent's model and the round restarts. While a sync is pending it reports only the "
           "round that ended (finish_sync() reports a resync or the end).")
      .def("checkpoint", &PySiteCore::checkpoint,
           "Writes a checkpoint of the current state to checkpoint_dir now (on SIGTERM). "
           "After a sync() that raised, it keeps the checkpoint taken when the round began "
           "(params may hold part of the next round). Raises fedwan.Error while a "
           "begin_sync() is pending (finish_sync() checkpoints at the merge).")
      .def("leave", &PySiteCore::leave, "timeout_s"_a = 5.0,
           "Leaves the federation gracefully between syncs: the parent stops waiting for this "
           "site at once and counts it out of the quorum. Returns whether the parent was told "
           "within timeout_s. Afterwards join() and sync() raise fedwan.Error; a new SiteCore "
           "of this node joins again from the next round boundary.")
      .def("stop", &PySiteCore::stop,
           "Makes a join() or sync() in progress in another thread, and every later one, "
           "raise fedwan.StoppedError within about 100 ms. Any thread; the GIL is not needed "
           "by the blocked call.")
      .def("close", &PySiteCore::close,
           "Releases the link (sockets, TLS state, audit log) now. Idempotent; later "
           "join/sync/service/checkpoint raise fedwan.Error; a pending sync is stopped. "
           "Raises fedwan.Error while a join(), sync() or finish_sync() is in progress in "
           "another thread (stop() it first).")
      .def(
          "__enter__", [](py::object self) { return self; },
          "Returns the SiteCore itself; leaving the block closes it.")
      .def(
          "__exit__",
          [](PySiteCore& self, const py::handle&, const py::handle&, const py::handle&) {
            self.close();
            return false;
          },
          "Closes the SiteCore; the exception (if any) propagates.");
}

void bind_site_core(py::module_& m) {
  py::class_<PySiteCore> cls(m, "SiteCore", kSiteCoreDoc);
  def_overlapped_rounds(cls);
  def_constructor(cls);
  def_lifecycle(cls);
  def_properties(cls);
}

}  // namespace fedwan::python
