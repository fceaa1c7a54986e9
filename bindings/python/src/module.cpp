// The _fedwan extension: the torch-free fedwan core for Python. NumPy arrays
// cross the boundary as views, so the module links neither LibTorch nor
// libtorch_python and works with any torch the interpreter has. The
// user-facing package (fedwan/__init__.py) re-exports all of it.
#include "bindings.hpp"
#include "fedwan/config.h"
#include "fedwan/error.hpp"

namespace fedwan::python {

void bind_errors(py::module_& m) {
  // Translators are tried newest first, so the base class is registered
  // before its subclasses and each C++ type maps to its own Python class.
  auto& error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<ConfigError>(m, "ConfigError", error);
  py::register_exception<ProtocolError>(m, "ProtocolError", error);
  py::register_exception<CryptoError>(m, "CryptoError", error);
  py::register_exception<TransportError>(m, "TransportError", error);
  // Also a builtins.TimeoutError, so `except TimeoutError` works unchanged.
  py::register_exception<TimeoutError>(m, "TimeoutError",
                                       py::make_tuple(error, py::handle(PyExc_TimeoutError)));
}

}  // namespace fedwan::python

PYBIND11_MODULE(_fedwan, m) {
  namespace fp = fedwan::python;
  m.doc() = "fedwan core bindings (codecs, topology, site and aggregator runtime)";
  m.attr("__version__") = FEDWAN_VERSION_STRING;
  fp::bind_errors(m);
  fp::bind_codec(m);
  fp::bind_topology(m);
  fp::bind_site_core(m);
  fp::bind_aggregator(m);
  fp::bind_synthetic(m);
}
