// fedwan.SiteCore: the Python class over PySiteCore (py_site_core.hpp),
// its docstrings and methods.
#include "py_site_core.hpp"

namespace fedwan::python {

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
