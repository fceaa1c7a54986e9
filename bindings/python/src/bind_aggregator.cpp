// Aggregator (root or region) for Python. run() releases the GIL for the
// whole federation (the aggregator runs on a worker thread, so Ctrl-C is
// seen); the callbacks run on run()'s own thread with the GIL. An exception
// raised by a callback stops the aggregator and is re-raised from run().
#include <pybind11/stl.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "bindings.hpp"
#include "fedwan/aggregator.hpp"
#include "fedwan/error.hpp"
#include "typed_args.hpp"

namespace fedwan::python {
namespace {

// Unwinds Aggregator::run() after a callback failed. Not a std::exception,
// so no handler inside the core can mistake it for a runtime error.
struct CallbackFailed {};

py::dict report_dict(const RoundReport& r) {
  py::dict d;
  d["round"] = r.round;
  d["seconds"] = r.seconds;
  d["wan_bytes"] = r.wan_bytes;
  d["fp32_bytes"] = r.fp32_bytes;
  d["frames"] = r.frames;
  d["weight"] = r.weight;
  py::dict replicas;
  for (const auto& [child, bytes] : r.replica_bytes) replicas[py::str(child)] = bytes;
  d["replica_bytes"] = replicas;
  return d;
}

void require_callable(const py::object& f, const char* what) {
  if (!f.is_none() && !PyCallable_Check(f.ptr())) {
    throw ConfigError(std::string(what) + " must be callable or None");
  }
}

class PyAggregator {
 public:
  PyAggregator(const TopologyArg& topology, const std::string& node_id,
               const OptionalFloat32ArrayArg& initial_model, const RoundCallbackArg& on_round,
               const ModelCallbackArg& on_model, double join_timeout_s,
               std::optional<double> round_timeout_s, int window,
               const OptionalPathArg& credentials, bool insecure_plaintext,
               const std::string& cipher, const OptionalPathArg& audit_log,
               const OptionalPathArg& checkpoint_dir, bool standby,
               std::optional<int64_t> spill_from_bytes, bool pace_uploads,
               std::optional<int64_t> replica_max_bytes)
      : on_round_(on_round.obj), on_model_(on_model.obj) {
    require_callable(on_round_, "on_round");
    require_callable(on_model_, "on_model");
    AggregatorOptions opt;
    opt.topology = topology_from(topology.obj);
    // Given as a file: later versions written over it are adopted while it runs.
    if (!py::isinstance<Topology>(topology.obj)) {
      opt.topology_file =
          py::module_::import("os").attr("fspath")(topology.obj).cast<std::string>();
    }
    opt.node_id = node_id;
    if (!initial_model.obj.is_none()) {
      const auto values = float32_values(initial_model.obj, "initial_model");
      opt.initial_model.assign(values.data(), values.data() + values.size());
    }
    set_node_options(opt, join_timeout_s, round_timeout_s, window, credentials.obj,
                     insecure_plaintext, cipher, audit_log.obj, checkpoint_dir.obj);
    opt.standby = standby;
    if (spill_from_bytes) {
      if (*spill_from_bytes < 0) {
        throw ConfigError("spill_from_bytes must be >= 0 (0: always), got " +
                          std::to_string(*spill_from_bytes));
      }
      opt.spill_from_bytes = static_cast<size_t>(*spill_from_bytes);
    }
    opt.pace_uploads = pace_uploads;
    if (replica_max_bytes) {
      if (*replica_max_bytes <= 0) {
        throw ConfigError("replica_max_bytes must be > 0 (None: 16 fp32 models plus 64 MiB), got " +
                          std::to_string(*replica_max_bytes));
      }
      opt.replica_max_bytes = static_cast<uint64_t>(*replica_max_bytes);
    }
    // The lambdas hold `this`, never a Python object: the core may copy or
    // destroy them without the GIL.
    if (!on_round_.is_none()) {
      opt.on_round = [this](const RoundReport& r) {
        call_python([&] { on_round_(report_dict(r)); });
      };
    }
    if (!on_model_.is_none()) {
      opt.on_model = [this](uint64_t round, const std::vector<float>& global) {
        call_python([&] { on_model_(round, copy_to_numpy(global.data(), global.size())); });
      };
    }
    agg_ = std::make_unique<Aggregator>(std::move(opt));
  }

