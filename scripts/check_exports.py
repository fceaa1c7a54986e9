#!/usr/bin/env python3
"""Checks what fedwan's shared libraries export.

The libraries are compiled with hidden visibility (include/fedwan/export.hpp):
only the public API of include/fedwan/ is exported, plus the few internal
functions one fedwan library calls in another (INTERNAL_EXPORTS below). This
lists each library's dynamic symbols (nm -D -C --defined-only) and fails on
any symbol of fedwan's own that belongs to an internal folder's namespace or
to a class's private implementation (Impl), on a library that exports none
of the public classes it should (a build that lost the export macro), and
on a symbol of fedwan's that one library needs and none of the others
exports (it would link here and fail in a user's program).

Symbols whose own name is a template of the standard library or of a
dependency (std::vector<fedwan::...>, typeinfo for spdlog::sinks::sink) are
weak instantiations the compiler emits with the template's visibility; they
are not fedwan's API and are not judged here.

Usage: check_exports.py NM LIBRARY [LIBRARY...]; exits 1 and names every
offending symbol.
"""
import re
import subprocess
import sys

INTERNAL_NAMESPACES = (
    "aggregation", "aggregator", "checkpoint", "cli", "codec_math", "comm", "costs",
    "detail", "kernels", "metrics", "node", "security", "session", "site", "tensor",
    "topology", "topology_detail", "transport", "wire", "workload",
)
# Internal, but called from another fedwan library (each is marked FEDWAN_API
# where it is declared, with the library that needs it).
INTERNAL_EXPORTS = (
    "fedwan::tensor::ChunkPlan",  # libfedwan (torch/site.cpp)
    # libfedwan against a LibTorch with its own Gloo (comm/gloo_engine.hpp)
    "fedwan::comm::install_gloo_engine",
    "fedwan::comm::prepare_site_comm",
    "fedwan::comm::comm_failure",
    "fedwan::comm::check_root",
    "fedwan::log",  # libfedwan_cuda
)
# At least one symbol of each, per library file name: the export macro works.
EXPECTED = {
    "libfedwan_core": ("fedwan::SiteCore::", "fedwan::Aggregator::", "fedwan::Topology::"),
    "libfedwan.": ("fedwan::Site::", "fedwan::FlatParameters::"),
    "libfedwan_cuda": ("fedwan::cuda::",),
}
PREFIXES = ("typeinfo name for ", "typeinfo for ", "vtable for ", "VTT for ",
            "construction vtable for ", "guard variable for ", "non-virtual thunk to ",
            "virtual thunk to ")


def own_name(symbol):
    """The qualified name a symbol belongs to, without arguments."""
    for p in PREFIXES:
        if symbol.startswith(p):
            symbol = symbol[len(p):]
    depth = 0
    for i, c in enumerate(symbol):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            return symbol[:i]
    return symbol


def problem(name):
    if not name.startswith("fedwan::"):
        return None
    bare = name.replace("[abi:cxx11]", "")
    if any(bare == e or bare.startswith(e + "::") for e in INTERNAL_EXPORTS):
        return None
    plain = re.sub(r"<.*", "", name.replace("[abi:cxx11]", ""))
    parts = plain.split("::")
    if len(parts) > 2 and parts[1] in INTERNAL_NAMESPACES:
        return "internal namespace fedwan::%s" % parts[1]
    if "Impl" in parts[:-1] or parts[-1] == "Impl":
        return "a private implementation class"
    return None


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    nm, libraries = argv[1], argv[2:]
    failures = []
    exported = set()
    needed = {}
    for lib in libraries:
        out = subprocess.run([nm, "-D", "-C", "--defined-only", lib], check=True,
                             capture_output=True, text=True).stdout
        names = []
        for line in out.splitlines():
            fields = line.split(" ", 2)
            if len(fields) == 3:
                names.append(own_name(fields[2]))
                exported.add(fields[2])
        out = subprocess.run([nm, "-D", "-C", "--undefined-only", lib], check=True,
                             capture_output=True, text=True).stdout
        needed[lib] = [line.split(" U ", 1)[1] for line in out.splitlines() if " U " in line
                       and own_name(line.split(" U ", 1)[1]).startswith("fedwan::")]
        for name in sorted(set(names)):
            why = problem(name)
            if why:
                failures.append("%s exports %s (%s)" % (lib, name, why))
        for key, wanted in EXPECTED.items():
            if key in lib.rsplit("/", 1)[-1]:
                for w in wanted:
                    if not any(n.startswith(w) for n in names):
                        failures.append("%s exports nothing of %s" % (lib, w))
        print("%s: %d symbols exported" % (lib, len(names)))
    for lib, symbols in needed.items():
        for symbol in symbols:
            if symbol not in exported:
                failures.append("%s needs %s, which no fedwan library exports" % (lib, symbol))
    for f in failures:
        print(f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
