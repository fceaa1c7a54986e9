"""The public API as a whole: every public name documented, each C++ error
class reaching Python as the class of the same name with the same message,
and the type stubs (fedwan/_fedwan.pyi, py.typed) shipped and naming what
the extension has and returns. scripts/typecheck.sh runs mypy and stubtest
over the same stubs; these tests need neither."""

import ast
import builtins
import inspect
import os
import re
import shutil
import types

import numpy as np
import pytest

import fedwan
import fedwan._fedwan
from helpers import JOIN_TIMEOUT_S, Worker, join_all, topology_yaml

# fedwan::Error and its subclasses (include/fedwan/error.hpp), base first.
CPP_ERRORS = ("Error", "ConfigError", "ProtocolError", "CryptoError", "TransportError",
              "StoppedError", "TimeoutError")

STUB = os.path.join(os.path.dirname(fedwan._fedwan.__file__), "_fedwan.pyi")


def doc_body(name, doc):
    """`doc` without the signature line pybind11 puts first on a callable's
    docstring: what help() shows beyond the signature."""
    lines = (doc or "").strip().splitlines()
    if lines and lines[0].startswith(name + "("):
        lines = lines[1:]
    return "\n".join(lines).strip()


def is_documented(name, doc):
    body = doc_body(name, doc)
    return len(body) >= 15 and len(body.split()) >= 3


def has_bound_constructor(cls):
    """Whether `cls` has a constructor bound in C++. pybind11 gives a class
    without one a slot __init__ that raises TypeError ("No constructor
    defined"); a Python class documents its constructor in the class
    docstring."""
    init = vars(cls).get("__init__")
    return init is not None and not isinstance(
        init, (types.FunctionType, types.WrapperDescriptorType))