  // Closing the sockets may wait up to their linger time (seconds) for
  // frames children never took; other Python threads run meanwhile.
  ~PyAggregator() { close(); }
  PyAggregator(const PyAggregator&) = delete;
  PyAggregator& operator=(const PyAggregator&) = delete;

  py::dict run() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!agg_) throw Error("Aggregator.run() after close(); build a new Aggregator");
      if (started_) {
        throw Error("Aggregator.run() was already called; build a new Aggregator per federation");
      }
      started_ = true;
      running_ = true;
      run_thread_ = std::this_thread::get_id();
    }
    // close() on another thread waits for this run to end before it frees
    // the aggregator.
    struct Ended {
      PyAggregator* self;
      ~Ended() {
        std::lock_guard<std::mutex> lock(self->mutex_);
        self->running_ = false;
        self->ended_.notify_all();
      }
    } ended{this};
    return summary_dict(run_core());
  }

  // Any thread; run() then raises fedwan.StoppedError within ~100 ms.
  // After close(): nothing to stop.
  void stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (agg_) agg_->stop();
  }

  // Stops a run() in progress on another thread and waits for it to end,
  // then releases the node's endpoint and sockets. Idempotent; any thread.
  void close() {
    std::unique_ptr<Aggregator> agg;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (running_ && run_thread_ == std::this_thread::get_id()) {
        throw Error("Aggregator.close() from a callback of its own run(); call stop() there");
      }
    }
    {
      py::gil_scoped_release nogil;  // run()'s callbacks need the GIL to finish
      std::unique_lock<std::mutex> lock(mutex_);
      if (running_ && agg_) agg_->stop();
      ended_.wait(lock, [this] { return !running_; });
      agg = std::move(agg_);
    }
    py::gil_scoped_release nogil;
    agg.reset();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !agg_;
  }

 private:
  AggregatorSummary run_core() {
    AggregatorSummary s;
    bool callback_failed = false;
    // Ctrl-C stops the aggregator (run_interruptible) and raises
    // KeyboardInterrupt; its last round boundary stays checkpointed.
    s = interruptible_.run<AggregatorSummary>(
        [&]() -> AggregatorSummary {
          try {
            return agg_->run();
          } catch (const CallbackFailed&) {
            callback_failed = true;
            return {};
          }
        },
        [this] { agg_->stop(); });
    if (callback_failed && callback_error_) {
      std::exception_ptr e = std::move(callback_error_);
      callback_error_ = nullptr;
      std::rethrow_exception(e);
    }
    return s;
  }

  static py::dict summary_dict(const AggregatorSummary& s) {
    py::list reports;
    for (const RoundReport& r : s.reports) reports.append(report_dict(r));
    py::dict d;
    d["rounds"] = s.rounds;
    d["reports"] = reports;
    d["wan_bytes_total"] = s.wan_bytes_total;
    d["fp32_bytes_total"] = s.fp32_bytes_total;
    d["rejected_frames"] = s.rejected_frames;
    d["resent_chunks"] = s.resent_chunks;
    d["resent_bytes"] = s.resent_bytes;
    d["security_mode"] = s.security_mode;
    d["handshake_ms"] = s.handshake_ms;
    d["resumed_from_round"] = s.resumed_from_round;
    d["children_lost"] = s.children_lost;
    d["rejoins"] = s.rejoins;
    d["stale_updates"] = s.stale_updates;
    d["chunks_parked"] = s.chunks_parked;
    d["parked_bytes"] = s.parked_bytes;
    d["refused_copies"] = s.refused_copies;
    d["clipped_copies"] = s.clipped_copies;
    d["privacy_epsilon"] = s.privacy_epsilon;
    d["privacy_clipped"] = s.privacy_clipped;
    d["checkpoints_written"] = s.checkpoints_written;
    d["replicas_stored"] = s.replicas_stored;
    d["replica_bytes"] = s.replica_bytes;
    d["took_over"] = s.took_over;
    d["membership_changes"] = s.membership_changes;
    d["topology_version"] = s.topology_version;
    d["alarms"] = s.alarms;
    d["global_model"] =
        s.global_model.empty()
            ? py::object(py::none())
            : py::object(copy_to_numpy(s.global_model.data(), s.global_model.size()));
    return d;
  }

  // Runs `f` under the GIL on run()'s thread. A failure is kept (to be
  // re-raised by run() once it holds the GIL) and unwinds the core's loop.
  template <class F>
  void call_python(F&& f) {
    try {
      interruptible_.on_caller([&] { f(); });
    } catch (const Interruptible::Interrupted&) {
      throw CallbackFailed{};  // run() raises KeyboardInterrupt
    } catch (...) {
      callback_error_ = std::current_exception();
      throw CallbackFailed{};
    }
  }

  py::object on_round_;
  py::object on_model_;
  std::exception_ptr callback_error_;  // written by run()'s worker, read after it ended
  Interruptible interruptible_;        // run()'s thread runs the callbacks
  mutable std::mutex mutex_;  // guards started_, running_ and agg_ (not the object it points to)
  std::condition_variable ended_;
  bool started_ = false;
  bool running_ = false;
  std::thread::id run_thread_;
  std::unique_ptr<Aggregator> agg_;  // last: destroyed before the callbacks it calls
};

}  // namespace

