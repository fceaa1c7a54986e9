#include <cmath>
#include <cstring>

#include "bindings.hpp"
#include "fedwan/error.hpp"

namespace fedwan::python {

namespace {

std::string type_name(const py::handle& obj) {
  return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

std::string dtype_name(const py::array& arr) { return py::str(arr.dtype()).cast<std::string>(); }

}  // namespace

py::array float32_buffer(const py::handle& obj, const std::string& what, bool writable,
                         bool non_empty) {
  if (!py::isinstance<py::array>(obj)) {
    throw ConfigError(what + " must be a numpy.ndarray of float32, not " + type_name(obj) +
                      " (for a torch tensor pass tensor.detach().numpy())");
  }
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (!py::isinstance<py::array_t<float>>(obj)) {
    throw ConfigError(what + " must have dtype float32, not " + dtype_name(arr) +
                      " (convert with .astype(numpy.float32) and keep that array)");
  }
  if (!(arr.flags() & py::array::c_style)) {
    throw ConfigError(what + " must be C-contiguous; it is a strided view (use "
                             "numpy.ascontiguousarray and keep that array)");
  }
  if (writable && !arr.writeable()) {
    throw ConfigError(what + " is read-only; fedwan writes the federation's model into it");
  }
  if (non_empty && arr.size() == 0) throw ConfigError(what + " is empty");
  return arr;
}

py::array_t<float, py::array::c_style> float32_values(const py::handle& obj,
                                                      const std::string& what) {
  if (!py::isinstance<py::array>(obj)) {
    throw ConfigError(what + " must be a numpy.ndarray of float32, not " + type_name(obj));
  }
  if (!py::isinstance<py::array_t<float>>(obj)) {
    throw ConfigError(what + " must have dtype float32, not " +
                      dtype_name(py::reinterpret_borrow<py::array>(obj)) +
                      " (convert with .astype(numpy.float32))");
  }
  return py::array_t<float, py::array::c_style>::ensure(obj);
}

py::array_t<float> copy_to_numpy(const float* p, size_t n) {
  py::array_t<float> out(static_cast<py::ssize_t>(n));
  if (n > 0) std::memcpy(out.mutable_data(), p, n * sizeof(float));
  return out;
}

Topology topology_from(const py::handle& obj) {
  if (py::isinstance<Topology>(obj)) return obj.cast<const Topology&>();
  if (py::isinstance<py::str>(obj) || py::hasattr(obj, "__fspath__")) {
    const py::object path = py::module_::import("os").attr("fspath")(obj);
    if (!py::isinstance<py::str>(path)) {
      throw ConfigError("a topology path must be a str path, not bytes");
    }
    return Topology::load(path.cast<std::string>());
  }
  throw ConfigError("topology must be a fedwan.Topology or the path of a topology file, not " +
                    type_name(obj));
}

std::chrono::milliseconds seconds_to_ms(double seconds, const std::string& what) {
  // Upper bound keeps the conversion to milliseconds far from overflow.
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > 1e9) {
    throw ConfigError(what + " must be a finite number of seconds > 0, got " +
                      std::to_string(seconds));
  }
  const auto ms = static_cast<int64_t>(std::ceil(seconds * 1000.0));
  return std::chrono::milliseconds(ms);
}

}  // namespace fedwan::python
