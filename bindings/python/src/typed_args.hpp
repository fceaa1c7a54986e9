// Arguments the bindings check themselves (bindings.hpp: float32_buffer,
// float32_values, path_from, topology_from) rather than through a pybind11
// conversion, so that the checks can name the argument and say what to do.
// pybind11 would show such an argument as `handle` or `object`; TypedArg
// passes the object through untouched and only gives the signature in the
// docstring (help(), IDEs) the Python types that are accepted. The type
// stubs (fedwan/_fedwan.pyi) state the same types.
#pragma once

#include <pybind11/pybind11.h>

namespace fedwan::python {

namespace py = pybind11;

// `Name::name` is the type as the signature shows it (a pybind11 descr).
template <class Name>
struct TypedArg {
  py::object obj;  // as the caller passed it (None included)
};

#define FEDWAN_PY_TYPE_NAME(tag, text)                         \
  struct tag {                                                 \
    static constexpr auto name = py::detail::const_name(text); \
  }

FEDWAN_PY_TYPE_NAME(PathName, "Union[str, os.PathLike[str]]");
FEDWAN_PY_TYPE_NAME(OptionalPathName, "Optional[Union[str, os.PathLike[str]]]");
FEDWAN_PY_TYPE_NAME(TopologyName, "Union[Topology, str, os.PathLike[str]]");
FEDWAN_PY_TYPE_NAME(Float32ArrayName, "numpy.ndarray[numpy.float32]");
FEDWAN_PY_TYPE_NAME(OptionalFloat32ArrayName, "Optional[numpy.ndarray[numpy.float32]]");
FEDWAN_PY_TYPE_NAME(BytesLikeName, "Union[bytes, bytearray, memoryview]");
FEDWAN_PY_TYPE_NAME(RoundCallbackName, "Optional[Callable[[dict], object]]");
FEDWAN_PY_TYPE_NAME(ModelCallbackName,
                    "Optional[Callable[[int, numpy.ndarray[numpy.float32]], object]]");

#undef FEDWAN_PY_TYPE_NAME

using PathArg = TypedArg<PathName>;                  // path_from
using OptionalPathArg = TypedArg<OptionalPathName>;  // None or path_from
using TopologyArg = TypedArg<TopologyName>;          // topology_from
using Float32ArrayArg = TypedArg<Float32ArrayName>;  // float32_buffer / float32_values
using OptionalFloat32ArrayArg = TypedArg<OptionalFloat32ArrayName>;
using BytesLikeArg = TypedArg<BytesLikeName>;          // any contiguous buffer
using RoundCallbackArg = TypedArg<RoundCallbackName>;  // on_round(report)
using ModelCallbackArg = TypedArg<ModelCallbackName>;  // on_model(round, model)

}  // namespace fedwan::python

namespace pybind11::detail {

// Accepts any object: the binding's own check raises fedwan.ConfigError
// naming the argument, as it did before it was typed.
template <class Name>
struct type_caster<fedwan::python::TypedArg<Name>> {
  PYBIND11_TYPE_CASTER(fedwan::python::TypedArg<Name>, Name::name);

  bool load(handle src, bool /*convert*/) {
    value.obj = reinterpret_borrow<object>(src);
    return true;
  }
  static handle cast(const fedwan::python::TypedArg<Name>& src, return_value_policy /*policy*/,
                     handle /*parent*/) {
    return src.obj.inc_ref();
  }
};

}  // namespace pybind11::detail