def public_members(cls):
    """(name, object) of what `cls` and its fedwan base classes define, public
    names only, plus a constructor bound in C++ (help() shows its signature)."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("fedwan"):
            continue
        for name in vars(klass):
            if not name.startswith("_") or (name == "__init__" and has_bound_constructor(klass)):
                yield name, getattr(cls, name)


def test_every_public_name_has_a_docstring():
    undocumented = []
    for module in (fedwan, fedwan._fedwan, fedwan.site):
        if not is_documented(module.__name__, module.__doc__):
            undocumented.append(module.__name__)
    for name in fedwan.__all__:
        obj = getattr(fedwan, name)
        if not is_documented(name, obj.__doc__):
            undocumented.append(name)
        if isinstance(obj, type):
            for member, value in public_members(obj):
                if not is_documented(member, value.__doc__):
                    undocumented.append(f"{name}.{member}")
    assert not undocumented, f"no docstring beyond the signature: {undocumented}"


def test_signatures_name_the_accepted_types():
    # The arguments the bindings check themselves show their Python types,
    # not pybind11's `handle` / `object`.
    for obj in (fedwan.Aggregator.__init__, fedwan.SiteCore.__init__, fedwan.encode, fedwan.decode, fedwan.validate,
                fedwan.Topology.load, fedwan.provision_credentials, fedwan.credentials_path,
                fedwan.synthetic_local_steps):
        signature = obj.__doc__.splitlines()[0]
        assert ": handle" not in signature and ": object" not in signature, signature
    signature = fedwan.Aggregator.__init__.__doc__.splitlines()[0]
    assert "topology: Union[Topology, str, os.PathLike[str]]" in signature
    assert "initial_model: Optional[numpy.ndarray[numpy.float32]] = None" in signature
    assert "credentials: Optional[Union[str, os.PathLike[str]]] = None" in signature
    signature = fedwan.SiteCore.__init__.__doc__.splitlines()[0]
    assert "params: numpy.ndarray[numpy.float32]" in signature
    assert "checkpoint_dir: Optional[Union[str, os.PathLike[str]]] = None" in signature
    # (pybind11 3 writes a float as `typing.SupportsFloat | typing.SupportsIndex`)
    assert re.search(r"lr: [^,]*(float|Float)[^,]* = 0\.05\)",
                     fedwan.synthetic_local_steps.__doc__.splitlines()[0])


# -- errors ---------------------------------------------------------------------


def test_error_classes_mirror_the_cpp_hierarchy():
    for name in CPP_ERRORS:
        cls = getattr(fedwan, name)
        assert cls is getattr(fedwan._fedwan, name) and name in fedwan.__all__
        assert cls.__name__ == name and cls.__module__ == "fedwan"
        assert issubclass(cls, fedwan.Error) and issubclass(cls, RuntimeError)
        if name != "Error":
            assert cls.__bases__[0] is fedwan.Error
        # The docstring says which C++ class it is.
        assert f"C++ fedwan::{name}" in " ".join(cls.__doc__.split())
        # Built from Python, it carries its message as one argument.
        assert str(cls("what went wrong")) == "what went wrong"
    assert fedwan.Error.__bases__ == (RuntimeError,)
    assert fedwan.TimeoutError.__bases__ == (fedwan.Error, builtins.TimeoutError)
    assert isinstance(fedwan.TimeoutError(), builtins.TimeoutError)
    assert not issubclass(fedwan.ConfigError, ValueError)


def two_site_topology(sock_dir, job="py-api", **kw):
    return fedwan.Topology.parse(topology_yaml(
        job, sock_dir, [("site-0", "root", 1), ("site-1", "root", 1)], **kw))


def raise_error(name, sock_dir, credentials, tmp_path):
    """Makes the core throw the C++ class `name` from an ordinary call; returns
    the Python exception and the message the C++ code builds (its what())."""
    topo = two_site_topology(sock_dir)
    endpoint = topo.root.endpoint
    params = np.zeros(8, np.float32)
    if name == "Error":  # out of order: SiteCore::sync before join
        core = fedwan.SiteCore(topo, "site-0", params, credentials=credentials(topo, "site-0"))
        call, want = core.sync, "site 'site-0': call join() before sync()"
    elif name == "ConfigError":  # Topology::parse
        text = topology_yaml("py-api", sock_dir, [("site-0", "root", 1)], rounds=0)

        def call():
            fedwan.Topology.parse(text, source="bad.yaml")
        want = "bad.yaml: federation: rounds is 0; run at least 1 round"
    elif name == "ProtocolError":  # a codec's validation of received bytes
        def call():
            fedwan.decode("fp32", b"\0" * 3, 1)
        want = "not a valid fp32 encoding of 1 values: 3 bytes, expected 4 holding finite values"
    elif name == "CryptoError":  # a bundle whose CA is another federation's
        bundle = tmp_path / "mixed-bundle"
        shutil.copytree(credentials(topo, "site-0"), bundle)
        other = two_site_topology(sock_dir, job="py-api-other")
        shutil.copy(os.path.join(credentials(other, "site-0"), "ca.pem"), bundle / "ca.pem")

        def call():
            fedwan.SiteCore(topo, "site-0", params, credentials=bundle)
        want = f"CRL {bundle}/crl.pem is not signed by the federation CA"
    elif name == "TransportError":  # an endpoint that cannot be bound
        missing = os.path.join(sock_dir, "no-such-dir")
        topo = two_site_topology(missing)

        def call():
            fedwan.Aggregator(topo, "root", params, credentials=credentials(topo, "root"))
        want = (f"cannot bind ipc://{missing}/root.sock: No such file or directory "
                "(is another process using the port?)")
    elif name == "StoppedError":  # SiteCore::join after stop()
        core = fedwan.SiteCore(topo, "site-0", params, credentials=credentials(topo, "site-0"))
        core.stop()
        call, want = core.join, "site 'site-0' stopped while joining (round 0)"
    elif name == "TimeoutError":  # no parent: the TLS handshake never completes
        core = fedwan.SiteCore(topo, "site-0", params, join_timeout_s=0.5,
                               credentials=credentials(topo, "site-0"))
        call = core.join
        want = (f"TLS handshake with parent {endpoint} did not complete within 500 ms: "
                "is the parent running, with its credentials?")
    with pytest.raises(fedwan.Error) as info:
        call()
    return info.value, want


@pytest.mark.parametrize("name", CPP_ERRORS)
def test_each_cpp_error_reaches_python_as_its_class_with_its_message(
        name, sock_dir, credentials, tmp_path):
    error, want = raise_error(name, sock_dir, credentials, tmp_path)
    assert type(error) is getattr(fedwan, name), repr(error)
    assert isinstance(error, fedwan.Error) and isinstance(error, RuntimeError)
    assert str(error) == want and error.args == (want,)
    if name == "TimeoutError":
        assert isinstance(error, builtins.TimeoutError)


# -- type stubs -----------------------------------------------------------------


def stub_tree():
    assert os.path.isfile(STUB), f"the package ships no stubs at {STUB}"
    assert os.path.isfile(os.path.join(os.path.dirname(STUB), "py.typed"))
    with open(STUB, encoding="utf-8") as f:
        return ast.parse(f.read())


# Dunder names the stubs must declare where the runtime has them.
DUNDERS = {"__init__", "__enter__", "__exit__", "__version__"}


def public_names(names):
    return {n for n in names if not n.startswith("_") or n in DUNDERS}


def defined_names(body):
    """Public names a stub body defines (functions, classes, annotations)."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return public_names(names)


