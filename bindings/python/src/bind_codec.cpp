// Codecs from Python: encode a float32 array to the bytes that cross the WAN
// (optionally with an error-feedback residual updated in place), validate and
// decode them back. The GIL is released while the codec runs.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "typed_args.hpp"

namespace fedwan::python {
namespace {

// A read-only contiguous view of any bytes-like object (bytes, bytearray,
// memoryview, a uint8 array), released when it goes out of scope.
class ByteView {
 public:
  explicit ByteView(const py::handle& obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      throw ConfigError("encoded data must be a contiguous bytes-like object (bytes, "
                        "bytearray, memoryview), not " +
                        py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
    }
  }
  ~ByteView() { PyBuffer_Release(&view_); }
  ByteView(const ByteView&) = delete;
  ByteView& operator=(const ByteView&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

py::bytes encode(const std::string& name, const Float32ArrayArg& values,
                 const OptionalFloat32ArrayArg& residual) {
  const Codec& codec = codec_by_name(name);
  const auto in = float32_values(values.obj, "values");
  const size_t n = static_cast<size_t>(in.size());
  float* res = nullptr;
  py::array res_arr;
  if (!residual.obj.is_none()) {
    res_arr = float32_buffer(residual.obj, "residual", /*writable=*/true, /*non_empty=*/false);
    if (static_cast<size_t>(res_arr.size()) != n) {
      throw ConfigError("residual has " + std::to_string(res_arr.size()) + " elements, values " +
                        std::to_string(n) +
                        "; keep one residual per stream, the size of what it encodes");
    }
    res = static_cast<float*>(res_arr.mutable_data());
  }
  const size_t bytes = codec.encoded_size(n);
  // Filled in place: the new bytes object is not visible to Python yet.
  auto out = py::reinterpret_steal<py::bytes>(
      PyBytes_FromStringAndSize(nullptr, static_cast<py::ssize_t>(bytes)));
  if (!out) throw py::error_already_set();
  auto* dst = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(out.ptr()));
  {
    py::gil_scoped_release nogil;
    codec.encode(in.data(), n, res, dst);
  }
  return out;
}

bool validate(const std::string& name, const BytesLikeArg& data, size_t n) {
  const Codec& codec = codec_by_name(name);
  const ByteView view(data.obj);
  return codec.validate(view.data(), view.size(), n);
}

py::array_t<float> decode(const std::string& name, const BytesLikeArg& data, size_t n) {
  const Codec& codec = codec_by_name(name);
  const ByteView view(data.obj);
  if (!codec.validate(view.data(), view.size(), n)) {
    throw ProtocolError("not a valid " + name + " encoding of " + std::to_string(n) +
                        " values: " + std::to_string(view.size()) + " bytes, expected " +
                        std::to_string(codec.encoded_size(n)) + " holding finite values");
  }
  py::array_t<float> out(static_cast<py::ssize_t>(n));
  float* dst = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    codec.decode(view.data(), n, dst);
  }
  return out;
}

}  // namespace

void bind_codec(py::module_& m) {
  using namespace pybind11::literals;
  m.def("codec_names", &codec_names,
        R"(Names of the registered codecs (fp32, fp16, bf16, int8, ...), the values a
topology's federation.codec and the `codec` argument of encode() take.)");
  m.def(
      "encoded_size",
      [](const std::string& name, size_t n) { return codec_by_name(name).encoded_size(n); },
      "codec"_a, "n"_a,
      R"(Exact size in bytes of n values encoded with `codec` (the wire size, before
framing). Raises fedwan.ConfigError for an unknown codec name.)");
  m.def("encode", &encode, "codec"_a, "values"_a, "residual"_a = py::none(),
        R"(Encodes a float32 array (any shape, flattened) with `codec`; returns bytes.

With `residual` (a C-contiguous, writeable float32 array of the same size) this is
error feedback: values + residual are encoded and what the encoding lost is left in
`residual`, so that over many calls the decoded sum tracks the true sum.
Raises fedwan.ConfigError for an unknown codec or an array of another dtype,
layout or size, and fedwan.Error for non-finite input (the residual is then
unchanged). The GIL is released while the codec runs.)");
  m.def("validate", &validate, "codec"_a, "data"_a, "n"_a,
        R"(True when `data` (any contiguous bytes-like object) is exactly a `codec`
encoding of n finite values: the check decode() makes before decoding.)");
  m.def("decode", &decode, "codec"_a, "data"_a, "n"_a,
        R"(Decodes n values from `data` (any contiguous bytes-like object) into a new
float32 array of shape (n,). Raises fedwan.ProtocolError when validate() would
return False (wrong size, non-finite values), naming the sizes.)");
}

}  // namespace fedwan::python