// Aggregator.run()'s docstring: what the summary holds.
constexpr const char* kRunDoc =
    R"(Serves until the last round is done (blocking, GIL released). Ctrl-C stops it
within a second and raises KeyboardInterrupt (the last round boundary stays
checkpointed). Returns
{rounds, reports: [ {round, seconds, wan_bytes, fp32_bytes, frames, weight, replica_bytes} ],
 wan_bytes_total, fp32_bytes_total, rejected_frames, resent_chunks and resent_bytes
 (a region: aggregate chunks its parent lacked once its progress stalled, sent again),
 security_mode ("mtls/<cipher>"
 or "plaintext"), handshake_ms (list: this node's TLS handshake times, in ms, as each
 link came up), global_model (root: float32 array; region: None), and the fault
 tolerance counters resumed_from_round, children_lost, rejoins, stale_updates,
 chunks_parked and parked_bytes (chunks of the mean that waited on disk for their last
 copies, and the bytes written for them), refused_copies and clipped_copies (children's chunk copies this node refused, a NaN or a
 value, norm or replay over its bounds, or clipped to the norm bound), privacy_epsilon
 (the epsilon the rounds run spent, 0 without federation.privacy), privacy_clipped (sites'
 copies clipped to the privacy bound), checkpoints_written, replicas_stored,
 replica_bytes (children's checkpoints kept, not in the reports' traffic), took_over
 (standby=True: it became the root) and alarms (conditions an operator must act on
 that the node rode out, 'kind: message')}. Raises
fedwan.TimeoutError when children do not join or a round does not complete in time,
fedwan.StoppedError (a fedwan.Error) when stopped.)";

