// Shared declarations of the _fedwan extension: one bind_* function per
// public area, and the checks that turn Python objects into C++ views.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstddef>
#include <string>

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

}  // namespace fedwan::python
