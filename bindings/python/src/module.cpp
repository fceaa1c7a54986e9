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
#include "typed_args.hpp"

namespace fedwan::python {

void bind_errors(py::module_& m) {
  // Translators are tried newest first, so the base class is registered
  // before its subclasses and each C++ type maps to its own Python class.
  // The Python exception's str() is the C++ what(), unchanged.
  auto& error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  error.attr("__doc__") =
      R"(Base class of every fedwan error (C++ fedwan::Error); a RuntimeError.

Every failure at fedwan's API boundary raises it or one of its subclasses, whose
message (str(e), the C++ what()) says what was wrong and what to do; a subclass
says which kind of failure it was. Raised as itself for a call out of order (sync()
before join(), a closed SiteCore, a second Aggregator.run(), a call while another
thread's join() or sync() is in progress) and for a non-finite value given to a
codec. Expected outcomes (a round not over yet, a duplicate) are return values,
never errors.)";
  auto& config = py::register_exception<ConfigError>(m, "ConfigError", error);
  config.attr("__doc__") =
      R"(Bad configuration or user input (C++ fedwan::ConfigError), found before
anything is sent: an invalid topology file or text, a node id that is not in
the topology or has the wrong role, options out of range, missing or mismatched
credentials, an array of the wrong dtype, layout or size, an unknown codec.
Fix the input and build the object again.)";
  auto& protocol = py::register_exception<ProtocolError>(m, "ProtocolError", error);
  protocol.attr("__doc__") =
      R"(A peer broke or refused the wire protocol (C++ fedwan::ProtocolError):
a malformed frame, a wrong element count, bytes that are not a valid encoding
(fedwan.decode), or a parent that refused this node (say, plaintext towards a
node that requires mutual TLS). Usually two nodes that disagree on the topology,
the model or the security mode.)";
  auto& crypto = py::register_exception<CryptoError>(m, "CryptoError", error);
  crypto.attr("__doc__") =
      R"(An authentication, encryption or integrity failure (C++ fedwan::CryptoError):
a certificate that is expired, revoked or not issued by the federation's CA, a
revocation list not signed by it, a frame that fails authentication, an audit log
whose hash chain does not verify. Re-provision or fix the node's credential bundle.)";
  auto& transport = py::register_exception<TransportError>(m, "TransportError", error);
  transport.attr("__doc__") =
      R"(A socket, connection or file I/O failure (C++ fedwan::TransportError): an
endpoint that cannot be bound (in use, or the directory of an ipc:// socket does
not exist), a send that failed, a checkpoint that cannot be read or written.)";
  auto& stopped = py::register_exception<StoppedError>(m, "StoppedError", error);
  stopped.attr("__doc__") =
      R"(A blocking call returned early because stop() was called (C++
fedwan::StoppedError), from another thread or a signal handler; every later
blocking call of that object raises it at once. Nothing was sent or counted on
the caller's behalf that a restart from the node's last checkpoint would send or
count again.)";
  // Also a builtins.TimeoutError, so `except TimeoutError` works unchanged.
  auto& timeout = py::register_exception<TimeoutError>(
      m, "TimeoutError", py::make_tuple(error, py::handle(PyExc_TimeoutError)));
  timeout.attr("__doc__") =
      R"(A blocking call ran past its timeout (C++ fedwan::TimeoutError): a parent
that does not answer within join_timeout_s, children that do not join, a round
that does not complete within the round timeout. The message names the peer or
the missing nodes. Also a builtins.TimeoutError, so `except TimeoutError`
catches it.)";
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
      [](const TopologyArg& topology, const PathArg& directory, int validity_days, bool overwrite) {
        const Topology topo = topology_from(topology.obj);
        const std::string dir = path_from(directory.obj, "directory");
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
      [](const PathArg& directory, const std::string& node_id) {
        return credentials_in(path_from(directory.obj, "directory"), node_id).credentials_dir;
      },
      "directory"_a, "node_id"_a,
      R"(The bundle directory of node `node_id` in a federation provisioned into
`directory` by provision_credentials: the value for the node's `credentials`.
Only builds the path; the node checks the bundle when it is built.)");
}

}  // namespace fedwan::python

PYBIND11_MODULE(_fedwan, m) {
  namespace fp = fedwan::python;
  m.doc() = R"(The compiled core of fedwan (torch-free), re-exported by the `fedwan` package.

Codecs (encode, decode, validate, encoded_size, codec_names), the federation
topology (Topology, NodeSpec, FederationSpec, OuterOptimizerSpec), credential
provisioning (provision_credentials, credentials_path), the two node runtimes
(SiteCore over a float32 NumPy array, Aggregator for the root and regions), the
deterministic synthetic workload of the tests and benchmarks, the privacy
accountant (PrivacyAccountant, privacy_epsilon, noise_multiplier_for,
privacy_rounds_within), and the error
classes, which map the C++ fedwan::Error hierarchy one to one (same names, same
messages). Arrays cross the boundary as NumPy views; blocking calls release the
GIL. Import `fedwan` rather than this module.)";
  m.attr("__version__") = FEDWAN_VERSION_STRING;
  fp::bind_errors(m);
  fp::bind_codec(m);
  fp::bind_topology(m);
  fp::bind_security(m);
  fp::bind_site_core(m);
  fp::bind_aggregator(m);
  fp::bind_synthetic(m);
  fp::bind_privacy(m);
}
