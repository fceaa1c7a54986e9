// Shared declarations of the _fedwan extension: one bind_* function per
// public area, and the checks that turn Python objects into C++ views.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "fedwan/error.hpp"
#include "fedwan/security.hpp"
#include "fedwan/topology.hpp"

namespace fedwan::python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_codec(py::module_& m);
void bind_topology(py::module_& m);
void bind_site_core(py::module_& m);
void bind_aggregator(py::module_& m);
void bind_synthetic(py::module_& m);
void bind_privacy(py::module_& m);
void bind_security(py::module_& m);

// The float32 NumPy array behind `obj`, used in place (no copy). Throws
// ConfigError naming `what` unless obj is a C-contiguous float32 ndarray,
// writeable when `writable`, with at least one element when `non_empty`.
py::array float32_buffer(const py::handle& obj, const std::string& what, bool writable,
                         bool non_empty);

// A C-contiguous float32 array with the values of `obj` (a copy only when
// obj is a float32 array of another layout). Other dtypes throw ConfigError:
// a silent cast from float64 would hide a precision loss.
py::array_t<float, py::array::c_style> float32_values(const py::handle& obj,
                                                      const std::string& what);

// A new NumPy array holding a copy of p[0, n).
py::array_t<float> copy_to_numpy(const float* p, size_t n);

// A fedwan.Topology, or a path (str or os.PathLike) to load one from.
Topology topology_from(const py::handle& obj);

// A filesystem path from a str or os.PathLike; throws ConfigError naming
// `what` for anything else (bytes paths included).
std::string path_from(const py::handle& obj, const std::string& what);

// The SecurityOptions behind the keyword arguments SiteCore and Aggregator
// share. `credentials` and `audit_log` are None or paths; the core checks
// the combination and the cipher name when the node is built.
SecurityOptions security_options(const py::handle& credentials, bool insecure_plaintext,
                                 const std::string& cipher, const py::handle& audit_log);

// Seconds from Python to milliseconds; throws ConfigError naming `what`
// unless finite and > 0.
std::chrono::milliseconds seconds_to_ms(double seconds, const std::string& what);

// The keyword arguments SiteCore and Aggregator take alike, checked and set
// on either's options (SiteOptions, AggregatorOptions): the timeouts, the
// window, security and the checkpoint directory. `credentials`,
// `audit_log` and `checkpoint_dir` are None or paths.
template <class Options>
void set_node_options(Options& opt, double join_timeout_s, std::optional<double> round_timeout_s,
                      int window, const py::handle& credentials, bool insecure_plaintext,
                      const std::string& cipher, const py::handle& audit_log,
                      const py::handle& checkpoint_dir) {
  opt.join_timeout = seconds_to_ms(join_timeout_s, "join_timeout_s");
  if (round_timeout_s) opt.round_timeout = seconds_to_ms(*round_timeout_s, "round_timeout_s");
  if (window < 1) throw ConfigError("window must be >= 1, got " + std::to_string(window));
  opt.window = window;
  opt.security = security_options(credentials, insecure_plaintext, cipher, audit_log);
  if (!checkpoint_dir.is_none()) opt.checkpoint_dir = path_from(checkpoint_dir, "checkpoint_dir");
}

// A blocking C++ call that Ctrl-C can interrupt. run() runs `call` on a
// worker thread while the calling thread waits with the GIL released and
// runs Python's signal handlers every 100 ms. When one raises (Ctrl-C's
// KeyboardInterrupt), `stop` is called, the worker is waited for, and the
// handler's exception is raised, whatever `call` ended with. Otherwise run()
// returns what `call` returned or throws what it threw.
//
// `call` must not touch Python itself: what must run Python (callbacks)
// goes through on_caller(), which runs it on the thread that called run(),
// with the GIL, so callbacks keep the caller's thread.
class Interruptible {
 public:
  // Thrown by on_caller() once the call was interrupted: the callback did
  // not run.
  struct Interrupted {};

  template <class R>
  R run(std::function<R()> call, const std::function<void()>& stop) {
    std::packaged_task<R()> task([this, &call]() -> R {
      struct Finish {  // however `call` ends
        Interruptible& self;
        ~Finish() {
          std::lock_guard<std::mutex> lock(self.mu_);
          self.finished_ = true;
          self.cv_.notify_all();
        }
      } finish{*this};
      return call();
    });
    std::future<R> done = task.get_future();
    std::thread worker(std::move(task));
    std::optional<py::error_already_set> interrupted;
    for (;;) {
      const std::function<void()>* job = nullptr;
      bool finished = false;
      {
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(100),
                     [&] { return finished_ || job_ != nullptr; });
        job = job_;
        finished = finished_;
      }
      if (job != nullptr) {
        std::exception_ptr error;
        if (interrupted) {
          error = std::make_exception_ptr(Interrupted{});
        } else {
          try {
            (*job)();
          } catch (...) {
            error = std::current_exception();
          }
        }
        std::lock_guard<std::mutex> lock(mu_);
        job_ = nullptr;
        job_error_ = error;
        job_done_ = true;
        cv_.notify_all();
        continue;
      }
      if (finished) break;
      if (!interrupted && PyErr_CheckSignals() != 0) {
        interrupted.emplace();  // takes the handler's exception off the thread
        stop();
      }
    }
    {
      py::gil_scoped_release nogil;
      worker.join();
    }
    if (interrupted) throw *interrupted;
    return done.get();
  }

  // From `call`'s thread: runs `f` on run()'s thread (GIL held) and returns
  // when it has run; rethrows what `f` threw, or Interrupted.
  void on_caller(const std::function<void()>& f) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &f;
    job_done_ = false;
    cv_.notify_all();
    cv_.wait(lock, [&] { return job_done_; });
    std::exception_ptr error = std::move(job_error_);
    job_error_ = nullptr;
    if (error) std::rethrow_exception(error);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  const std::function<void()>* job_ = nullptr;
  bool job_done_ = false;
  std::exception_ptr job_error_;
};

// Interruptible::run for a call that needs no callbacks.
template <class R>
R run_interruptible(std::function<R()> call, const std::function<void()>& stop) {
  Interruptible i;
  return i.run<R>(std::move(call), stop);
}

}  // namespace fedwan::python