def test_stubs_name_what_the_extension_has():
    tree = stub_tree()
    assert defined_names(tree.body) == public_names(dir(fedwan._fedwan))
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        cls = getattr(fedwan._fedwan, node.name)
        if not issubclass(cls, BaseException):
            want = public_names(vars(cls))
            if not has_bound_constructor(cls):
                want.discard("__init__")  # stubtest_allowlist.txt says why
            assert defined_names(node.body) == want, node.name


def typed_dicts(tree):
    """{TypedDict name: {key: annotation text}} of the stub."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases):
            out[node.name] = {f.target.id: ast.unparse(f.annotation)
                              for f in node.body if isinstance(f, ast.AnnAssign)}
    return out


def assert_matches(typed_dict, fields, value, nested=None):
    """`value` (a dict the extension returned) has exactly the stub's keys,
    each of the stub's type (`nested`: the TypedDicts a field may be)."""
    nested = nested or {}
    assert isinstance(value, dict) and set(value) == set(fields), typed_dict
    for key, annotation in fields.items():
        v = value[key]
        if annotation in ("int", "bool", "float", "str"):
            ok = type(v) is getattr(builtins, annotation)
        elif annotation.startswith("Literal["):
            ok = v in ast.literal_eval("(" + annotation[len("Literal["):-1] + ",)")
        elif annotation.startswith("list["):
            ok = isinstance(v, list)
        elif annotation.startswith("dict["):
            ok = isinstance(v, dict)
        elif annotation == "_Float32Array | None":
            ok = v is None or (isinstance(v, np.ndarray) and v.dtype == np.float32)
        elif annotation in nested:
            assert_matches(annotation, nested[annotation], v)
            ok = True
        else:
            pytest.fail(f"{typed_dict}.{key}: no runtime check for {annotation}")
        assert ok, f"{typed_dict}.{key} is {v!r}, the stub says {annotation}"


def test_returned_dicts_match_the_stubs_typed_dicts(sock_dir):
    fields = typed_dicts(stub_tree())
    assert set(fields) == {"_SyncResult", "_RoundReport", "_AggregatorSummary", "_NormBound",
                           "_AggregationSettings", "_PrivacySettings", "_PrivacyLoss"}
    topo = two_site_topology(sock_dir, job="py-api-dicts", rounds=1, inner_steps=1)
    initial = fedwan.synthetic_initial_model(16, 1)
    reports = []
    root = fedwan.Aggregator(topo, "root", initial, on_round=reports.append,
                             join_timeout_s=JOIN_TIMEOUT_S, insecure_plaintext=True)

    def site(node_id):
        params = initial.copy()
        with fedwan.SiteCore(topo, node_id, params, join_timeout_s=JOIN_TIMEOUT_S,
                             insecure_plaintext=True) as core:
            results = [core.join(), core.service()]
            while not core.finished:
                results.append(core.sync())
        return results

    workers = [Worker("root", root.run)] + [Worker(s, lambda s=s: site(s))
                                            for s in ("site-0", "site-1")]
    for w in workers:
        w.start()
    join_all(workers)
    summary = workers[0].result
    assert_matches("_AggregatorSummary", fields["_AggregatorSummary"], summary)
    assert reports and summary["global_model"] is not None
    for report in reports + summary["reports"]:
        assert_matches("_RoundReport", fields["_RoundReport"], report)
    for w in workers[1:]:
        for result in w.result:
            assert_matches("_SyncResult", fields["_SyncResult"], result)
    assert_matches("_AggregationSettings", fields["_AggregationSettings"],
                   topo.federation.aggregation, {"_NormBound": fields["_NormBound"]})
    assert_matches("_PrivacySettings", fields["_PrivacySettings"], topo.federation.privacy)
    accountant = fedwan.PrivacyAccountant()
    accountant.compose_gaussian(1.0, 3)
    assert_matches("_PrivacyLoss", fields["_PrivacyLoss"], accountant.loss(1e-5))


def test_typed_usage_example_runs():
    # The program scripts/typecheck.sh checks with mypy --strict, run: what
    # it states about the API holds at runtime too.
    import typing_usage

    typing_usage.main()
    assert inspect.getdoc(typing_usage)