void bind_aggregator(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<PyAggregator>(m, "Aggregator", R"(A root or region aggregator of the topology.

Construction validates the options and binds the node's endpoint (raises
fedwan.ConfigError or fedwan.TransportError). The root needs `initial_model`, a
float32 array (copied); a region given the same one joins without being sent
the model in full. Callbacks run on run()'s thread with the GIL held:
on_round(report: dict) once a round's traffic over the subtree is known, and
(root only) on_model(round: int, global_model: numpy copy). An exception raised
by a callback aborts the federation and propagates out of run().

Links are mutual TLS 1.3 with AEAD frames: `credentials` is this node's bundle
directory (fedwan.credentials_path(dir, node_id) after
fedwan.provision_credentials); children must present certificates of the same
federation CA naming them. Without credentials the node needs
insecure_plaintext=True (and then only plaintext children can join); neither
raises fedwan.ConfigError. `cipher` is "aes-256-gcm" or "chacha20-poly1305";
`audit_log` a path for a hash-chained JSONL log of handshakes, updates and
refusals.)")
      .def(py::init<const TopologyArg&, const std::string&, const OptionalFloat32ArrayArg&,
                    const RoundCallbackArg&, const ModelCallbackArg&, double, std::optional<double>,
                    int, const OptionalPathArg&, bool, const std::string&, const OptionalPathArg&,
                    const OptionalPathArg&, bool, std::optional<int64_t>, bool,
                    std::optional<int64_t>>(),
           "topology"_a, "node_id"_a, "initial_model"_a = py::none(), "on_round"_a = py::none(),
           "on_model"_a = py::none(), "join_timeout_s"_a = 300.0, py::kw_only(),
           "round_timeout_s"_a = py::none(), "window"_a = NodeOptions{}.window,
           "credentials"_a = py::none(), "insecure_plaintext"_a = false, "cipher"_a = "aes-256-gcm",
           "audit_log"_a = py::none(), "checkpoint_dir"_a = py::none(), "standby"_a = false,
           "spill_from_bytes"_a = py::none(), "pace_uploads"_a = true,
           "replica_max_bytes"_a = py::none(),
           R"(Builds node `node_id` (a root or region) of `topology` (a Topology or the
path of a topology file) and binds its endpoint.

`initial_model`: the float32 starting model, copied (required at the root; a
region given the root's joins without the model crossing its uplink). `join_timeout_s`
bounds the wait for every child to join; `round_timeout_s` each round (None: the
topology's federation.round_timeout_s); both in seconds. `window`: frames queued
per child and direction (>= 1). `checkpoint_dir`: write a checkpoint there at
every round boundary and resume from the one found there at start.
`standby=True` (node_id and credentials the root's; needs checkpoint_dir): run as
the root's standby at root.standby_endpoint, keeping the checkpoints the root
streams to it, and take over as root when the root falls silent.
`spill_from_bytes`: for a model of at least this many fp32 bytes the round's
frames kept for sending again, and chunks in flight beyond 12 MiB (4 MiB at a region), wait in an
unnamed file in checkpoint_dir (0: always; None: 64 MiB; docs/operations.md,
"An aggregator's memory"). `pace_uploads`: where that holds, tell each site how far
its update may run ahead of the slowest child's (docs/protocol.md, "Pacing");
False: sites send as fast as their links take it. `replica_max_bytes`: the
largest checkpoint replica a child may send here (with checkpoint_dir); a larger
one is refused before it is written (None: 16 fp32 models plus 64 MiB).
Raises fedwan.ConfigError (bad options, a node that is not an aggregator, missing
or mismatched credentials), fedwan.CryptoError (an unusable certificate or CRL)
or fedwan.TransportError (the endpoint cannot be bound).)")
      .def("run", &PyAggregator::run, kRunDoc)
      .def("stop", &PyAggregator::stop,
           "Makes run() raise fedwan.StoppedError within ~100 ms, also while it is still "
           "fetching its replica on a restart; any thread.")
      .def("close", &PyAggregator::close,
           "Stops a run() in progress (on another thread) and waits for it to end, then "
           "releases the node's endpoint and sockets (waiting up to their linger time for "
           "frames children never took). Idempotent; run() afterwards raises fedwan.Error.")
      .def_property_readonly("closed", &PyAggregator::closed,
                             "Whether close() released the aggregator.")
      .def(
          "__enter__", [](py::object self) { return self; },
          "Returns the Aggregator itself; leaving the block closes it.")
      .def(
          "__exit__",
          [](PyAggregator& self, const py::handle&, const py::handle&, const py::handle&) {
            self.close();
            return false;
          },
          "Closes the aggregator (close()); an exception in the block propagates.");
}

}  // namespace fedwan::python
