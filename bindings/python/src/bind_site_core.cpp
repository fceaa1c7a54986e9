// SiteCore over a caller-owned float32 NumPy array. The wrapper keeps the
// array alive for as long as the SiteCore writes into it, and releases the
// GIL while join() and sync() block on the network.
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
  d["resynced"] = r.resynced;
  return d;
}

// Thread safety: one Python thread at a time may be in join()/sync(); a
// second gets fedwan.Error at once rather than waiting (waiting while
// holding the GIL could deadlock with the first thread re-taking it). The
// read-only properties never block.
class PySiteCore {
 public:
  PySiteCore(const TopologyArg& topology, const std::string& node_id, const Float32ArrayArg& params,
             double join_timeout_s, std::optional<double> round_timeout_s, int window,
             const OptionalPathArg& credentials, bool insecure_plaintext, const std::string& cipher,
             const OptionalPathArg& audit_log, const OptionalPathArg& checkpoint_dir)
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
    core_ = std::make_unique<SiteCore>(std::move(opt), static_cast<float*>(params_.mutable_data()),
                                       static_cast<size_t>(params_.size()));
    inner_steps_ = core_->inner_steps();
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
  void checkpoint() {
    run_locked("checkpoint", [this] {
      core_->checkpoint();
      SyncResult r;
      r.round = core_->round();
      r.finished = core_->finished();
      return r;
    });
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
      throw Error("SiteCore.close(): a join() or sync() of this site is in progress; "
                  "call stop() first (it raises fedwan.StoppedError there), then close()");
    }
    std::unique_ptr<SiteCore> core;
    {
      std::lock_guard<std::mutex> lock(core_mu_);
      core = std::move(core_);
    }
    py::gil_scoped_release nogil;
    core.reset();
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(core_mu_);
    return core_ == nullptr;
  }

  uint64_t round() const { return round_.load(); }
  bool finished() const { return finished_.load(); }
  uint64_t inner_steps() const { return inner_steps_; }
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
                  "(): a join() or sync() of this site is "
                  "in progress (another thread, or this one under a signal handler); drive a "
                  "site from one thread, and from a signal handler call stop() (the call in "
                  "progress raises fedwan.StoppedError, then checkpoint())");
    }
    require_open(what);
    struct TakeAlarms {  // after the call, however it ends
      PySiteCore& self;
      ~TakeAlarms() {
        std::vector<std::string> a = self.core_->alarms();
        std::lock_guard<std::mutex> lock(self.alarms_mu_);
        self.alarms_ = std::move(a);
      }
    };
    SyncResult r;
    if (interruptible) {
      TakeAlarms take{*this};
      r = run_interruptible<SyncResult>(call, [this] { core_->stop(); });
    } else {
      py::gil_scoped_release nogil;
      TakeAlarms take{*this};
      r = call();
    }
    round_.store(r.round);
    finished_.store(r.finished);
    return sync_dict(r);
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
  std::mutex busy_;
  std::atomic<uint64_t> round_{0};
  std::atomic<bool> finished_{false};
  mutable std::mutex alarms_mu_;
  std::vector<std::string> alarms_;  // as of the last join/sync/service
};

}  // namespace

void bind_site_core(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<PySiteCore>(m, "SiteCore",
                         R"(The site side of the federation over a float32 NumPy array.

`params` must be a C-contiguous, writeable float32 ndarray; it is used in place
(no copy) and kept alive by this object. join() and sync() write the federation's
model into it. For a torch model use fedwan.Site, which builds such an array over
the model's parameters.

Links are mutual TLS 1.3 with AEAD frames: `credentials` is this site's bundle
directory (fedwan.credentials_path(dir, node_id) after
fedwan.provision_credentials). Without it the site needs insecure_plaintext=True,
which secure parents refuse; neither raises fedwan.ConfigError. `cipher` is
"aes-256-gcm" or "chacha20-poly1305"; `audit_log` a path for a hash-chained JSONL
log of handshakes and updates sent.)")
      .def(py::init<const TopologyArg&, const std::string&, const Float32ArrayArg&, double,
                    std::optional<double>, int, const OptionalPathArg&, bool, const std::string&,
                    const OptionalPathArg&, const OptionalPathArg&>(),
           "topology"_a, "node_id"_a, "params"_a, "join_timeout_s"_a = 300.0, py::kw_only(),
           "round_timeout_s"_a = py::none(), "window"_a = 8, "credentials"_a = py::none(),
           "insecure_plaintext"_a = false, "cipher"_a = "aes-256-gcm", "audit_log"_a = py::none(),
           "checkpoint_dir"_a = py::none(),
           "params: the C-contiguous float32 array the site trains (used in place). "
           "join_timeout_s bounds join(); round_timeout_s bounds each sync() (None: the "
           "topology's federation.round_timeout_s); window: frames in flight to the parent. "
           "checkpoint_dir: a checkpoint at every round boundary, resumed from by join(). Raises "
           "fedwan.ConfigError (bad options, no credentials, a bundle of another node) or "
           "fedwan.CryptoError (the site's certificate is expired or revoked).")
      .def("join", &PySiteCore::join,
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
           "bytes_sent, bytes_received, bytes_resent, resynced}. Raises "
           "fedwan.TimeoutError, fedwan.ProtocolError, fedwan.TransportError, or "
           "fedwan.StoppedError after stop().")
      .def("service", &PySiteCore::service,
           "Keeps the link alive between syncs (heartbeats, reconnects); call it between "
           "inner steps. Returns the same dict as sync(); resynced=True means params now "
           "hold the parent's model and the round restarts.")
      .def("checkpoint", &PySiteCore::checkpoint,
           "Writes a checkpoint of the current state to checkpoint_dir now (on SIGTERM). "
           "After a sync() that raised, it keeps the checkpoint taken when the round began "
           "(params may hold part of the next round).")
      .def("stop", &PySiteCore::stop,
           "Makes a join() or sync() in progress in another thread, and every later one, "
           "raise fedwan.StoppedError within about 100 ms. Any thread; the GIL is not needed "
           "by the blocked call.")
      .def("close", &PySiteCore::close,
           "Releases the link (sockets, TLS state, audit log) now. Idempotent; later "
           "join/sync/service/checkpoint raise fedwan.Error. Raises fedwan.Error while a "
           "join() or sync() is in progress in another thread (stop() it first).")
      .def(
          "__enter__", [](py::object self) { return self; },
          "Returns the SiteCore itself; leaving the block closes it.")
      .def(
          "__exit__",
          [](PySiteCore& self, const py::handle&, const py::handle&, const py::handle&) {
            self.close();
            return false;
          },
          "Closes the SiteCore; the exception (if any) propagates.")
      .def_property_readonly("closed", &PySiteCore::closed, "True after close().")
      .def_property_readonly("round", &PySiteCore::round, "The round the site trains in.")
      .def_property_readonly("finished", &PySiteCore::finished,
                             "True once the federation is done; params hold the final model.")
      .def_property_readonly("inner_steps", &PySiteCore::inner_steps,
                             "H: local steps per round, from the topology.")
      .def_property_readonly("params", &PySiteCore::params, "The array the site works on.")
      .def_property_readonly("alarms", &PySiteCore::alarms,
                             "Conditions an operator must act on that the site rode out (its "
                             "audit log could not be written, the CRL is expiring or expired, "
                             "...), as 'kind: message' strings, as of the last call.")
      .def_property_readonly("initial_digest", &PySiteCore::initial_digest,
                             "SHA-256 of params when the SiteCore was built.");
}

}  // namespace fedwan::python
