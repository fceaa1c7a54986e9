// The _fedwan extension: the torch-free fedwan core for Python. NumPy arrays
// cross the boundary as views, so the module links neither LibTorch nor
// libtorch_python and works with any torch the interpreter has. The
// user-facing package (fedwan/__init__.py) re-exports all of it. This file
// also holds what every node shares: the error classes, and the security
// options and credential provisioning of fedwan/security.hpp.
#include "bindings.hpp"
#include "fedwan/config.h"
#include "fedwan/error.hpp"
#include "fedwan/security.hpp"

namespace fedwan::python {

void bind_errors(py::module_& m) {
  // Translators are tried newest first, so the base class is registered
  // before its subclasses and each C++ type maps to its own Python class.
  auto& error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<ConfigError>(m, "ConfigError", error);
  py::register_exception<ProtocolError>(m, "ProtocolError", error);
  py::register_exception<CryptoError>(m, "CryptoError", error);
  py::register_exception<TransportError>(m, "TransportError", error);
  py::register_exception<StoppedError>(m, "StoppedError", error);
  // Also a builtins.TimeoutError, so `except TimeoutError` works unchanged.
  py::register_exception<TimeoutError>(m, "TimeoutError",
                                       py::make_tuple(error, py::handle(PyExc_TimeoutError)));
}

std::string path_from(const py::handle& obj, const std::string& what) {
  if (py::isinstance<py::str>(obj) || py::hasattr(obj, "__fspath__")) {
    const py::object path = py::module_::import("os").attr("fspath")(obj);
    if (py::isinstance<py::str>(path)) return path.cast<std::string>();
  }
  throw ConfigError(what + " must be a str or os.PathLike path, not " +
                    py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
}

SecurityOptions security_options(const py::handle& credentials, bool insecure_plaintext,
                                 const std::string& cipher, const py::handle& audit_log) {
  SecurityOptions s;
  if (!credentials.is_none()) s.credentials_dir = path_from(credentials, "credentials");
  s.insecure_plaintext = insecure_plaintext;
  s.cipher = cipher;
  if (!audit_log.is_none()) s.audit_log = path_from(audit_log, "audit_log");
  return s;
}

void bind_security(py::module_& m) {
  using namespace pybind11::literals;
  m.def(
      "provision_credentials",
      [](const py::handle& topology, const py::handle& directory, int validity_days,
         bool overwrite) {
        const Topology topo = topology_from(topology);
        const std::string dir = path_from(directory, "directory");
        // Key generation and signing take a while; other threads run meanwhile.
        py::gil_scoped_release nogil;
        provision_credentials(topo, dir, validity_days, overwrite);
      },
      "topology"_a, "directory"_a, "validity_days"_a = 365, "overwrite"_a = false,
      R"(Provisions a federation's identities into `directory`, as `fedwan certs init` does.

Writes a federation CA (directory/ca; keep its key offline), one bundle per node
of the topology (directory/<node-id>: ca.pem, cert.pem, key.pem, crl.pem) and an
empty revocation list. `topology` is a fedwan.Topology or the path of a topology
file; certificates are valid for `validity_days` days. Raises fedwan.ConfigError
when directory/ca already exists and `overwrite` is False, or validity_days < 1.
Give each node its own bundle: credentials=fedwan.credentials_path(directory, id).)");
  m.def(
      "credentials_path",
      [](const py::handle& directory, const std::string& node_id) {
        return credentials_in(path_from(directory, "directory"), node_id).credentials_dir;
      },
      "directory"_a, "node_id"_a,
      R"(The bundle directory of node `node_id` in a federation provisioned into
`directory` by provision_credentials: the value for the node's `credentials`.
Only builds the path; the node checks the bundle when it is built.)");
}

}  // namespace fedwan::python

PYBIND11_MODULE(_fedwan, m) {
  namespace fp = fedwan::python;
  m.doc() = "fedwan core bindings (codecs, topology, security, site and aggregator runtime)";
  m.attr("__version__") = FEDWAN_VERSION_STRING;
  fp::bind_errors(m);
  fp::bind_codec(m);
  fp::bind_topology(m);
  fp::bind_security(m);
  fp::bind_site_core(m);
  fp::bind_aggregator(m);
  fp::bind_synthetic(m);
}
